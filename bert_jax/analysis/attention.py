"""``bert-jax analyze-attention``: what each attention head looks at, after Clark et al. 2019,
"What Does BERT Look At? An Analysis of BERT's Attention".

For attention probabilities ``a[q, k]`` of one layer and head (row ``q`` = a query token, summing
to 1 over the keys ``k``), every statistic is a mean over the *real* (non-padding) query tokens
of all texts, each query counting once:

    cls        sum of a[q, k] over the keys k that are [CLS]
    sep        sum of a[q, k] over the keys k that are [SEP]
    punct      sum of a[q, k] over the keys k that are punctuation (every character of the
               token, without a "##" / "▁" prefix, is Unicode punctuation, category P*)
    self       a[q, q]
    prev       a[q, q-1], over the queries that have a previous token (q >= 1)
    next       a[q, q+1], over the queries that have a real next token
    entropy    -sum_k a[q, k] ln a[q, k] (nats; 0 ln 0 = 0)
    distance   sum_k a[q, k] |q - k| (tokens)

``uniform_entropy`` is the mean over the same queries of ln n, n the real tokens of the query's
text: the entropy of attention spread evenly over the text. Padding keys receive no attention
(the model masks them), so sums over keys run over real tokens.

The forward pass is jitted with one padded batch shape ([batch_size, max_length]); each batch
returns only per-head sums and counts, so inputs of any size stream through.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import fileio, storage
from bert_jax.analysis.common import (
    bucket_length,
    load_encoder,
    padded_batches,
    progress,
    pyplot,
    read_texts,
)
from bert_jax.errors import BertJaxError

STATS = ("cls", "sep", "punct", "self", "prev", "next", "entropy", "distance")
STATS_FILE = "attention_stats.json"


def is_punctuation(token: str) -> bool:
    """A token made only of Unicode punctuation (its "##" or "▁" prefix removed)."""
    text = token[2:] if token.startswith("##") else token.lstrip("▁")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def attention_sums(attn, mask, is_cls, is_sep, is_punct) -> dict[str, jax.Array]:
    """Per-head sums over the real queries of a batch, and the counts to divide them by.

    attn: [B, L, H, S, S] attention probabilities (query, key); mask, is_cls, is_sep,
    is_punct: [B, S] (1 = real token / that kind of token). Returns "<stat>" [L, H] sums,
    "queries", "prev_count", "next_count" and "uniform_entropy" (sum of ln n) scalars.
    """
    attn = jnp.asarray(attn, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    S = attn.shape[-1]
    w = m[:, None, None, :]  # query weights [B, 1, 1, S]

    def to_keys(kind):
        return jnp.einsum("blhqk,bk->blhq", attn, jnp.asarray(kind, jnp.float32))

    def total(per_query, weight=w):
        return jnp.sum(per_query * weight, axis=(0, 3))

    diag = jnp.diagonal(attn, axis1=-2, axis2=-1)  # [B, L, H, S]: a[q, q]
    prev = jnp.diagonal(attn, offset=-1, axis1=-2, axis2=-1)  # a[q, q-1], q = 1..S-1
    nxt = jnp.diagonal(attn, offset=1, axis1=-2, axis2=-1)  # a[q, q+1], q = 0..S-2
    prev_w = (m[:, 1:] * m[:, :-1])[:, None, None, :]
    next_w = (m[:, :-1] * m[:, 1:])[:, None, None, :]
    safe = jnp.where(attn > 0, attn, 1.0)
    entropy = -jnp.sum(attn * jnp.log(safe), axis=-1)
    pos = jnp.arange(S, dtype=jnp.float32)
    distance = jnp.einsum("blhqk,qk->blhq", attn, jnp.abs(pos[:, None] - pos[None, :]))
    lengths = jnp.sum(m, axis=-1)
    return {
        "cls": total(to_keys(is_cls)), "sep": total(to_keys(is_sep)),
        "punct": total(to_keys(is_punct)), "self": total(diag),
        "prev": total(prev, prev_w), "next": total(nxt, next_w),
        "entropy": total(entropy), "distance": total(distance),
        "queries": jnp.sum(m), "prev_count": jnp.sum(prev_w), "next_count": jnp.sum(next_w),
        "uniform_entropy": jnp.sum(lengths * jnp.log(jnp.maximum(lengths, 1.0))),
    }


def finish(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray | float]:
    """Accumulated sums -> means (the module docstring's definitions)."""
    q = max(float(sums["queries"]), 1.0)
    out: dict = {k: np.asarray(sums[k], np.float64) / q
                 for k in ("cls", "sep", "punct", "self", "entropy", "distance")}
    out["prev"] = np.asarray(sums["prev"], np.float64) / max(float(sums["prev_count"]), 1.0)
    out["next"] = np.asarray(sums["next"], np.float64) / max(float(sums["next_count"]), 1.0)
    out["uniform_entropy"] = float(sums["uniform_entropy"]) / q
    out["queries"] = int(sums["queries"])
    return out


class AttentionRunner:
    """A jitted forward pass returning the attention maps [B, L, H, S, S] of an encoder."""

    def __init__(self, checkpoint: str):
        from bert_jax.modeling import BertModel

        params, config, self.tokenizer = load_encoder(checkpoint)
        self.config = config.replace(scan_layers=False) if config.scan_layers else config
        if self.config is not config:
            from bert_jax.modeling.params import to_layout
            params = to_layout(params, self.config)
        self.params = params["bert"]
        model = BertModel(self.config, add_pooler=False)

        def maps(p, ids, mask, segs):
            out = model.apply({"params": p}, ids, mask, segs, output_attentions=True)
            return jnp.stack(out["attentions"], axis=1).astype(jnp.float32)

        self.maps = jax.jit(maps)

        def sums(p, ids, mask, segs, cls, sep, punct):
            return attention_sums(maps(p, ids, mask, segs), mask, cls, sep, punct)

        self.sums = jax.jit(sums)

    def encode(self, texts: Sequence[tuple[str, str | None]], max_length: int):
        encs = [self.tokenizer.encode(a, b, max_length=max_length) for a, b in texts]
        return [e.input_ids for e in encs], [e.segment_ids for e in encs]

    def token_kinds(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tok = self.tokenizer
        punct_ids = self._punct_ids()
        return ((ids == tok.cls_id).astype(np.float32), (ids == tok.sep_id).astype(np.float32),
                np.isin(ids, punct_ids).astype(np.float32))

    def _punct_ids(self) -> np.ndarray:
        if not hasattr(self, "_punct"):
            tok = self.tokenizer
            self._punct = np.array([i for i in range(tok.vocab_size)
                                    if is_punctuation(tok.id_to_token(i))], np.int64)
        return self._punct


def analyze(checkpoint: str, texts: Sequence[tuple[str, str | None]], max_length: int = 128,
            batch_size: int = 32, runner: AttentionRunner | None = None) -> dict:
    """Attention statistics of ``checkpoint`` over ``texts`` (see the module docstring)."""
    runner = runner or AttentionRunner(checkpoint)
    max_length = min(max_length, runner.config.max_position_embeddings)
    rows, segs = runner.encode(texts, max_length)
    length = bucket_length(max(len(r) for r in rows), max_length)
    total: dict[str, np.ndarray] | None = None
    batches = padded_batches(rows, batch_size, length, runner.tokenizer.pad_id, segs)
    for _, ids, mask, seg in progress(batches, -(-len(rows) // batch_size), "attention"):
        cls, sep, punct = runner.token_kinds(ids)
        out = jax.device_get(runner.sums(runner.params, ids, mask, seg, cls, sep, punct))
        out = {k: np.asarray(v, np.float64) for k, v in out.items()}
        total = out if total is None else {k: total[k] + out[k] for k in total}
    means = finish(total)
    cfg = runner.config
    return {"checkpoint": checkpoint, "texts": len(rows), "padded_length": length,
            "num_layers": cfg.num_hidden_layers, "num_heads": cfg.num_attention_heads,
            "queries": means.pop("queries"), "uniform_entropy": means.pop("uniform_entropy"),
            "definitions": __doc__.split("\n\n")[1].strip(),
            "layout": "per statistic: [layer][head], index 0 = layer 1 / head 1",
            **{k: np.asarray(v).tolist() for k, v in means.items()}}


# ---- figures --------------------------------------------------------------------------------
def plot_special_tokens(stats: dict, path: str) -> str:
    """Per layer: each head's mean attention to [CLS], [SEP] and punctuation (dots) and the
    mean over heads (line), as Clark et al.'s Figure 2."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    layers = np.arange(1, stats["num_layers"] + 1)
    for ax, key, title in zip(axes, ("cls", "sep", "punct"), ("[CLS]", "[SEP]", "punctuation"),
                              strict=True):
        values = np.asarray(stats[key])
        for h in range(values.shape[1]):
            ax.scatter(layers, values[:, h], s=9, color="tab:blue", alpha=0.4)
        ax.plot(layers, values.mean(1), color="tab:red", label="mean over heads")
        ax.set_title(f"attention to {title}")
        ax.set_xlabel("layer")
        ax.set_xticks(layers)
    axes[0].set_ylabel("mean attention")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fileio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
    return path


def plot_head_maps(stats: dict, path: str) -> str:
    """One heat map per statistic: layers (rows) x heads (columns)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, key in zip(axes.ravel(), STATS, strict=True):
        values = np.asarray(stats[key])
        im = ax.imshow(values, aspect="auto", cmap="viridis", origin="lower",
                       extent=(0.5, values.shape[1] + 0.5, 0.5, values.shape[0] + 0.5))
        ax.set_title(key)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fileio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


def plot_entropy(stats: dict, path: str) -> str:
    """Each head's mean attention entropy by layer, the mean over heads, and the entropy of
    uniform attention for reference (Clark et al.'s Figure 4)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    values = np.asarray(stats["entropy"])
    layers = np.arange(1, values.shape[0] + 1)
    for h in range(values.shape[1]):
        ax.scatter(layers, values[:, h], s=9, color="tab:blue", alpha=0.4)
    ax.plot(layers, values.mean(1), color="tab:red", label="mean over heads")
    ax.axhline(stats["uniform_entropy"], color="gray", linestyle="--",
               label="uniform attention")
    ax.set_xlabel("layer")
    ax.set_ylabel("entropy (nats)")
    ax.set_xticks(layers)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fileio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
    return path


def plot_sentence(runner: AttentionRunner, text: tuple[str, str | None], layer: int, head: int,
                  max_length: int, path: str) -> str:
    """One text's attention map of ``layer`` / ``head`` (1-based) as a heat map with tokens."""
    cfg = runner.config
    if not 1 <= layer <= cfg.num_hidden_layers:
        raise BertJaxError(f"--layer {layer}: the model has layers 1..{cfg.num_hidden_layers}")
    if not 1 <= head <= cfg.num_attention_heads:
        raise BertJaxError(f"--head {head}: the model has heads 1..{cfg.num_attention_heads}")
    rows, segs = runner.encode([text], max_length)
    length = bucket_length(len(rows[0]), max_length)
    _, ids, mask, seg = next(padded_batches(rows, 1, length, runner.tokenizer.pad_id, segs))
    maps = np.asarray(runner.maps(runner.params, ids, mask, seg))
    n = len(rows[0])
    a = maps[0, layer - 1, head - 1, :n, :n]
    tokens = [runner.tokenizer.id_to_token(int(i)) for i in rows[0]]
    plt = pyplot()
    size = max(4.0, 0.28 * n + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(a, cmap="Blues", vmin=0.0, vmax=max(float(a.max()), 1e-6))
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(n), tokens, fontsize=7)
    ax.set_xlabel("attended-to token (key)")
    ax.set_ylabel("attending token (query)")
    ax.set_title(f"layer {layer}, head {head}")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fileio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
    return path


def run_command(args) -> int:
    """`bert-jax analyze-attention` (arguments: `bert_jax.cli.analysis`) -> files."""
    texts = read_texts(args.input, args.text_column, args.text_pair_column,
                       args.max_examples)
    if not 0 <= args.sentence_index < len(texts):
        raise BertJaxError(f"--sentence-index {args.sentence_index}: the input has "
                           f"{len(texts)} texts")
    if args.batch_size <= 0 or args.max_length < 2:
        raise BertJaxError("--batch-size must be > 0 and --max-length >= 2")
    runner = AttentionRunner(args.checkpoint)
    cfg = runner.config
    if not args.no_plots:
        pyplot()  # fail before the long pass when matplotlib is missing
        if not 1 <= args.layer <= cfg.num_hidden_layers:
            raise BertJaxError(f"--layer {args.layer}: the model has layers "
                               f"1..{cfg.num_hidden_layers}")
        if not 1 <= args.head <= cfg.num_attention_heads:
            raise BertJaxError(f"--head {args.head}: the model has heads "
                               f"1..{cfg.num_attention_heads}")
    stats = analyze(args.checkpoint, texts, args.max_length, args.batch_size, runner)
    storage.makedirs(args.output)
    written = [storage.join(args.output, STATS_FILE)]
    fileio.atomic_write_json(written[0], stats, indent=1, sort_keys=False)
    if not args.no_plots:
        out = args.output
        written += [plot_special_tokens(stats, storage.join(out, "special_tokens.png")),
                    plot_head_maps(stats, storage.join(out, "heads.png")),
                    plot_entropy(stats, storage.join(out, "entropy.png")),
                    plot_sentence(runner, texts[args.sentence_index], args.layer,
                                  args.head, min(args.max_length,
                                                 runner.config.max_position_embeddings),
                                  storage.join(out, f"sentence{args.sentence_index}_"
                                                    f"layer{args.layer}_head{args.head}"
                                                    ".png"))]
    print(json.dumps({"written": written, "texts": stats["texts"],
                      "queries": stats["queries"]}), file=sys.stdout)
    return 0
