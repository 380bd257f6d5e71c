"""Reading user text files: UTF-8 by default, and one clear error for anything else.

An undecodable byte names the file, the byte offset and the line, and how to go on: pass
another encoding, or ``errors="replace"`` to replace undecodable bytes with U+FFFD (the
count is reported on stderr, never silent). A UTF-8 byte-order mark is dropped.
"""

from __future__ import annotations

import codecs
import io
import sys

from bert_jax import storage
from bert_jax.errors import BertJaxError

ERROR_MODES = ("strict", "replace")


def decode(raw: bytes, path: str, *, encoding: str = "utf-8", errors: str = "strict",
           hint: str = "") -> str:
    """``raw`` bytes of ``path`` -> text (see the module docstring)."""
    if errors not in ERROR_MODES:
        raise BertJaxError(f"encoding errors {errors!r}: expected one of {ERROR_MODES}")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise BertJaxError(f"{encoding!r}: unknown text encoding") from None
    if encoding.replace("-", "").lower() in ("utf8", "utf8sig") and raw.startswith(
            codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        if errors == "strict":
            line = raw.count(b"\n", 0, e.start) + 1
            raise BertJaxError(
                f"{path}: not {encoding} text (byte offset {e.start}, line {line}: {e.reason})"
                + (f"; {hint}" if hint else "")) from None
    text = raw.decode(encoding, errors="replace")
    replaced = text.count("\ufffd") - raw.decode(encoding, errors="ignore").count("\ufffd")
    print(f"warning: {path}: replaced {replaced} undecodable byte sequence(s) with U+FFFD",
          file=sys.stderr, flush=True)
    return text


def read_text(path: str, *, encoding: str = "utf-8", errors: str = "strict",
              hint: str = "") -> str:
    return decode(storage.read_bytes(path), path, encoding=encoding, errors=errors, hint=hint)


def open_text(path: str, *, encoding: str = "utf-8", errors: str = "strict",
              newline: str | None = None) -> io.StringIO:
    """The decoded file as an in-memory text stream (for csv and line readers)."""
    return io.StringIO(read_text(path, encoding=encoding, errors=errors), newline=newline)
