"""Data-parallel scaling on the GPUs of one host, and FSDP vs data-parallel memory.

For each device count n (1, 2, 4, ... up to what is present) runs ``bench step pretrain`` in
its own process (so each peak-memory figure is its own) with the per-device batch fixed:
data parallel (parameters replicated) at every n, FSDP (parameters, gradients and optimizer
state sharded on ``embed``) at every n >= 2. Then writes one ``scaling_summary`` record:

* DP efficiency(n) = seq/s(n) / (n * seq/s(1))  (target >= 0.9);
* FSDP/DP at each n: parameter + optimizer bytes per device (from the arrays' addressable
  shards; target ~1/n), peak device memory, and throughput cost 1 - seq/s(FSDP)/seq/s(DP)
  (target <= 0.10).

On GPU each run sees only its n cards (``CUDA_VISIBLE_DEVICES``); on CPU (validation, with
``--xla_force_host_platform_device_count``) it passes ``--devices n``. Extra arguments after
``--`` go to every pretraining step run (e.g. ``-- --xla-flags collectives``);
``--variant NAME=ARGS`` adds a data-parallel run with those step options at every n >= 2
(e.g. ``--variant "overlap=--xla-flags dp_overlap"``), with its own efficiency against the
same one-device run. Records go to OUT/scaling.jsonl (each run's step record, then the
summary).

  python -m bench scaling run --model large --per-device-batch 128
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench.common import add_out_argument, results_file, run_suite, write_result


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench scaling run",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="large")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--per-device-batch", type=int, default=128)
    ap.add_argument("--device-counts", default="auto",
                    help="comma list, e.g. 1,2,4 (auto: powers of two up to all devices)")
    ap.add_argument("--no-fsdp", action="store_true", help="data-parallel runs only")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], type=_variant,
                    metavar="NAME=ARGS",
                    help="an extra data-parallel run at every n >= 2 with these step options "
                         "(repeatable)")
    add_out_argument(ap)
    ap.add_argument("extra", nargs=argparse.REMAINDER,
                    help="-- then options passed to every `bench step pretrain` run")
    args = ap.parse_args(argv)
    if args.extra and args.extra[0] == "--":
        args.extra = args.extra[1:]
    args.out = results_file(args.out, "scaling")
    return args


def _variant(spec: str) -> tuple[str, list[str]]:
    name, sep, options = spec.partition("=")
    if not sep or not name or name in ("dp", "fsdp") or not options.split():
        raise argparse.ArgumentTypeError(f"{spec!r}: expected NAME=OPTIONS with a name other "
                                         "than dp or fsdp, e.g. 'overlap=--xla-flags dp_overlap'")
    return name, options.split()


def _device_info() -> tuple[int, str]:
    """(device count, backend), asked in a child process so this one holds no device."""
    code = "import jax; print(jax.device_count(), jax.default_backend())"
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    return int(out[-2]), out[-1]


def device_counts(spec: str, available: int) -> list[int]:
    if spec != "auto":
        counts = [int(c) for c in spec.split(",")]
        if max(counts) > available:
            raise SystemExit(f"--device-counts {spec}: only {available} devices present")
        return counts
    counts, n = [], 1
    while n <= available:
        counts.append(n)
        n *= 2
    return counts


def run_one(args, n: int, mesh: str, backend: str, name: str | None = None,
            options: tuple[str, ...] = ()) -> dict:
    """One pretraining step run on n devices (``name``: a variant's label, ``options`` its
    step options); returns its record (also appended to --out)."""
    name = name or mesh
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.jsonl")
        cmd = ["step", "pretrain", "--model", args.model,
               "--seq-len", str(args.seq_len), "--batch-size", str(args.per_device_batch * n),
               "--mesh", mesh, "--steps", str(args.steps), "--repeats", str(args.repeats),
               "--warmup", str(args.warmup), "--tag", f"scaling_{name}_{n}", "--out", out,
               *args.extra, *options]
        env = dict(os.environ)
        if backend == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n))
        else:
            cmd += ["--devices", str(n)]
        print("+ python -m bench", " ".join(cmd), flush=True)
        done = run_suite(cmd, env=env)
        if done.returncode != 0:
            record = {"task": "pretrain", "tag": f"scaling_{name}_{n}", "devices": n,
                      "mesh": mesh, "error": f"exit code {done.returncode}"}
            write_result(args.out, record)
            return record
        with open(out, encoding="utf-8") as f:
            record = json.loads(f.readlines()[-1])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


def summarize(records: dict[tuple[str, int], dict]) -> dict:
    """DP efficiency per n and FSDP-vs-DP memory and throughput per n."""
    ok = {k: r for k, r in records.items() if "error" not in r}
    base = ok.get(("dp", 1))
    dp, fsdp = {}, {}
    for (mesh, n), r in sorted(ok.items()):
        if mesh == "dp":
            dp[n] = {"seq_per_s": r["seq_per_s"], "mfu": r["mfu"],
                     "efficiency": r["seq_per_s"] / (n * base["seq_per_s"]) if base else None}
    for (mesh, n), r in sorted(ok.items()):
        ref = ok.get(("dp", n))
        if mesh != "fsdp" or ref is None:
            continue
        state = r["param_bytes_per_device"] + r["opt_state_bytes_per_device"]
        ref_state = ref["param_bytes_per_device"] + ref["opt_state_bytes_per_device"]
        fsdp[n] = {"state_gib_per_device": state / 2 ** 30,
                   "dp_state_gib_per_device": ref_state / 2 ** 30,
                   "state_fraction_of_dp": state / ref_state,
                   "peak_memory_gib": r["peak_memory_gib"],
                   "dp_peak_memory_gib": ref["peak_memory_gib"],
                   "seq_per_s": r["seq_per_s"],
                   "throughput_cost": 1 - r["seq_per_s"] / ref["seq_per_s"]}
    variants: dict[str, dict] = {}
    for (name, n), r in sorted(ok.items()):
        ref = ok.get(("dp", n))
        if name in ("dp", "fsdp"):
            continue
        variants.setdefault(name, {})[n] = {
            "seq_per_s": r["seq_per_s"], "mfu": r["mfu"],
            "efficiency": r["seq_per_s"] / (n * base["seq_per_s"]) if base else None,
            "vs_dp": r["seq_per_s"] / ref["seq_per_s"] - 1 if ref else None}
    return {"dp": dp, "fsdp": fsdp, "variants": variants,
            "failed": sorted(f"{m}_{n}" for (m, n), r in records.items() if "error" in r)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    available, backend = _device_info()
    records = {}
    for n in device_counts(args.device_counts, available):
        records[("dp", n)] = run_one(args, n, "dp", backend)
        if n >= 2 and not args.no_fsdp:
            records[("fsdp", n)] = run_one(args, n, "fsdp", backend)
        for name, options in args.variant if n >= 2 else ():
            records[(name, n)] = run_one(args, n, "dp", backend, name, options)
    summary = {"task": "scaling_summary", "model": args.model, "seq_len": args.seq_len,
               "per_device_batch": args.per_device_batch, "backend": backend,
               "device": next((r.get("device") for r in records.values() if "device" in r),
                              None),
               "extra_args": args.extra,
               "variant_args": {name: options for name, options in args.variant},
               **summarize(records)}
    write_result(args.out, summary)
    return summary


if __name__ == "__main__":
    main()
