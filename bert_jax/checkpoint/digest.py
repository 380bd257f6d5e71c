"""Content digests of the arrays of a training step, committed with the step itself.

``sha256.json`` is written once a step is on disk, so a step that is newest when the process
is killed has none. To make every committed step checkable, the save adds a ``digest`` item to
the same Orbax commit: per array, two sums over its raw bits read as 32-bit words (plain, and
weighted by odd position factors), computed on the device from the arrays being saved — one
small jitted pass and one transfer of two words per array, no second host copy. A change of any
single word changes the weighted sum (an odd factor times a non-zero difference is non-zero
modulo 2**32); several changes that cancel in both sums are vanishingly unlikely.

On restore (and in ``load_model``) a step without its manifest is read, digested the same way
and compared; a match proves the arrays, and the manifest is then written for the step.
"""

from __future__ import annotations

import json

from bert_jax import storage

DIGEST_ITEM = "digest"
# Orbax's JSON item keeps its value in this file of the item directory.
_JSON_ITEM_FILE = "metadata"


def _words(x):
    """The raw bits of ``x`` as a flat uint32 vector."""
    import jax
    import jax.numpy as jnp

    size = jnp.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_:
        words = x.astype(jnp.uint32)
    elif size == 4:
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif size == 8:
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    elif size == 2:
        words = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    else:
        words = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    return words.reshape(-1)


def _sums(leaves):
    import jax.numpy as jnp

    out = []
    for x in leaves:
        words = _words(x)
        factors = jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
        out.append(jnp.stack([jnp.sum(words, dtype=jnp.uint32),
                              jnp.sum(words * factors, dtype=jnp.uint32)]))
    return jnp.stack(out) if out else jnp.zeros((0, 2), jnp.uint32)


_jitted = None


def compute(tree) -> dict[str, str]:
    """{key path: hex digest} of every array leaf of ``tree`` (jax or numpy arrays)."""
    import jax
    import numpy as np

    global _jitted
    if _jitted is None:
        _jitted = jax.jit(_sums)
    named = [(jax.tree_util.keystr(path), x) for path, x in
             jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(x, "dtype")]
    if not named:
        return {}
    sums = np.asarray(jax.device_get(_jitted([x for _, x in named])))
    return {name: f"{int(a):08x}{int(b):08x}" for (name, _), (a, b) in zip(named, sums,
                                                                            strict=True)}


def read(step_dir: str) -> dict[str, str] | None:
    """The digests committed with ``step_dir``, or None (a step saved without them)."""
    path = storage.join(step_dir, DIGEST_ITEM, _JSON_ITEM_FILE)
    if not storage.isfile(path):
        return None
    try:
        data = json.loads(storage.read_text(path))
    except (OSError, ValueError):
        return {"<unreadable>": ""}  # compares unequal to anything: the step is damaged
    return data if isinstance(data, dict) else {"<unreadable>": ""}


def first_mismatch(recorded: dict[str, str], tree) -> str | None:
    """The key path of the first array of ``tree`` whose digest differs from ``recorded``
    (paths absent from ``recorded`` are not compared), or None."""
    if "<unreadable>" in recorded:
        return "<the digest item>"
    for name, value in compute(tree).items():
        if name in recorded and recorded[name] != value:
            return name
    return None


_finite = None


def first_non_finite(tree) -> str | None:
    """The path of the first floating-point leaf of ``tree`` holding NaN/Inf, or None (one
    device pass and one transfer of a boolean per leaf)."""
    import jax
    import jax.numpy as jnp

    global _finite
    if _finite is None:
        _finite = jax.jit(lambda leaves: jnp.stack([jnp.all(jnp.isfinite(x))
                                                    for x in leaves]))
    named = [(jax.tree_util.keystr(path), x) for path, x in
             jax.tree_util.tree_flatten_with_path(tree)[0]
             if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not named:
        return None
    flags = jax.device_get(_finite([x for _, x in named]))
    return next((name for (name, _), ok in zip(named, flags, strict=True) if not ok), None)
