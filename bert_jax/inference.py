"""Inference on any checkpoint: ``fill-mask`` and ``embed`` (feature-based BERT).

Both accept what fine-tuning accepts (``bert_jax.checkpoint.detect``): a bert-jax model
directory, a pretraining or fine-tuning workdir, one of its step directories, or a Hugging Face
BERT directory. JAX is imported only when a command runs, so ``--help`` stays instant.
"""

from __future__ import annotations

import numpy as np

from bert_jax.errors import BertJaxError

MASK_TOKEN = "[MASK]"
CHECKPOINT_HELP = ("a bert-jax model directory, pretraining or fine-tuning workdir, step "
                   "directory (WORKDIR/checkpoints/N), or Hugging Face BERT directory")


def _load(path: str):
    from bert_jax.checkpoint.detect import load_checkpoint
    from bert_jax.modeling.params import to_layout

    params, config, tokenizer, _ = load_checkpoint(path)
    if tokenizer is None:
        raise BertJaxError(f"{path}: checkpoint has no tokenizer (no tokenizer/ directory or "
                           "vocab.txt); inference needs the tokenizer the model was trained "
                           "with")
    return to_layout(params, config), config, tokenizer


def no_mlm_head_message(path: str) -> str:
    """What to do with an encoder-only checkpoint (a sentence-embedding model, a fine-tuned
    classifier, a `BertModel` export) when asked to fill masks."""
    return (f"{path}: this checkpoint has no masked-LM head (it holds an encoder only, e.g. "
            "a sentence-embedding model such as all-MiniLM-L6-v2 or a fine-tuned classifier), "
            "so it cannot predict masked tokens. What works: `bert-jax embed "
            f"{path} --text ... --output vecs.npy` for its vectors; fill-mask with a "
            "checkpoint that has the head — a `bert-jax pretrain` workdir (`make demo` makes "
            "one) or a Hugging Face BertForMaskedLM / BertForPreTraining directory")


# How people write a mask token; a text with one of these but not the tokenizer's own gets a
# hint naming the one it wants.
MASK_SPELLINGS = ("[MASK]", "[mask]", "<mask>", "<MASK>", "[Mask]", "<Mask>")


def no_mask_message(tokenizer, text: str) -> str:
    """Why a text cannot be filled: it holds no mask token of this tokenizer."""
    wanted = tokenizer.mask_token
    found = [m for m in MASK_SPELLINGS if m != wanted and m in text]
    seen = f" ({found[0]!r} is not it)" if found else ""
    return (f"no mask token in {text[:60]!r}{seen}: this checkpoint's tokenizer marks the "
            f"token to predict as {wanted}, e.g. --text \"It was a {wanted} day.\"")


def encode_with_masks(tokenizer, text: str, max_length: int) -> list[int]:
    """[CLS] text [SEP] where each literal mask token (``[MASK]``, ``<mask>`` for byte-level
    BPE) becomes the mask id; a text without one is an error naming the tokenizer's."""
    if tokenizer.mask_token not in text:
        raise BertJaxError(no_mask_message(tokenizer, text))
    ids = [tokenizer.cls_id, *tokenizer.encode_ids_with_masks(text), tokenizer.sep_id]
    if len(ids) > max_length:
        raise BertJaxError(f"text of {len(ids)} tokens exceeds max length {max_length}: "
                           f"{text[:60]!r}")
    return ids


def _pad(rows: list[list[int]], pad_id: int, multiple: int = 8, length: int | None = None):
    length = length or max(len(r) for r in rows)
    length = (length + multiple - 1) // multiple * multiple
    ids = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def fill_mask(path: str, texts: list[str], top_k: int = 5) -> list[list[list[dict]]]:
    """For each text and each [MASK] in it: the top-k fillers, most probable first, each
    ``{"token": vocabulary piece, "id", "text": the piece as text, "probability"}``."""
    import jax
    import jax.numpy as jnp

    from bert_jax.modeling import BertForPreTraining

    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise BertJaxError(f"--top-k {top_k}: expected an integer >= 1")
    params, config, tokenizer = _load(path)
    if "mlm" not in params:
        raise BertJaxError(no_mlm_head_message(path))
    model = BertForPreTraining(config, pair_head="nsp" in params,
                               add_pooler="pooler" in params["bert"])
    rows = [encode_with_masks(tokenizer, t, config.max_sequence_length) for t in texts]
    ids, mask = _pad(rows, tokenizer.pad_id)
    logits = jax.jit(lambda p, i, m: model.apply({"params": p}, i, m)["mlm_logits"])(
        params, jnp.asarray(ids), jnp.asarray(mask))
    probs = np.asarray(jax.nn.softmax(logits[..., :config.vocab_size], axis=-1))
    results = []
    for b, row in enumerate(rows):
        per_text = []
        for pos in [i for i, t in enumerate(row) if t == tokenizer.mask_id]:
            best = np.argsort(-probs[b, pos])[:top_k]
            per_text.append([{"token": tokenizer.id_to_token(int(j)), "id": int(j),
                              "text": filler_text(tokenizer, int(j)),
                              "probability": float(probs[b, pos, j])} for j in best])
        results.append(per_text)
    return results


def filler_text(tokenizer, token_id: int) -> str:
    """A predicted piece as a reader would write it: decoded (no SentencePiece ``▁``, no
    WordPiece ``##``), else the piece itself."""
    text = tokenizer.decode([token_id]).strip()
    return text or tokenizer.id_to_token(token_id)


def format_fill_mask(text: str, masks: list[list[dict]]) -> str:
    """One readable line per text: ``TEXT  ->  'Walter' 0.43, 'p' 0.03`` (masks separated by
    `` | ``)."""
    fillers = " | ".join(", ".join(f"{c['text']!r} {c['probability']:.2f}" for c in mask)
                         for mask in masks)
    return f"{text}  ->  {fillers}"


def embed(path: str, texts: list[str], layer: str = "-1", pooling: str = "none",
          max_length: int = 128, batch_size: int = 64):
    """Contextual embeddings. ``layer``: an index into [embeddings, layer_1..layer_L] (negative
    counts from the top), ``last4`` (concatenation of the last four layers), ``sum4`` (their
    sum), ``all`` (every hidden state stacked: [..., L+1, D]) or ``mix:w0,w1,...`` (a weighted
    sum; see ``modeling.feature_heads.embed_layer_spec``). ``pooling``: none (per token,
    padded) | cls | mean | pooled (the pooler's tanh output).

    Returns (vectors, lengths): [N, S, D] or [N, D] ([N, S, L+1, D] / [N, L+1, D] for
    ``all``), and the token count of each text.
    """
    import jax
    import jax.numpy as jnp

    from bert_jax.modeling import BertModel
    from bert_jax.modeling.feature_heads import combine, embed_layer_spec

    params, config, tokenizer = _load(path)
    model = BertModel(config, add_pooler="pooler" in params["bert"])
    if pooling == "pooled" and "pooler" not in params["bert"]:
        raise BertJaxError(f"{path}: checkpoint has no pooler; use --pooling cls or mean")
    indices, how, weights = embed_layer_spec(layer, config.num_hidden_layers + 1)

    @jax.jit
    def run(p, ids, mask):
        out = model.apply({"params": p}, ids, mask, output_hidden_states=True)
        feats = combine([out["hidden_states"][i] for i in indices], how, weights)
        m = mask.reshape(mask.shape + (1,) * (feats.ndim - 2)).astype(feats.dtype)
        return {"none": feats, "cls": feats[:, 0],
                "mean": (feats * m).sum(1) / jnp.maximum(m.sum(1), 1),
                "pooled": out.get("pooled_output")}[pooling]

    encoded = [tokenizer.encode(t, max_length=max_length).input_ids for t in texts]
    lengths = np.array([len(e) for e in encoded], np.int32)
    chunks = []
    for start in range(0, len(encoded), batch_size):
        # per-token output: one padded length for every chunk
        ids, mask = _pad(encoded[start:start + batch_size], tokenizer.pad_id,
                         length=int(lengths.max()) if pooling == "none" else None)
        chunks.append(np.asarray(run(params["bert"], jnp.asarray(ids), jnp.asarray(mask))))
    vectors = np.concatenate(chunks)
    return (vectors[:, :int(lengths.max())] if pooling == "none" else vectors), lengths
