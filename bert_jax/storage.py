"""Every user path, local or ``gs://``, through one layer.

Local paths go through ``os`` exactly as before. ``gs://bucket/key`` paths go through
fsspec's ``gcsfs`` (the Cloud Storage JSON API; it honours ``STORAGE_EMULATOR_HOST``), the
same client that ``etils.epath`` (and so Orbax) uses once ``EPATH_USE_TF=false``: this module
sets that, so Orbax's directory operations and ours share one client, and the code the suite
runs against fake-gcs-server is the code a pod runs against a bucket. Orbax's array data goes
through tensorstore, which :func:`configure_environment` points at the same endpoint.

Object stores have no directories, no rename and no append: a "directory" is a key prefix,
an object appears whole when its upload ends, and "replace" means write, then publish
through a marker object that readers trust (:mod:`bert_jax.fileio` builds those protocols
on the primitives here). Only ``gs://`` is supported among URLs; any other scheme is refused
with one error.

Every remote failure that a user can cause (a missing bucket, no permission, an endpoint
that does not answer) becomes one :class:`BertJaxError` naming the URL; the client retries
transient errors a bounded number of times.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import functools
import hashlib
import io
import os
import posixpath
import re
import shutil
import tempfile
import types
from collections.abc import Iterator
from typing import IO, Any

from bert_jax.errors import BertJaxError

GCS_SCHEME = "gs://"
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# How many times the client tries a request that fails for a transient reason (connection
# refused, 429, 5xx) before the error reaches the user, waiting about 1, 2, 4, ... s between
# tries; the environment variable BERT_JAX_STORAGE_TRIES sets another count (remote_tries).
REMOTE_RETRIES = 3
TRIES_VARIABLE = "BERT_JAX_STORAGE_TRIES"


def configure_environment() -> None:
    """Points every Cloud Storage client of the process at one endpoint.

    ``STORAGE_EMULATOR_HOST`` (the standard variable of the Google client libraries) is
    honoured by gcsfs and google-cloud-storage; tensorstore reads its own variables, set here
    from it. ``EPATH_USE_TF=false`` keeps etils (Orbax's paths) on gcsfs instead of
    TensorFlow's ``gs://`` client, which cannot be pointed at another endpoint. Existing
    settings win."""
    os.environ.setdefault("EPATH_USE_TF", "false")
    # gcsfs's zonal/hierarchical-bucket probe goes through a gRPC control-plane client that
    # emulators do not serve; standard buckets need none of it.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    # Every gcsfs instance of the process (ours and the one etils makes for Orbax) lists the
    # bucket afresh: other hosts and other clients write into the same prefixes, and a cached
    # listing would show a step directory that was moved away.
    import fsspec.config

    fsspec.config.conf.setdefault("gs", {}).setdefault("use_listings_cache", False)
    emulator = emulator_url()
    if emulator:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


def emulator_url() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as a URL, or None."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not host or host == "default":
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


configure_environment()


# ---- paths ----------------------------------------------------------------------------------
def is_remote(path: str) -> bool:
    """True for a URL (``gs://...``); False for a local path."""
    return bool(_URL.match(str(path)))


def check_supported(path: str) -> None:
    """BertJaxError for a URL of a scheme other than ``gs://``."""
    match = _URL.match(str(path))
    if match and match.group(1).lower() != "gs":
        raise BertJaxError(f"{path}: {match.group(1)}:// paths are not supported; use a local "
                           "path or a gs:// URL")


def _split(url: str) -> tuple[str, str]:
    check_supported(url)
    rest = url[len(GCS_SCHEME):].strip("/")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise BertJaxError(f"{url}: no bucket name")
    return bucket, key


def abspath(path: str) -> str:
    """An absolute local path, or the URL without a trailing slash."""
    path = os.fspath(path)
    if is_remote(path):
        bucket, key = _split(path)
        key = posixpath.normpath(key) if key else ""
        return f"{GCS_SCHEME}{bucket}" + (f"/{key}" if key and key != "." else "")
    return os.path.abspath(path)


def check_local(path: str) -> str:
    """``path`` if it is an ordinary local path; BertJaxError for a URL whose ``//`` was lost
    on the way (``gs:/bucket``): never create a local folder named ``gs:``."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+:/", os.fspath(path)) and not is_remote(path):
        raise BertJaxError(f"{path}: looks like a URL missing a slash (gs://bucket/...)")
    return path


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return posixpath.join(base.rstrip("/"), *parts)
    return os.path.join(base, *parts)


def dirname(path: str) -> str:
    if is_remote(path):
        bucket, key = _split(path)
        parent = posixpath.dirname(key.rstrip("/"))
        return f"{GCS_SCHEME}{bucket}" + (f"/{parent}" if parent else "")
    return os.path.dirname(path)


def basename(path: str) -> str:
    if is_remote(path):
        return posixpath.basename(path.rstrip("/"))
    return os.path.basename(path)


def relpath(path: str, start: str) -> str:
    if is_remote(path):
        return posixpath.relpath(abspath(path)[len(GCS_SCHEME):], abspath(start)[len(GCS_SCHEME):])
    return os.path.relpath(path, start)


def same_path(a: str, b: str) -> bool:
    return abspath(a) == abspath(b)


# ---- the remote client ----------------------------------------------------------------------
@functools.cache
def _gcs():
    import logging

    import gcsfs
    from gcsfs.retry import retry_request

    # gcsfs logs each failed try with its traceback; the failure that remains after the
    # retries reaches the user as one line (_describe).
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    tries = remote_tries()
    client = gcsfs.GCSFileSystem(token="anon" if emulator_url() else None,
                                 use_listings_cache=False, retries=tries)
    # gcsfs fixes the tries of its JSON API requests when its class is defined (6: about 30 s
    # of waiting on an endpoint that does not answer) whatever the instance's ``retries``;
    # this client's are tried ``tries`` times (the class, and so pickling, stays gcsfs's).
    client._request = types.MethodType(
        retry_request(retries=tries)(gcsfs.GCSFileSystem._request.__wrapped__), client)
    return client


def remote_tries() -> int:
    """How many times a remote request is tried: ``BERT_JAX_STORAGE_TRIES`` (1 = no retry:
    fail at once, e.g. a script probing whether an endpoint is up), else REMOTE_RETRIES."""
    raw = os.environ.get(TRIES_VARIABLE, "").strip()
    if not raw:
        return REMOTE_RETRIES
    try:
        tries = int(raw)
    except ValueError:
        tries = 0
    if tries < 1:
        raise BertJaxError(f"{TRIES_VARIABLE}={raw!r}: expected a whole number of tries, 1 or "
                           "more")
    return tries


def endpoint() -> str:
    return emulator_url() or "https://storage.googleapis.com"


def _describe(url: str, error: BaseException) -> BertJaxError | None:
    """A BertJaxError for a failure the user can act on, or None for a plain not-found."""
    text = str(error)
    status = getattr(error, "code", None) or getattr(error, "status", None)
    if (isinstance(error, PermissionError) or status in (401, 403)
            or text.startswith(("Forbidden", "Unauthorized")) or " 403" in text[:80]):
        return BertJaxError(f"{url}: permission denied by {endpoint()} (HTTP 403); check the "
                            "credentials of this machine and the bucket's permissions")
    if _is_connection_error(error):
        return BertJaxError(f"{url}: cannot reach the storage server {endpoint()} "
                            f"({type(error).__name__}: {text[:160]}); "
                            + ("check STORAGE_EMULATOR_HOST" if emulator_url()
                               else "check the network"))
    if isinstance(error, FileNotFoundError):
        return None
    return BertJaxError(f"{url}: storage request failed ({type(error).__name__}: {text[:200]})")


def _is_connection_error(error: BaseException) -> bool:
    names = {type(e).__name__ for e in _chain(error)}
    return bool(names & {"ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError",
                         "ConnectionRefusedError", "ConnectionError", "TimeoutError",
                         "ServerTimeoutError", "ClientOSError"})


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


@functools.cache
def _check_bucket(bucket: str) -> None:
    """Once per bucket and process: it exists and this machine may use it."""
    url = f"{GCS_SCHEME}{bucket}"
    client = _gcs()
    try:
        client.call("GET", "b/{}", bucket, json_out=True)
    except FileNotFoundError:
        raise BertJaxError(f"{url}: no such bucket at {endpoint()}; create it first "
                           f"(gcloud storage buckets create {url})") from None
    except Exception as e:  # noqa: BLE001 - every client failure becomes one line
        raise (_describe(url, e) or BertJaxError(f"{url}: no such bucket")) from None


@contextlib.contextmanager
def _remote(url: str) -> Iterator[Any]:
    """The client for ``url`` (its bucket checked), with failures turned into one line."""
    bucket, _ = _split(url)
    _check_bucket(bucket)
    try:
        yield _gcs()
    except (BertJaxError, FileNotFoundError, FileExistsError, IsADirectoryError,
            NotADirectoryError):
        raise
    except Exception as e:  # noqa: BLE001
        described = _describe(url, e)
        if described is None:
            raise
        raise described from None


def _key(url: str) -> str:
    return url[len(GCS_SCHEME):].rstrip("/")


def check_reachable(path: str) -> None:
    """For a URL: BertJaxError now if its bucket is missing, forbidden or unreachable."""
    if is_remote(path):
        _check_bucket(_split(path)[0])


# ---- queries --------------------------------------------------------------------------------
def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    with _remote(path) as fs:
        return fs.exists(_key(path))


def isdir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(path)
    bucket, key = _split(path)
    if not key:
        check_reachable(path)
        return True
    with _remote(path) as fs:
        if fs.isfile(_key(path)):
            return False
        try:
            return bool(fs.ls(_key(path) + "/", detail=False))
        except FileNotFoundError:
            return False


def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    with _remote(path) as fs:
        return fs.isfile(_key(path))


def getsize(path: str) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    with _remote(path) as fs:
        return int(fs.info(_key(path))["size"])


def info(path: str) -> dict[str, Any]:
    """size, mtime and (remote) the server's crc32c and generation of a file."""
    if not is_remote(path):
        st = os.stat(path)
        return {"size": st.st_size, "mtime": st.st_mtime}
    with _remote(path) as fs:
        meta = fs.info(_key(path))
    updated = meta.get("mtime")
    return {"size": int(meta["size"]), "mtime": updated.timestamp() if updated else 0.0,
            "crc32c": meta.get("crc32c"), "generation": meta.get("generation")}


def listdir(path: str) -> list[str]:
    """Names of the entries directly under ``path`` (files and sub-"directories")."""
    if not is_remote(path):
        return os.listdir(path)
    with _remote(path) as fs:
        try:
            entries = fs.ls(_key(path) + "/", detail=False)
        except FileNotFoundError:
            raise FileNotFoundError(2, "No such file or directory", path) from None
    prefix = _key(path) + "/"
    names = {e.rstrip("/")[len(prefix):] for e in entries if e.rstrip("/") != _key(path)}
    return sorted(n for n in names if n)


def walk(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` for both kinds: (directory, sub-directory names, file names), top down;
    callers may prune ``dirs`` in place."""
    if not is_remote(top):
        yield from os.walk(top)
        return
    with _remote(top) as fs:
        found = fs.find(_key(top), detail=False)
    root = _key(top)
    tree: dict[str, tuple[set[str], list[str]]] = {"": (set(), [])}
    for key in found:
        rel = key[len(root):].lstrip("/")
        if not rel:
            continue
        parts = rel.split("/")
        for depth in range(len(parts) - 1):
            parent = "/".join(parts[:depth])
            tree.setdefault(parent, (set(), []))[0].add(parts[depth])
            tree.setdefault("/".join(parts[:depth + 1]), (set(), []))
        tree.setdefault("/".join(parts[:-1]), (set(), []))[1].append(parts[-1])

    def visit(rel: str):
        dirs, files = tree[rel]
        dirs_list = sorted(dirs)
        yield (join(top, rel) if rel else top.rstrip("/")), dirs_list, sorted(files)
        for d in dirs_list:
            yield from visit(f"{rel}/{d}" if rel else d)

    yield from visit("")


def files_with_info(top: str) -> dict[str, dict[str, Any]]:
    """Every file under ``top`` by path relative to it (``/``-separated), with its size and,
    in a bucket, the server's CRC32C (one listing; nothing is downloaded)."""
    if not is_remote(top):
        out = {}
        for directory, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(directory, name)
                out[os.path.relpath(path, top).replace(os.sep, "/")] = {
                    "size": os.path.getsize(path)}
        return out
    with _remote(top) as fs:
        found = fs.find(_key(top), detail=True)
    root = _key(top) + "/"
    return {key[len(root):]: {"size": int(meta["size"]), "crc32c": meta.get("crc32c")}
            for key, meta in sorted(found.items())
            if key.startswith(root) and meta.get("type", "file") == "file"}


def move_tree(source: str, destination: str) -> None:
    """Moves a directory: a rename on local disk; in a bucket a server-side copy of every
    object, then the deletion of the originals (not atomic: an interruption leaves both)."""
    if not is_remote(source):
        os.replace(source, destination)
        return
    with _remote(source) as fs:
        keys = fs.find(_key(source), detail=False)
        root = _key(source) + "/"
        for key in keys:
            fs.copy(key, f"{_key(destination)}/{key[len(root):]}")
        if keys:
            fs.rm(keys)


def move(source: str, destination: str) -> None:
    """Moves a file or a directory (see :func:`move_tree`)."""
    if is_remote(source) and isfile(source):
        with _remote(source) as fs:
            fs.copy(_key(source), _key(destination))
            fs.rm_file(_key(source))
        return
    move_tree(source, destination)


def glob(pattern: str) -> list[str]:
    """Sorted paths matching ``pattern`` (``*``, ``?``, ``[...]`` within one path part)."""
    if not is_remote(pattern):
        import glob as globlib

        return sorted(globlib.glob(pattern))
    bucket, key = _split(pattern)
    base = key.split("*")[0].split("?")[0].split("[")[0]
    base = base.rsplit("/", 1)[0] if "/" in base else ""
    with _remote(pattern) as fs:
        found = fs.find(f"{bucket}/{base}" if base else bucket, detail=False)
    regex = re.compile(fnmatch.translate(f"{bucket}/{key}").replace(".*", "[^/]*"))
    return sorted(f"{GCS_SCHEME}{k}" for k in found if regex.match(k))


# ---- reading --------------------------------------------------------------------------------
class _RangeReader(io.RawIOBase):
    """An object read by ranged requests (:func:`read_range`), one per ``readinto``."""

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        if self.pos >= self.size:
            return 0
        data = read_range(self.url, self.pos, min(self.size, self.pos + len(buffer)))
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def open_read(path: str, *, block_size: int = 16 << 20) -> IO[bytes]:
    """A binary file object to read ``path``. In a bucket: buffered, each refill of the
    ``block_size`` buffer one ranged request, so small reads and line iteration cost no round
    trips of their own."""
    if not is_remote(path):
        return open(path, "rb")
    try:
        size = getsize(path)
    except FileNotFoundError:
        raise FileNotFoundError(2, "No such file or directory", path) from None
    return io.BufferedReader(_RangeReader(abspath(path), size), buffer_size=block_size)


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a file (fewer at its end): one ranged request in a bucket.
    Callers that stream a large object read it this way in large blocks: gcsfs's file objects
    make every small ``read`` a round trip to their event loop."""
    if not is_remote(path):
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))
    with _remote(path) as fs:
        return fs.cat_file(_key(path), start=start, end=end)


def read_bytes(path: str) -> bytes:
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    with _remote(path) as fs:
        try:
            return fs.cat_file(_key(path))
        except FileNotFoundError:
            raise FileNotFoundError(2, "No such file or directory", path) from None


def read_text(path: str, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


_LOCAL_COPIES: dict[str, str] = {}


def localize(path: str) -> str:
    """A local path holding ``path``'s contents: ``path`` itself when local; for a URL a
    read-only copy of the file or directory, downloaded once per process and removed at exit
    (for libraries that open files by name: SentencePiece, safetensors, TensorFlow)."""
    if not is_remote(path):
        return path
    url = abspath(path)
    if url in _LOCAL_COPIES:
        return _LOCAL_COPIES[url]
    root = tempfile.mkdtemp(prefix="bert-jax-remote-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    target = os.path.join(root, basename(url) or "root")
    if isfile(url):
        download(url, target)
    elif isdir(url):
        for directory, _, files in walk(url):
            for name in files:
                source = join(directory, name)
                download(source, os.path.join(target, *relpath(source, url).split("/")))
    else:
        raise FileNotFoundError(2, "No such file or directory", url)
    _LOCAL_COPIES[url] = target
    return target


def download(url: str, local_path: str) -> None:
    os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
    with _remote(url) as fs:
        fs.get_file(_key(url), local_path)


# ---- writing --------------------------------------------------------------------------------
def put_bytes(url: str, data: bytes, *, exclusive: bool = False) -> None:
    """Uploads ``data`` as one object (it appears whole or not at all). ``exclusive``: only if
    no object of that name exists (FileExistsError otherwise)."""
    with _remote(url) as fs:
        fs.pipe_file(_key(url), bytes(data), mode="create" if exclusive else "overwrite")


def upload(local_path: str, url: str) -> None:
    with _remote(url) as fs:
        fs.put_file(local_path, _key(url))


def makedirs(path: str) -> None:
    """Creates a local directory (and parents); a no-op for URLs (prefixes need no creation)
    beyond checking the bucket."""
    if is_remote(path):
        check_reachable(path)
    else:
        os.makedirs(check_local(path), exist_ok=True)


def remove(path: str) -> None:
    """Deletes one file (FileNotFoundError if missing)."""
    if not is_remote(path):
        os.remove(path)
        return
    with _remote(path) as fs:
        fs.rm_file(_key(path))


def rmtree(path: str) -> None:
    """Deletes a directory tree (or every object under a prefix); missing is fine."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    with _remote(path) as fs:
        keys = fs.find(_key(path), detail=False)
        if keys:
            fs.rm(keys)


def upload_tree(local_dir: str, url: str, *, exclude: str | None = None) -> list[str]:
    """Uploads every file under ``local_dir`` (but ``exclude``, a name relative to it) to the
    prefix ``url``; returns the relative names uploaded."""
    names = []
    for directory, dirs, files in os.walk(local_dir):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(directory, name), local_dir).replace(os.sep, "/")
            if rel != exclude:
                names.append(rel)
    if names:
        with _remote(url) as fs:
            fs.put([os.path.join(local_dir, *n.split("/")) for n in names],
                   [f"{_key(url)}/{n}" for n in names])
    return names


# ---- conditional writes (the workdir lock) -------------------------------------------------
@functools.cache
def _client():
    """google-cloud-storage, for the generation preconditions gcsfs does not expose."""
    from google.cloud import storage as gcs

    if emulator_url():
        from google.auth.credentials import AnonymousCredentials

        return gcs.Client(project="emulator", credentials=AnonymousCredentials())
    return gcs.Client()


def _blob(url: str):
    bucket, key = _split(url)
    _check_bucket(bucket)
    return _client().bucket(bucket).blob(key)


def write_if_generation(url: str, data: bytes, generation: int) -> int | None:
    """Uploads ``data`` only if the object's generation is ``generation`` (0: only if there
    is no such object); returns the new generation, or None when the precondition failed."""
    from google.api_core import exceptions

    blob = _blob(url)
    try:
        blob.upload_from_string(data, if_generation_match=generation)
    except exceptions.PreconditionFailed:
        return None
    except exceptions.GoogleAPICallError as e:
        raise _describe(url, e) or BertJaxError(f"{url}: {e}") from None
    return int(blob.generation)


def read_with_generation(url: str) -> tuple[bytes, int, float] | None:
    """(contents, generation, server time of the last update) or None if absent."""
    from google.api_core import exceptions

    bucket, key = _split(url)
    _check_bucket(bucket)
    try:
        blob = _client().bucket(bucket).get_blob(key)
        if blob is None:
            return None
        data = blob.download_as_bytes(if_generation_match=blob.generation)
    except (exceptions.NotFound, exceptions.PreconditionFailed):
        return None
    except exceptions.GoogleAPICallError as e:
        raise _describe(url, e) or BertJaxError(f"{url}: {e}") from None
    return data, int(blob.generation), blob.updated.timestamp() if blob.updated else 0.0


def delete_if_generation(url: str, generation: int) -> None:
    """Deletes the object if its generation is still ``generation``; otherwise leaves it."""
    from google.api_core import exceptions

    with contextlib.suppress(exceptions.NotFound, exceptions.PreconditionFailed):
        _blob(url).delete(if_generation_match=generation)


def sha256(path: str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open_read(path) as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
