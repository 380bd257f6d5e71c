"""The launch/ scripts: exact --dry-run commands, argument validation, safe quoting end to end
(the printed ssh command is executed against a fake worker), the worker supervisor, the SLURM
template's per-task environment, and shellcheck."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
SCRIPTS = ["tpu_create.sh", "tpu_setup.sh", "tpu_run.sh", "tpu_resume.sh", "tpu_delete.sh"]
SBATCH = LAUNCH / "slurm" / "pretrain.sbatch"
ZONE = ["--zone", "us-central2-b"]
# A value a shell would mangle if it were quoted carelessly.
TRICKY = "gs://my-bucket/it's a \"corpus\" $HOME `x` ; *.tfrecord"


def sh(script: str | Path, *args: str, env: dict | None = None, cwd: Path | None = None):
    path = script if isinstance(script, Path) else LAUNCH / script
    return subprocess.run(["bash", str(path), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd or REPO, timeout=60)


def lines(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if not line.startswith("#")]


def argv_of(line: str) -> list[str]:
    """Let bash parse one printed command line; return its words (redirections dropped)."""
    if line.endswith(" < /dev/null &"):  # a background ssh of tpu_run.sh: drop its redirections
        line = line.rsplit(" > ", 1)[0]
    probe = 'words() { printf "%s\\0" "$@"; }; eval "words $1"'
    out = subprocess.run(["bash", "-c", probe, "probe", line],
                         capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.parametrize("script", [*SCRIPTS, "slurm/pretrain.sbatch"])
def test_every_script_has_help(script):
    result = sh(script, "--help")
    assert result.returncode == 0 and "Usage" in result.stdout and "--dry-run" in result.stdout


def test_create_spot_direct():
    out = lines(sh("tpu_create.sh", "--name", "bert-v4", *ZONE, "--accelerator-type", "v4-32",
                   "--spot", "--project", "my-project", "--dry-run"))
    assert argv_of(out[0]) == [
        "gcloud", "compute", "tpus", "tpu-vm", "create", "bert-v4", "--zone=us-central2-b",
        "--project=my-project", "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base",
        "--scopes=https://www.googleapis.com/auth/cloud-platform", "--spot"]
    assert argv_of(out[1])[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "bert-v4"]


def test_create_multislice_is_queued_with_node_prefix():
    out = lines(sh("tpu_create.sh", "--name=bert-v5e", "--zone=us-west4-a",
                   "--accelerator-type=v5litepod-64", "--num-slices=2", "--spot",
                   "--valid-until-duration=6h", "--dry-run"))
    argv = argv_of(out[0])
    assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "bert-v5e"]
    assert {"--node-count=2", "--node-prefix=bert-v5e", "--spot", "--valid-until-duration=6h",
            "--runtime-version=v2-alpha-tpuv5-lite", "--accelerator-type=v5litepod-64"} <= set(argv)
    assert not any(a.startswith("--node-id") for a in argv)
    assert "--format=value(state.state)" in argv_of(out[1])


def test_create_queued_single_slice_and_preemptible():
    out = lines(sh("tpu_create.sh", "--name", "q1", *ZONE, "--accelerator-type", "v4-8",
                   "--queued", "--no-wait", "--dry-run"))
    assert len(out) == 1 and "--node-id=q1" in argv_of(out[0])
    out = lines(sh("tpu_create.sh", "--name", "p1", *ZONE, "--accelerator-type", "v4-8",
                   "--preemptible", "--no-wait", "--dry-run"))
    assert argv_of(out[0])[-1] == "--preemptible"


@pytest.mark.parametrize(("args", "message"), [
    (["--zone", "uscentral2b"], "--zone 'uscentral2b'"),
    (["--zone", "us-central2-b; rm -rf /"], "is not a zone name"),
    (["--accelerator-type", "v4-30"], "multiples of 8"),
    (["--accelerator-type", "v7-8"], "must look like"),
    (["--accelerator-type", "v5litepod-12"], "count chips"),
    (["--num-slices", "0"], "--num-slices must be a positive integer"),
    (["--num-slices", "two"], "--num-slices must be a positive integer"),
    (["--name", "Bad_Name"], "not a valid TPU name"),
    (["--spot", "--preemptible"], "exclude each other"),
    (["--queued", "--preemptible"], "take --spot"),
    (["--bogus"], "unknown argument '--bogus'"),
    (["--zone"], "--zone needs a value"),
])
def test_create_validation(args, message):
    base = {"--name": "ok-name", "--zone": "us-central2-b", "--accelerator-type": "v4-32"}
    for flag in args:
        base.pop(flag, None)
    flat = [x for kv in base.items() for x in kv]
    result = sh("tpu_create.sh", *flat, *args, "--dry-run")
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr and result.stderr.startswith("error: ")


def test_create_requires_flags():
    result = sh("tpu_create.sh", *ZONE, "--accelerator-type", "v4-32", "--dry-run")
    assert result.returncode == 2 and "--name is required" in result.stderr


RUN = ["--name", "bert-v4", *ZONE, "--accelerator-type", "v4-32", "--workdir", "gs://my-bucket/runs/base",
       "--run-id", "r1"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--workdir", "/local/dir"], "--workdir must be a gs://bucket/path"),
    (["--", "--config.data.directory=/local/*.tfrecord"],
     "--config.data.directory must be a gs://"),
    (["--", "--config.global_batch_size=-1"],
     "--config.global_batch_size must be a positive integer"),
    (["--", "batch_size=3"], "must be a config override"),
    (["--config", "experiments/pretrain.py:bert_huge"], "unknown variant 'bert_huge'"),
    (["--config", "pretrain"], "must be FILE.py:VARIANT"),
    (["--env", "1X=2"], "must be KEY=VALUE"),
    (["--num-slices", "2", "--", "--config.parallel.dcn_mesh.data=4"],
     "the DCN axis spans the slices"),
])
def test_run_validation(extra, message):
    result = sh("tpu_run.sh", *RUN, "--dry-run", *extra)
    assert result.returncode == 2 and message in result.stderr


def test_run_multislice_one_ssh_per_worker_and_dcn_axis():
    out = lines(sh("tpu_run.sh", "--name", "ms", "--zone", "us-west4-a", "--accelerator-type",
                   "v5litepod-16", "--num-slices", "2", "--workdir", "gs://my-bucket/w", "--run-id",
                   "r2", "--detach", "--dry-run"))
    ssh = [argv_of(line) for line in out if line.startswith("gcloud")]
    assert len(ssh) == 8  # 2 slices x 4 hosts of 4 chips
    nodes = sorted(tuple(x for x in a if x.startswith(("--node=", "--worker="))) for a in ssh)
    assert nodes == sorted((f"--node={s}", f"--worker={w}") for s in range(2) for w in range(4))
    assert all(a[:5] == ["gcloud", "compute", "tpus", "queued-resources", "ssh"] for a in ssh)
    command = next(x for x in ssh[0] if x.startswith("--command="))
    assert "--config.parallel.dcn_mesh.data=2" in command and "--follow" not in command
    assert out[-1] == "wait"


def test_run_stop_reaches_all_workers():
    out = lines(sh("tpu_run.sh", "--name", "bert-v4", *ZONE, "--accelerator-type", "v4-32",
                   "--stop", "--dry-run"))
    argv = argv_of(out[0])
    assert "--worker=all" in argv and argv[-1].endswith("worker_run.sh stop --timeout 300")


@pytest.fixture
def fake_worker(tmp_path):
    """A HOME laid out as tpu_setup.sh leaves a worker, with a fake trainer and a fake gcloud."""
    home = tmp_path / "home"
    shutil.copy(LAUNCH / "worker_run.sh", executable(home / "bert-jax/launch/worker_run.sh", ""))
    executable(home / "bert-jax-venv/bin/bert-jax", f"""#!{shutil.which('python3')}
import json, os, signal, sys, time
json.dump(sys.argv[1:], open(os.environ["HOME"] + "/argv.json", "w"))
if os.environ.get("FAKE_WAIT"):  # the handler first: "training step" means it is installed
    signal.signal(signal.SIGTERM, lambda *a: (print("saved checkpoint", flush=True), sys.exit(0)))
print("training step 1", flush=True)
if os.environ.get("FAKE_WAIT"):
    time.sleep(60)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
""")
    gcloud = f'#!/bin/sh\necho "$@" >> {tmp_path}/gcloud.calls\n'
    bindir = executable(tmp_path / "bin/gcloud", gcloud).parent
    return {"HOME": str(home), "PATH": f"{bindir}:{os.environ['PATH']}",
            "BERT_JAX_UPLOAD_EVERY": "1"}


def remote_command(*overrides: str, extra: tuple[str, ...] = ()) -> str:
    out = lines(sh("tpu_run.sh", *RUN, "--accelerator-type", "v4-8", *extra, "--dry-run", "--",
                   *overrides))
    ssh = [argv_of(line) for line in out if line.startswith("gcloud")]
    assert len(ssh) == 1  # v4-8 is one host
    return next(x for x in ssh[0] if x.startswith("--command="))[len("--command="):]


def test_run_quoting_survives_to_the_trainer(fake_worker, tmp_path):
    overrides = (f"--config.data.directory={TRICKY}", "--config.global_batch_size=512")
    command = remote_command(*overrides, extra=("--env", "XLA_FLAGS=--xla_dump_to=/tmp/a b"))
    env = {**fake_worker, "FAKE_RC": "3"}
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=60)
    assert result.returncode == 3, result.stderr  # the trainer's status comes back over ssh
    assert "training step 1" in result.stdout  # --follow streamed the log
    argv = json.loads((Path(env["HOME"]) / "argv.json").read_text())
    assert argv == ["pretrain", "--config", "experiments/pretrain.py:bert_base_phase1",
                    "--workdir", "gs://my-bucket/runs/base", *overrides]
    log = Path(env["HOME"]) / "bert-jax-runs/r1/slice-0-worker-0.log"
    assert "training step 1" in log.read_text() and "exited with status 3" in log.read_text()
    calls = (tmp_path / "gcloud.calls").read_text()
    assert f"storage cp --quiet {log} gs://my-bucket/runs/base/logs/r1/" in calls


def test_worker_stop_sends_sigterm_so_the_trainer_checkpoints(fake_worker):
    env = {**os.environ, **fake_worker, "FAKE_WAIT": "1"}
    helper = Path(fake_worker["HOME"]) / "bert-jax/launch/worker_run.sh"
    started = subprocess.run(["bash", str(helper), "start", "--log-name", "w0", "--run-id", "r9",
                              "--", Path(fake_worker["HOME"]) / "bert-jax-venv/bin/bert-jax", "x"],
                             capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr  # detached: returns while training runs
    runs = Path(fake_worker["HOME"]) / "bert-jax-runs"
    assert (runs / "current.pid").exists()
    log = runs / "r9/w0.log"
    deadline = time.monotonic() + 20  # a trainer stopped before its handler exists just dies
    while "training step 1" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the fake trainer never started"
        time.sleep(0.05)
    stopped = subprocess.run(["bash", str(helper), "stop", "--timeout", "20"], capture_output=True,
                             text=True, env=env, timeout=30)
    assert stopped.returncode == 0, stopped.stderr
    assert "saved checkpoint" in (runs / "r9/w0.log").read_text()
    assert (runs / "r9/w0.exit").read_text().strip() == "0"
    assert not (runs / "current.pid").exists()


def test_setup_builds_stages_and_installs_everywhere():
    out = lines(sh("tpu_setup.sh", "--name", "ms", "--zone", "us-west4-a", "--num-slices", "2",
                   "--stage-dir", "gs://my-bucket/stage/", "--dry-run"))
    argvs = [argv_of(line) for line in out]
    assert ["gcloud", "storage", "cp", f"{REPO}/build/launch/bert-jax-bundle.tgz",
            "gs://my-bucket/stage/bert-jax-bundle.tgz"] in argvs
    ssh = argvs[-1]
    assert ssh[:5] == ["gcloud", "compute", "tpus", "queued-resources", "ssh"]
    assert "--node=all" in ssh and "--worker=all" in ssh
    assert "-r bert-jax/launch/requirements-tpu.txt" in ssh[-1]
    bad = sh("tpu_setup.sh", "--name", "ms", *ZONE, "--stage-dir", "/tmp/stage", "--dry-run")
    assert bad.returncode == 2 and "--stage-dir must be a gs://" in bad.stderr


def test_requirements_pin_every_package():
    reqs = [line for line in (LAUNCH / "requirements-tpu.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert reqs and all("==" in line for line in reqs)
    assert any(line.startswith("jax[tpu]==") for line in reqs)


RESUME = ["--name", "bert-v4", *ZONE, "--accelerator-type", "v4-32", "--spot",
          "--stage-dir", "gs://my-bucket/stage", "--workdir", "gs://my-bucket/runs/base",
          "--run-id", "r3", "--dry-run"]


def verbs(out: list[str]) -> list[str]:
    return [" ".join(argv_of(line)[3:5]) for line in out if line.startswith("gcloud")]


def test_resume_after_preemption_recreates_then_relaunches_same_workdir():
    out = lines(sh("tpu_resume.sh", *RESUME, "--", "--config.global_batch_size=256"))
    steps = verbs(out)
    assert steps[:3] == ["tpu-vm describe", "tpu-vm delete", "tpu-vm create"]
    assert steps[-4:] == ["tpu-vm ssh"] * 4 and "storage cp" in " ".join(out)
    create = argv_of(next(line for line in out if " create " in line))
    assert "--spot" in create
    assert all("--workdir gs://my-bucket/runs/base --config.global_batch_size=256" in line
               for line in out if "worker_run.sh start" in line)


def test_resume_healthy_slice_only_relaunches():
    out = lines(sh("tpu_resume.sh", *RESUME, "--assume-state", "READY"))
    assert verbs(out) == ["tpu-vm describe"] + ["tpu-vm ssh"] * 4


def test_resume_suspended_queued_resource_deletes_with_force():
    out = lines(sh("tpu_resume.sh", *RESUME, "--queued", "--assume-state", "SUSPENDED"))
    delete = argv_of(next(line for line in out if " delete " in line))
    assert delete[3:5] == ["queued-resources", "delete"] and "--force" in delete


def test_resume_validates_before_touching_anything():
    result = sh("tpu_resume.sh", *RESUME, "--", "--config.data.directory=/local/x")
    assert result.returncode == 2 and result.stdout == "" and "data.directory" in result.stderr


def test_delete_queued_and_direct():
    out = lines(sh("tpu_delete.sh", "--name", "ms", *ZONE, "--num-slices", "2", "--dry-run"))
    assert argv_of(out[0])[3:6] == ["queued-resources", "delete", "ms"] and "--force" in out[0]
    out = lines(sh("tpu_delete.sh", "--name", "v4", *ZONE, "--dry-run"))
    assert argv_of(out[0])[3:6] == ["tpu-vm", "delete", "v4"]


SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]",
             "SLURM_CPUS_ON_NODE": "96"}


@pytest.fixture
def fake_slurm(tmp_path):
    """scontrol that expands the node list, srun that starts every task locally (in order) with
    SLURM_PROCID/SLURM_LOCALID set, and a trainer that records its environment per task."""
    bindir = tmp_path / "bin"
    executable(bindir / "scontrol", "#!/bin/sh\necho gpu07\necho gpu08\n")
    executable(bindir / "srun", """#!/usr/bin/env bash
ntasks=1 per_node=1
while [[ "$1" == --* ]]; do
  case "$1" in --ntasks=*) ntasks="${1#*=}" ;; --ntasks-per-node=*) per_node="${1#*=}" ;; esac
  shift
done
for ((i = 0; i < ntasks; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$((i % per_node)) "$@" || exit $?
done
""")
    executable(tmp_path / "venv/bin/bert-jax", f"""#!{shutil.which('python3')}
import json, os, sys
keys = ["BERT_JAX_COORDINATOR_ADDRESS", "BERT_JAX_NUM_PROCESSES", "BERT_JAX_PROCESS_ID",
        "CUDA_VISIBLE_DEVICES"]
with open("{tmp_path}/tasks.jsonl", "a") as f:
    task = {{"env": {{k: os.environ.get(k) for k in keys}}, "argv": sys.argv[1:]}}
    f.write(json.dumps(task) + "\\n")
""")
    return tmp_path, {**SLURM_ENV, "PATH": f"{bindir}:{os.environ['PATH']}"}


def run_tasks(tmp_path, env, *args):
    result = sh(SBATCH, "--workdir", "/shared/runs/base", "--venv", str(tmp_path / "venv"), *args,
                env={k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"})
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]


def test_slurm_one_process_per_gpu(fake_slurm):
    tmp_path, env = fake_slurm
    override = "--config.data.directory=/shared/my data/it's/*.tfrecord"
    tasks = run_tasks(tmp_path, env, "--gpus-per-node", "4", "--", override)
    assert len(tasks) == 8
    for i, task in enumerate(tasks):
        assert task["env"] == {"BERT_JAX_COORDINATOR_ADDRESS": "gpu07:12587",
                               "BERT_JAX_NUM_PROCESSES": "8", "BERT_JAX_PROCESS_ID": str(i),
                               "CUDA_VISIBLE_DEVICES": str(i % 4)}
        assert task["argv"] == ["pretrain", "--config", "experiments/pretrain.py:bert_base_phase1",
                                "--workdir", "/shared/runs/base", override]


def test_slurm_one_process_per_node(fake_slurm):
    tmp_path, env = fake_slurm
    tasks = run_tasks(tmp_path, env, "--procs-per=node", "--port", "2222")
    assert [t["env"]["BERT_JAX_PROCESS_ID"] for t in tasks] == ["0", "1"]
    assert all(t["env"]["CUDA_VISIBLE_DEVICES"] is None for t in tasks)
    assert {t["env"]["BERT_JAX_COORDINATOR_ADDRESS"] for t in tasks} == {"gpu07:2222"}


def test_slurm_dry_run_and_validation(fake_slurm):
    _, env = fake_slurm
    out = sh(SBATCH, "--workdir", "gs://my-bucket/runs/x", "--dry-run", env=env).stdout.splitlines()
    assert out[:2] == ["export BERT_JAX_COORDINATOR_ADDRESS=gpu07:12587",
                       "export BERT_JAX_NUM_PROCESSES=16"]
    assert argv_of(out[2])[:4] == ["srun", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8"]
    for args, message in [(["--workdir", "runs/x"], "absolute path"),
                          (["--workdir", "/x", "--procs-per", "socket"], "'gpu' or 'node'"),
                          (["--workdir", "/x", "--", "--config.data.directory=rel/*"],
                           "absolute shared path")]:
        result = sh(SBATCH, *args, "--dry-run", env=env)
        assert result.returncode == 2 and message in result.stderr
    outside = sh(SBATCH, "--workdir", "/x", "--dry-run",
                 env={"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": "", "SLURM_JOB_NUM_NODES": ""})
    assert outside.returncode == 2 and "not inside a SLURM allocation" in outside.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_clean():
    files = [str(LAUNCH / s) for s in [*SCRIPTS, "common.sh", "worker_run.sh"]] + [str(SBATCH)]
    result = subprocess.run(["shellcheck", "-x", *files], capture_output=True, text=True,
                            cwd=LAUNCH)
    assert result.returncode == 0, result.stdout + result.stderr
