"""One process of a multi-process test (run as a script by ``helpers.launched``).

``worker.py global_batch OUT MESHES_JSON``: for each mesh ``{"ici": {...}, "dcn": {...}}``,
this process feeds its rows ``[i*B/n, (i+1)*B/n)`` of a known global batch to
``parallel.global_batch``, then records (a) whether every addressable shard holds exactly the
expected global rows and (b) the whole array gathered back with ``process_allgather``, in
``OUT/<process>.npz`` (or the error, for meshes that cannot split the batch over processes).

``worker.py pretrain RUNS_JSON``: ``bert-jax pretrain ARGS`` (the CLI's ``main``) for each
argument list in RUNS_JSON, one after another in this process, each run's output preceded by
the line ``RUN_MARK<index>``; exits with the first non-zero status. A later run that resumes an
earlier one's workdir restores its checkpoint from disk like a restarted process.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

RUN_MARK = "=== pretrain run "


def expected_global_batch(batch_size: int, seq_len: int = 4) -> dict[str, np.ndarray]:
    """Rows that identify themselves: input_ids[r] = 1000*r + column."""
    rows = np.arange(batch_size)
    return {"input_ids": (1000 * rows[:, None] + np.arange(seq_len)).astype(np.int32),
            "labels": rows.astype(np.int32)}


def global_batch(out: str, meshes_json: str) -> None:
    import jax
    from jax.experimental import multihost_utils

    from bert_jax import parallel

    assert parallel.maybe_initialize_distributed()
    index, count = jax.process_index(), jax.process_count()
    rules = parallel.DEFAULT_RULES
    results: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    for n, spec in enumerate(json.loads(meshes_json)):
        mesh = parallel.create_mesh(spec["ici"], spec.get("dcn"))
        size = 4 * count
        want = expected_global_batch(size)
        local_rows = slice(index * size // count, (index + 1) * size // count)
        local = {k: v[local_rows] for k, v in want.items()}
        try:
            parallel.check_batch_split_over_processes(mesh, rules)
            arrays = parallel.global_batch(local, mesh, rules)
        except Exception as e:  # recorded; the test decides whether it was expected
            errors[str(n)] = f"{type(e).__name__}: {e}"
            continue
        shards_ok = all(np.array_equal(np.asarray(s.data), want[k][s.index])
                        for k, a in arrays.items() for s in a.addressable_shards)
        results[f"{n}_shards_ok"] = np.asarray(shards_ok)
        for k, a in arrays.items():
            results[f"{n}_{k}"] = multihost_utils.process_allgather(a, tiled=True)
            results[f"{n}_{k}_shape"] = np.asarray(a.shape)
    np.savez(os.path.join(out, f"{index}.npz"), **results)
    with open(os.path.join(out, f"{index}.errors.json"), "w") as f:
        json.dump(errors, f)
    multihost_utils.sync_global_devices("done")


def pretrain(runs_json: str) -> None:
    from bert_jax.cli import main

    for index, args in enumerate(json.loads(runs_json)):
        print(f"{RUN_MARK}{index}", flush=True)
        rc = main(["pretrain", "--json", *args])
        if rc:
            sys.exit(rc)


if __name__ == "__main__":
    {"global_batch": global_batch, "pretrain": pretrain}[sys.argv[1]](*sys.argv[2:])
