"""``bert-jax probe``: which layer of a frozen checkpoint knows what.

A probe is a small classifier (linear, or a one-hidden-layer MLP with ``--probe mlp``) trained
on the frozen hidden states of one layer. One probe is trained per hidden state (0 = the
embedding output, i = layer i), all at once (vectorised over layers), and optionally one on a
learned scalar mix of all states (``--mix``), whose weights show where the information sits.

Labels:
  token level    a CoNLL-format file (one ``word col1 col2 ...`` line per token, blank line
                 between sentences, ``-DOCSTART-`` lines skipped); ``--label-column`` is the
                 0-based column of the label (CoNLL-2003: 1 = POS, 2 = chunk, 3 = NER). The
                 feature of a word is the hidden state of its first sub-token.
  sentence level a GLUE-style TSV with a header: ``--text-column`` (and ``--text-pair-column``)
                 and ``--label-column`` by name; the feature is the mean over the text's tokens
                 (``--pooling mean``) or the [CLS] vector (``--pooling cls``).

Features are extracted once (jitted forward, fixed batch shape) and can be kept in an ``.npz``
(``--cache``); the probes train with optax Adam on softmax cross-entropy, full batch
(``--batch-size 0``) or minibatches. The dev split is ``--dev-file`` or ``--holdout`` of the
training rows (whole sentences). Dev labels that train never had are left out of the scores
and counted (``dev_unseen_labels``).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import fileio, storage
from bert_jax.analysis.common import bucket_length, load_encoder, progress, pyplot
from bert_jax.errors import BertJaxError

RESULTS_FILE = "probe_results.json"


# ---- data -----------------------------------------------------------------------------------
def read_conll_columns(path: str, label_column: int, limit: int = 0
                       ) -> list[tuple[list[str], list[str]]]:
    """(words, labels) per sentence of a CoNLL column file."""
    if not storage.isfile(path):
        raise BertJaxError(f"{path}: no such file")
    sentences: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    labels: list[str] = []
    if True:
        text = storage.read_bytes(path).decode("utf-8-sig")
        for number, line in enumerate(text.splitlines(keepends=True), start=1):
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                if words:
                    sentences.append((words, labels))
                    if limit and len(sentences) >= limit:
                        return sentences
                words, labels = [], []
                continue
            if not -len(fields) <= label_column < len(fields) or len(fields) < 2:
                raise BertJaxError(f"{path}:{number}: {len(fields)} columns, no label column "
                                   f"{label_column} (--label-column is 0-based)")
            words.append(fields[0])
            labels.append(fields[label_column])
    if words:
        sentences.append((words, labels))
    if not sentences:
        raise BertJaxError(f"{path}: no sentences")
    return sentences


def read_tsv_labelled(path: str, text_column: str, label_column: str,
                      pair_column: str | None = None, limit: int = 0
                      ) -> list[tuple[str, str | None, str]]:
    """(text, pair or None, label) per row of a TSV with a header."""
    from bert_jax.tasks.tsv import read_tsv_lines

    if not storage.isfile(path):
        raise BertJaxError(f"{path}: no such file")
    rows = read_tsv_lines(path)
    first = next(rows, None)
    if first is None:
        raise BertJaxError(f"{path}: empty file")
    header = first[1]
    for c in (text_column, pair_column, label_column):
        if c is not None and c not in header:
            raise BertJaxError(f"{path}:1: no column {c!r}; the header has {header}")
    ti, li = header.index(text_column), header.index(label_column)
    pi = header.index(pair_column) if pair_column else None
    out = []
    for number, fields in rows:
        if fields == [""]:
            continue
        if len(fields) != len(header):
            raise BertJaxError(f"{path}:{number}: expected {len(header)} tab-separated "
                               f"columns as in the header, found {len(fields)}")
        if not fields[li].strip():
            raise BertJaxError(f"{path}:{number}: empty label in column {label_column!r}")
        out.append((fields[ti], fields[pi] if pi is not None else None, fields[li]))
        if limit and len(out) >= limit:
            break
    if not out:
        raise BertJaxError(f"{path}: no rows")
    return out


# ---- features -------------------------------------------------------------------------------
class FeatureExtractor:
    """All hidden states of a frozen encoder, [B, L+1, S, D] float32, jitted."""

    def __init__(self, checkpoint: str):
        from bert_jax.modeling import BertModel

        params, self.config, self.tokenizer = load_encoder(checkpoint)
        self.params = params["bert"]
        model = BertModel(self.config, add_pooler=False)

        def states(p, ids, mask, segs):
            out = model.apply({"params": p}, ids, mask, segs, output_hidden_states=True)
            return jnp.stack(out["hidden_states"], axis=1).astype(jnp.float32)

        self.states = jax.jit(states)

    def _batches(self, feats: dict[str, np.ndarray], batch_size: int):
        n = feats["input_ids"].shape[0]
        for start in range(0, n, batch_size):
            rows = {k: feats[k][start:start + batch_size]
                    for k in ("input_ids", "input_mask", "segment_ids")}
            real = rows["input_ids"].shape[0]
            if real < batch_size:  # one batch shape: pad with empty rows
                rows = {k: np.concatenate([v, np.zeros((batch_size - real, v.shape[1]),
                                                       v.dtype)]) for k, v in rows.items()}
            yield start, real, rows

    def tokens(self, sentences: Sequence[tuple[list[str], list[str]]], max_length: int,
               batch_size: int, desc: str) -> np.ndarray:
        """The first sub-token's states of every word: [words, L+1, D]."""
        from bert_jax.tasks.ner import NerExample, featurize_ner

        examples = [NerExample(str(i), tuple(w), None) for i, (w, _) in enumerate(sentences)]
        longest = max(sum(len(self.tokenizer.tokenize(x)) or 1 for x in w) + 2
                      for w, _ in sentences)
        feats = featurize_ner(examples, self.tokenizer, bucket_length(longest, max_length))
        out = [np.zeros((len(w), self.config.num_hidden_layers + 1, self.config.hidden_size),
                        np.float32) for w, _ in sentences]
        total = -(-feats["input_ids"].shape[0] // batch_size)
        for start, real, rows in progress(self._batches(feats, batch_size), total, desc):
            states = np.asarray(self.states(self.params, rows["input_ids"],
                                            rows["input_mask"], rows["segment_ids"]))
            for r in range(real):
                f = start + r
                positions = np.flatnonzero(feats["word_index"][f] >= 0)
                words = feats["word_index"][f, positions]
                out[feats["example_index"][f]][words] = states[r][:, positions].transpose(
                    1, 0, 2)
        return np.concatenate(out)

    def sentences(self, rows: Sequence[tuple[str, str | None, str]], max_length: int,
                  batch_size: int, pooling: str, desc: str) -> np.ndarray:
        """One vector per row and state: [rows, L+1, D] (mean over tokens or [CLS])."""
        from bert_jax.tasks.base import encode_inputs

        encs = [self.tokenizer.encode(a, b, max_length=max_length) for a, b, _ in rows]
        feats = encode_inputs(encs, self.tokenizer,
                              bucket_length(max(len(e.input_ids) for e in encs), max_length))
        out = []
        total = -(-len(encs) // batch_size)
        for _, real, batch in progress(self._batches(feats, batch_size), total, desc):
            states = np.asarray(self.states(self.params, batch["input_ids"],
                                            batch["input_mask"], batch["segment_ids"]))[:real]
            if pooling == "cls":
                out.append(states[:, :, 0])
            else:
                m = batch["input_mask"][:real, None, :, None].astype(np.float32)
                out.append((states * m).sum(2) / np.maximum(m.sum(2), 1.0))
        return np.concatenate(out)


# ---- probes ---------------------------------------------------------------------------------
class Probe(nn.Module):
    """Linear (``hidden=0``) or one hidden ReLU layer, then logits."""

    num_classes: int
    hidden: int = 0

    @nn.compact
    def __call__(self, x):
        if self.hidden:
            x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_classes)(x)


class MixProbe(nn.Module):
    """A learned scalar mix of all states ([N, L+1, D] -> [N, D]), then a probe."""

    num_classes: int
    hidden: int = 0

    @nn.compact
    def __call__(self, x):
        from bert_jax.modeling.feature_heads import ScalarMix

        mixed = ScalarMix(name="mix")([x[:, i] for i in range(x.shape[1])])
        return Probe(self.num_classes, self.hidden, name="probe")(mixed)


def _fit(init, apply, x: np.ndarray, y: np.ndarray, steps: int, batch_size: int, lr: float,
         seed: int, per_layer: bool):
    """Adam on mean softmax cross-entropy; ``per_layer``: x [N, L+1, D] trains one probe per
    state at once (their losses add; Adam's updates are per parameter, so each probe trains
    exactly as alone)."""
    params = init(jax.random.PRNGKey(seed), jnp.asarray(x[:1]))
    tx = optax.adam(lr)
    opt = tx.init(params)

    def loss_fn(p, xb, yb):
        logits = apply(p, xb)  # [L+1, B, C] or [B, C]
        ce = optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.broadcast_to(yb, logits.shape[:-1]))
        return ce.mean(-1).sum() if per_layer else ce.mean()

    @jax.jit
    def step(p, o, xb, yb):
        grads = jax.grad(loss_fn)(p, xb, yb)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o

    rng = np.random.default_rng(seed)
    n = len(y)
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    for _ in range(steps):
        if batch_size and batch_size < n:
            idx = rng.integers(0, n, batch_size)
            params, opt = step(params, opt, xs[idx], ys[idx])
        else:
            params, opt = step(params, opt, xs, ys)
    return params


def _scores(pred: np.ndarray, gold: np.ndarray, num_classes: int) -> dict[str, float]:
    f1s = []
    for c in range(num_classes):
        tp = np.sum((pred == c) & (gold == c))
        fp = np.sum((pred == c) & (gold != c))
        fn = np.sum((pred != c) & (gold == c))
        if tp + fp + fn:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": float(np.mean(pred == gold)),
            "macro_f1": float(np.mean(f1s)) if f1s else 0.0}


def train_probes(x_train: np.ndarray, y_train: np.ndarray, x_dev: np.ndarray,
                 y_dev: np.ndarray, num_classes: int, probe: str = "linear", hidden: int = 256,
                 steps: int = 500, batch_size: int = 1024, learning_rate: float = 1e-3,
                 mix: bool = False, seed: int = 0) -> dict:
    """Per-state probes on x [N, L+1, D] (and a scalar-mix probe with ``mix``) -> dev scores:
    {"layers": [{"layer", "accuracy", "macro_f1"}...], "mix": {..., "weights"}}."""
    if probe not in ("linear", "mlp"):
        raise BertJaxError(f"--probe {probe!r}: choose linear or mlp")
    width = hidden if probe == "mlp" else 0
    model = Probe(num_classes, width)
    n_states = x_train.shape[1]

    def init(key, xb):
        keys = jax.random.split(key, n_states)
        return jax.vmap(lambda k, xl: model.init(k, xl)["params"])(keys, xb.transpose(1, 0, 2))

    def apply(p, xb):
        return jax.vmap(lambda pl, xl: model.apply({"params": pl}, xl))(p,
                                                                       xb.transpose(1, 0, 2))

    params = _fit(init, apply, x_train, y_train, steps, batch_size, learning_rate, seed, True)
    logits = np.asarray(jax.jit(apply)(params, jnp.asarray(x_dev)))
    result: dict = {"layers": [{"layer": i, **_scores(logits[i].argmax(-1), y_dev,
                                                      num_classes)}
                               for i in range(n_states)]}
    if mix:
        from bert_jax.modeling.feature_heads import mix_weights

        mixer = MixProbe(num_classes, width)
        p = _fit(lambda k, xb: nn.unbox(mixer.init(k, xb)["params"]),
                 lambda p, xb: mixer.apply({"params": p}, xb),
                 x_train, y_train, steps, batch_size, learning_rate, seed, False)
        mix_logits = np.asarray(jax.jit(lambda p, xb: mixer.apply({"params": p}, xb))(
            p, jnp.asarray(x_dev)))
        weights = mix_weights(p["mix"])
        gamma = float(p["mix"]["gamma"])
        result["mix"] = {**_scores(mix_logits.argmax(-1), y_dev, num_classes),
                         "weights": [w / gamma for w in weights], "gamma": gamma}
    return result


def plot_probes(result: dict, path: str, title: str) -> str:
    """Dev accuracy and macro F1 by state (0 = embeddings), the mix's score as a line, and the
    mix's weights when a mix was trained."""
    plt = pyplot()
    has_mix = "mix" in result
    fig, axes = plt.subplots(1, 2 if has_mix else 1, figsize=(11 if has_mix else 6, 4))
    ax = axes[0] if has_mix else axes
    layers = [r["layer"] for r in result["layers"]]
    ax.plot(layers, [r["accuracy"] for r in result["layers"]], "o-", label="accuracy")
    ax.plot(layers, [r["macro_f1"] for r in result["layers"]], "s--", label="macro F1")
    if has_mix:
        ax.axhline(result["mix"]["accuracy"], color="gray", linestyle=":",
                   label="scalar mix (accuracy)")
    ax.set_xlabel("hidden state (0 = embeddings)")
    ax.set_ylabel("dev score")
    ax.set_xticks(layers)
    ax.set_title(title)
    ax.legend(fontsize=8)
    if has_mix:
        axes[1].bar(layers, result["mix"]["weights"])
        axes[1].set_xlabel("hidden state")
        axes[1].set_ylabel("softmax weight")
        axes[1].set_xticks(layers)
        axes[1].set_title("learned scalar-mix weights")
    fig.tight_layout()
    fileio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
    return path


# ---- the command ----------------------------------------------------------------------------
def _labelled(values: Sequence[str], index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(label ids, mask of the values train had)."""
    ids = np.array([index.get(v, -1) for v in values], np.int32)
    return ids, ids >= 0


def run_probe(args) -> dict:
    extractor = FeatureExtractor(args.checkpoint)
    max_length = min(args.max_length, extractor.config.max_position_embeddings)
    token_level = args.level == "token" or (args.level == "auto"
                                            and not args.train.endswith(".tsv"))
    if token_level:
        try:
            column = int(args.label_column)
        except ValueError:
            raise BertJaxError(f"--label-column {args.label_column!r}: token-level files "
                               "take a 0-based column number (CoNLL-2003: 1 POS, 3 NER)"
                               ) from None
        train = read_conll_columns(args.train, column, args.max_train_examples)
        dev = read_conll_columns(args.dev_file, column, args.max_dev_examples) \
            if args.dev_file else None
    else:
        if not args.text_column:
            raise BertJaxError("sentence-level probes need --text-column (and --label-column) "
                               "naming TSV header columns")
        train = read_tsv_labelled(args.train, args.text_column, args.label_column,
                                  args.text_pair_column, args.max_train_examples)
        dev = read_tsv_labelled(args.dev_file, args.text_column, args.label_column,
                                args.text_pair_column, args.max_dev_examples) \
            if args.dev_file else None
    dev_source = args.dev_file
    if dev is None:
        order = np.random.default_rng(args.seed).permutation(len(train))
        cut = max(1, int(round(len(train) * args.holdout)))
        if cut >= len(train):
            raise BertJaxError(f"{args.train}: {len(train)} rows are too few to hold out a dev "
                               "split; pass --dev-file")
        dev = [train[i] for i in sorted(order[:cut])]
        train = [train[i] for i in sorted(order[cut:])]
        dev_source = f"held out {args.holdout:g} of {args.train} (seed {args.seed})"

    def features(rows, desc):
        if token_level:
            return extractor.tokens(rows, max_length, args.batch_size_extract, desc)
        return extractor.sentences(rows, max_length, args.batch_size_extract, args.pooling,
                                   desc)

    def labels_of(rows):
        return [t for _, tags in rows for t in tags] if token_level else [r[2] for r in rows]

    if args.cache and storage.isfile(args.cache):
        cached = np.load(io.BytesIO(storage.read_bytes(args.cache)))
        x_train, x_dev = cached["train"], cached["dev"]
        if len(x_train) != len(labels_of(train)) or len(x_dev) != len(labels_of(dev)):
            raise BertJaxError(f"{args.cache}: cached features do not match the data "
                               f"({len(x_train)} vs {len(labels_of(train))} train rows); "
                               "delete it to extract again")
    else:
        x_train, x_dev = features(train, "train features"), features(dev, "dev features")
        if args.cache:
            fileio.atomic_write(args.cache, lambda f: np.savez(f, train=x_train, dev=x_dev))
    names = sorted(set(labels_of(train)))
    index = {name: i for i, name in enumerate(names)}
    y_train, _ = _labelled(labels_of(train), index)
    y_dev, seen = _labelled(labels_of(dev), index)
    result = train_probes(x_train, y_train, x_dev[seen], y_dev[seen], len(names), args.probe,
                          args.mlp_hidden, args.steps, args.batch_size, args.learning_rate,
                          args.mix, args.seed)
    return {"checkpoint": args.checkpoint, "level": "token" if token_level else "sentence",
            "train": args.train, "dev": dev_source, "label_column": args.label_column,
            "labels": names, "train_rows": int(len(y_train)), "dev_rows": int(seen.sum()),
            "dev_unseen_labels": int((~seen).sum()), "probe": args.probe,
            "steps": args.steps, "batch_size": args.batch_size,
            "learning_rate": args.learning_rate, **result}


def run_command(args) -> int:
    """`bert-jax probe` (arguments: `bert_jax.cli.analysis`) -> files."""
    if not args.no_plots:
        pyplot()
    if not 0 < args.holdout < 1:
        raise BertJaxError(f"--holdout {args.holdout}: a fraction between 0 and 1")
    result = run_probe(args)
    storage.makedirs(args.output)
    path = storage.join(args.output, RESULTS_FILE)
    fileio.atomic_write_json(path, result, indent=1, sort_keys=False)
    written = [path]
    if not args.no_plots:
        title = f"{result['level']} probe ({args.probe}), {storage.basename(args.train)}"
        written.append(plot_probes(result, storage.join(args.output, "probe_layers.png"),
                                   title))
    best = max(result["layers"], key=lambda r: r["accuracy"])
    print(json.dumps({"written": written, "best_layer": best["layer"],
                      "best_accuracy": best["accuracy"],
                      **({"mix_accuracy": result["mix"]["accuracy"]}
                         if "mix" in result else {})}), file=sys.stdout)
    return 0
