"""A missing bucket, a 403 and an unreachable server: one ``error:`` line naming the URL,
exit 2, nothing written anywhere, no hang."""

import http.server
import os
import subprocess
import sys
import threading
import time

import pytest
from gcs_server import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRETRAIN = ["pretrain", "--config", f"{REPO}/experiments/pretrain.py:tiny",
            "--config.data.source=synthetic", "--config.num_train_steps=2",
            "--config.model.hidden_size=32", "--config.model.num_attention_heads=4",
            "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=1"]


class Forbidden(http.server.BaseHTTPRequestHandler):
    def _deny(self):
        body = b'{"error": {"code": 403, "message": "Forbidden"}}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _deny

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def forbidden_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def run(tmp_path, endpoint, *args):
    env = dict(os.environ, STORAGE_EMULATOR_HOST=endpoint)
    for key in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        env.pop(key, None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bert_jax", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    return done, time.monotonic() - start


def commands(url):
    return [[*PRETRAIN, "--workdir", f"{url}/run"],
            ["train-tokenizer", "--input", f"{url}/corpus", "--output", "tok",
             "--vocab-size", "100"],
            ["embed", f"{url}/model", "--text", "x", "--output", "v.npy"]]


@pytest.mark.parametrize("case", ["missing bucket", "403", "unreachable"])
def test_storage_failures_are_one_line_and_write_nothing(case, tmp_path, forbidden_server):
    from gcs_server import server

    if case == "missing bucket":
        endpoint, url, expected = server().url, "gs://no-such-bucket", "no such bucket"
    elif case == "403":
        endpoint, url, expected = forbidden_server, "gs://bkt", "permission denied"
    else:
        endpoint, url, expected = f"http://127.0.0.1:{free_port()}", "gs://bkt", \
            "cannot reach the storage server"
    # An unreachable server costs each command its bounded retries: two commands show it.
    for args in commands(url)[::2] if case == "unreachable" else commands(url):
        done, seconds = run(tmp_path, endpoint, *args)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2, done.stderr
        assert len(errors) == 1 and url in errors[0] and expected in errors[0], done.stderr
        assert "Traceback" not in done.stderr
        assert seconds < 90
        assert os.listdir(tmp_path) == []  # nothing written, no folder named gs:
    if case == "missing bucket":
        assert "no-such-bucket" not in str(server().objects("no-such-bucket"))
