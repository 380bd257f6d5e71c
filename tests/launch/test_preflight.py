"""The launch scripts' preflight: before a slice is created or a run started, `bert-jax compile`
checks the config for that slice; a config that does not fit is refused before any gcloud
command, --skip-preflight skips the check, --dry-run shows it as a comment. The compile itself
is a fake interpreter here (BERT_JAX_PYTHON); tests/tpu/test_compile.py tests the real one."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
CREATE = ["--name", "bert-v5e", "--zone", "us-west4-a", "--accelerator-type", "v5litepod-64"]
RUN = ["--name", "bert-v4", "--zone", "us-central2-b", "--accelerator-type", "v4-32",
       "--workdir", "gs://my-bucket/runs/base", "--run-id", "r1", "--detach"]


@pytest.fixture
def fakes(tmp_path):
    """A fake interpreter for the compile check (exit status FAKE_COMPILE_RC, argv recorded)
    and a fake gcloud that records every call."""
    def executable(path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
        return path

    python = executable(tmp_path / "bin/fake-python", f"""#!/bin/sh
printf '%s\\n' "$@" > {tmp_path}/compile.argv
pwd > {tmp_path}/compile.cwd
echo "compile report"
exit "${{FAKE_COMPILE_RC:-0}}"
""")
    executable(tmp_path / "bin/gcloud", f'#!/bin/sh\necho "$@" >> {tmp_path}/gcloud.calls\n'
               'echo READY\n')
    env = {"BERT_JAX_PYTHON": str(python), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "HOME": str(tmp_path)}
    return tmp_path, env


def sh(script: str, *args: str, env: dict):
    return subprocess.run(["bash", str(LAUNCH / script), *args], capture_output=True,
                          text=True, env={**os.environ, **env}, cwd=REPO, timeout=60)


def test_dry_run_shows_the_preflight_as_a_comment(fakes):
    tmp, env = fakes
    result = sh("tpu_create.sh", *CREATE, "--num-slices", "2", "--config",
                "experiments/pretrain.py:bert_large_phase1", "--dry-run", "--",
                "--config.parallel.mesh.fsdp=-1", env=env)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("# preflight (cd ") and (
        "-m bert_jax compile --config experiments/pretrain.py:bert_large_phase1 "
        "--topology v5litepod-64 --num-slices 2 --config.parallel.mesh.fsdp=-1") in first
    assert not (tmp / "compile.argv").exists()  # shown, not run


def test_create_refuses_a_config_that_does_not_fit(fakes):
    tmp, env = fakes
    result = sh("tpu_create.sh", *CREATE, "--no-wait", env={**env, "FAKE_COMPILE_RC": "1"})
    assert result.returncode == 2
    assert "does not fit 1 x v5litepod-64" in result.stderr and "--skip-preflight" in \
        result.stderr
    assert "compile report" in result.stderr  # the report is shown
    assert not (tmp / "gcloud.calls").exists()  # nothing was created
    argv = (tmp / "compile.argv").read_text().split()
    assert argv[:4] == ["-m", "bert_jax", "compile", "--config"]
    assert "--topology" in argv and argv[argv.index("--topology") + 1] == "v5litepod-64"
    assert (tmp / "compile.cwd").read_text().strip() == str(REPO)


def test_create_after_a_passing_preflight_and_with_skip(fakes):
    tmp, env = fakes
    result = sh("tpu_create.sh", *CREATE, "--no-wait", env=env)
    assert result.returncode == 0, result.stderr
    assert "tpus tpu-vm create bert-v5e" in (tmp / "gcloud.calls").read_text()
    (tmp / "compile.argv").unlink()
    result = sh("tpu_create.sh", *CREATE, "--no-wait", "--skip-preflight",
                env={**env, "FAKE_COMPILE_RC": "1"})
    assert result.returncode == 0, result.stderr
    assert not (tmp / "compile.argv").exists()


def test_compile_errors_are_refused_too(fakes):
    tmp, env = fakes
    result = sh("tpu_run.sh", *RUN, env={**env, "FAKE_COMPILE_RC": "2"})
    assert result.returncode == 2 and "compile check failed (exit 2)" in result.stderr
    assert not (tmp / "gcloud.calls").exists()  # no worker was started


def test_run_checks_the_run_config_with_its_overrides(fakes):
    tmp, env = fakes
    result = sh("tpu_run.sh", *RUN, "--num-slices", "2", "--", "--config.global_batch_size=512",
                env={**env, "FAKE_COMPILE_RC": "1"})
    assert result.returncode == 2 and "not launching" in result.stderr
    argv = (tmp / "compile.argv").read_text().split()
    assert argv[argv.index("--num-slices") + 1] == "2"
    assert {"--config.global_batch_size=512", "--config.parallel.dcn_mesh.data=2"} <= set(argv)
    assert not (tmp / "gcloud.calls").exists()


def test_generations_without_compile_data_skip_the_check(fakes):
    tmp, env = fakes
    result = sh("tpu_create.sh", "--name", "old", "--zone", "us-central1-a",
                "--accelerator-type", "v3-32", "--dry-run", env=env)
    assert result.returncode == 0 and "preflight skipped: no compile data for v3" in \
        result.stderr
    assert not result.stdout.startswith("# preflight")


def test_resume_checks_once_in_the_run_step(fakes):
    tmp, env = fakes
    result = sh("tpu_resume.sh", "--name", "bert-v4", "--zone", "us-central2-b",
                "--accelerator-type", "v4-32", "--stage-dir", "gs://my-bucket/stage",
                "--workdir", "gs://my-bucket/runs/base", "--run-id", "r1", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    comments = [line for line in result.stdout.splitlines() if line.startswith("# preflight")]
    assert len(comments) == 1  # tpu_run.sh's; the re-create skips its own
