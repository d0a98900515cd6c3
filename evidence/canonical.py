"""Canonical JSON and hashing.

A digest is only worth committing if anyone can recompute it, so every JSON document whose hash we
record is serialized one way: sorted keys, no insignificant whitespace, UTF-8, and no NaN/Infinity
(which JSON does not define and other parsers reject).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_bytes(obj: Any) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_sha256(obj: Any) -> str:
    return hashlib.sha256(canonical_bytes(obj)).hexdigest()


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write via a temporary file, fsync, then rename: readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, canonical: bool = False) -> str:
    """Write JSON atomically and return the sha256 of the bytes written.

    `canonical=True` writes the canonical form, so the file hash equals `canonical_sha256(obj)`.
    Otherwise the file is indented for people, with sorted keys so it is still deterministic.
    """
    if canonical:
        data = canonical_bytes(obj)
    else:
        data = (
            json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        ).encode("utf-8")
    write_bytes_atomic(path, data)
    return bytes_sha256(data)


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
