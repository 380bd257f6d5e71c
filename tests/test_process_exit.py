"""The CLI process's edges: glibc malloc set for host-CPU runs (no fresh pages per step) and
an exit that skips the interpreter's teardown once the work is done."""

import os
import subprocess
import sys
import textwrap

import pytest

from bert_jax import allocator

# A worker thread allocates, touches and frees a 54 MB block 20 times, as XLA's CPU runtime
# does with a step's temporary buffer; the script prints the minor page faults it caused.
_CHURN = textwrap.dedent("""
    import ctypes, resource, sys, threading
    from bert_jax import allocator
    if sys.argv[1] == "configured":
        assert allocator.configure({"BERT_JAX_CPU_MALLOC": "1"})
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 54 << 20
    def churn():
        for _ in range(20):
            block = libc.malloc(size)
            ctypes.memset(block, 1, size)
            libc.free(block)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(mode: str) -> int:
    env = dict(os.environ, BERT_JAX_CPU_MALLOC="0")  # the child starts with glibc's defaults
    done = subprocess.run([sys.executable, "-c", _CHURN, mode], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc settings")
def test_configured_malloc_reuses_a_freed_large_block():
    pages = (54 << 20) // 4096
    default, configured = _faults("default"), _faults("configured")
    assert default > 15 * pages  # a fresh mapping every time: every page faults again
    assert configured < 3 * pages  # touched once, then reused


def test_malloc_settings_follow_the_machine_and_the_switch():
    assert allocator.host_runs_programs({"JAX_PLATFORMS": "cpu"})
    assert not allocator.host_runs_programs({"JAX_PLATFORMS": "cuda"})
    assert not allocator.host_runs_programs({"JAX_PLATFORMS": "tpu,cpu"})
    assert not allocator.configure({"BERT_JAX_CPU_MALLOC": "0", "JAX_PLATFORMS": "cpu"})
    assert not allocator.configure({"JAX_PLATFORMS": "cuda"})


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120)


def test_exit_now_runs_exit_handlers_and_ends_with_the_code():
    done = _run("""
        import atexit, sys
        from bert_jax import shutdown
        atexit.register(lambda: print("handler ran"))
        print("work done", end="")  # unflushed output is flushed
        shutdown.keep_until_exit(object())
        shutdown.exit_now(3)
        print("not reached")
    """)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "work done" + "handler ran\n"


def test_exit_now_leaves_a_working_thread_to_the_normal_exit():
    done = _run("""
        import threading, time
        from bert_jax import shutdown
        worker = threading.Thread(target=lambda: (time.sleep(0.5), print("worker finished")))
        worker.start()
        shutdown.exit_now(0)
        print("returned")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["returned", "worker finished"]
