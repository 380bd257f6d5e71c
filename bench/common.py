"""Shared benchmark helpers: FLOP counting (identical for bert-jax and the peer), shapes, the
result folder and its JSON-lines files. No framework imports at module level."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

# the repository root: suites started as child processes run as ``python -m bench ...`` here
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = "bench_out"

# name -> (layers, hidden, heads, intermediate)
MODELS = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
VOCAB = 30522


def masked_positions(seq_len: int) -> int:
    """Masked-LM predictions per sequence: 20 at 128, 80 at 512 (15% rounded as BERT)."""
    return {128: 20, 512: 80}.get(seq_len, max(1, round(seq_len * 0.15)))


def train_flops_per_sequence(layers: int, hidden: int, seq_len: int, vocab: int = VOCAB,
                             predictions: int | None = None) -> float:
    """Model FLOPs of one training step per sequence (forward + backward = 3x forward):
    encoder matmuls 6*s*(12*L*H^2) + attention 12*L*s^2*H + MLM head on the predicted
    positions only 6*p*(H^2 + H*V). Pooler/NSP/embeddings are negligible and not counted."""
    p = masked_positions(seq_len) if predictions is None else predictions
    return (6 * seq_len * 12 * layers * hidden ** 2 + 12 * layers * seq_len ** 2 * hidden
            + 6 * p * (hidden ** 2 + hidden * vocab))


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    """Calls ``fn()`` (which must block until the device is done) ``repeats`` times."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def microseconds_per_call(fn, inputs, iters: int, repeats: int) -> float:
    """Median microseconds per call of ``fn(*inputs)`` (jitted) over ``repeats`` runs of
    ``iters`` back-to-back calls, each run ended by one device sync."""
    import jax

    def run():
        out = None
        for _ in range(iters):
            out = fn(*inputs)
        jax.block_until_ready(out)

    return median_time(run, repeats)[0] / iters * 1e6


def add_out_argument(ap) -> None:
    """``--out DIR``: the folder a suite appends its JSON lines to (``DIR/<suite>.jsonl``)."""
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help=f"folder for the JSON-lines results (default: ./{DEFAULT_OUT})")


def results_file(out_dir: str, suite: str) -> str:
    """``out_dir/<suite>.jsonl``; a path already ending in ``.jsonl`` is taken as the file."""
    if out_dir.endswith(".jsonl") or out_dir == os.devnull:
        return out_dir
    from bert_jax import storage

    return storage.join(out_dir, f"{suite}.jsonl")


def run_suite(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``python -m bench ARGV`` in a child process started in the repository root (paths in
    ``argv`` must be absolute)."""
    return subprocess.run([sys.executable, "-m", "bench", *argv], cwd=REPO, **kwargs)


def environment() -> dict:
    """Framework versions, device kind and count, XLA flags of this process (imports jax)."""
    import flax
    import jax
    import optax

    device = jax.devices()[0]
    return {"framework": "bert-jax", "jax": jax.__version__, "flax": flax.__version__,
            "optax": optax.__version__, "backend": jax.default_backend(),
            "device": getattr(device, "device_kind", str(device)),
            "device_count": jax.device_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def first_call(jitted, inputs, out: str, record: dict):
    """Runs ``jitted(*inputs)`` once (it compiles): (its result, None). A setting that does not
    compile or run is a result too: (None, ``record`` with the error), written to ``out`` and
    printed."""
    import jax

    try:
        return jax.block_until_ready(jitted(*inputs)), None
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        failed = {**record, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(failed, flush=True)
        write_result(out, failed)
        return None, failed


def parse_tile(spec: str) -> tuple[int | None, ...]:
    """A kernel tile of the sweeps: ``default`` -> (None, None, None, None) (the module's own
    choice), ``ROWS:COLS:WARPS[:STAGES]`` -> four ints (STAGES 0 when not given)."""
    if spec == "default":
        return None, None, None, None
    return tuple(int(v) for v in (spec + ":0").split(":")[:4])


def tile_name(tile: tuple[int | None, ...]) -> str:
    """``kernel_default`` or ``kernel_r{rows}_c{cols}_w{warps}[_s{stages}]``."""
    rows, cols, warps, stages = tile
    if rows is None:
        return "kernel_default"
    return f"kernel_r{rows}_c{cols}_w{warps}" + (f"_s{stages}" if stages else "")


def timed_against_reference(jitted, inputs, args, record: dict, want: dict, key,
                            reference: bool, extra=None) -> dict:
    """One variant of a kernel sweep: runs ``jitted(*inputs)`` once (``first_call``), takes the
    largest difference of its outputs from ``want[key]`` (the reference variant's, stored
    when ``reference``), times it (``microseconds_per_call``) and writes ``record`` with
    ``us``, ``max_diff_vs_xla`` and ``extra(us)``'s fields to ``args.out``. Returns the
    written record (the error record when it failed)."""
    import jax
    import jax.numpy as jnp

    result, failed = first_call(jitted, inputs, args.out, record)
    if failed:
        return failed
    leaves = jax.tree.leaves(result)
    if reference:
        want[key] = leaves
    err = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - w.astype(jnp.float32))))
              for a, w in zip(leaves, want[key], strict=True))
    us = microseconds_per_call(jitted, inputs, args.iters, args.repeats)
    out = {**record, "us": us, **(extra(us) if extra else {}), "max_diff_vs_xla": err}
    write_result(args.out, out)
    return out


def write_result(path: str, record: dict) -> None:
    from bert_jax import fileio, storage

    record = dict(record, host=platform.node(), time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    if path == os.devnull:
        print(json.dumps(record), flush=True)
        return
    # Appended by a rewrite: the folder may be a bucket (gs://), which has no append.
    before = storage.read_bytes(path) if storage.exists(path) else b""
    fileio.atomic_write(path, before + (json.dumps(record) + "\n").encode())
    print(json.dumps(record), flush=True)
