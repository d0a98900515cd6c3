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
from typing import TYPE_CHECKING, Any

from evidence.errors import UserError

if TYPE_CHECKING:  # the pool's module loads where a tree is hashed (`_pool`)
    from concurrent.futures import ThreadPoolExecutor

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


TREE_PIECE = 64 << 20  # bytes per leaf of a tree digest


def _hash_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _pool(workers: int, **options: Any) -> ThreadPoolExecutor:
    # start-up: concurrent.futures (and logging) ~10 ms of `python -m evidence`, paid only where a tree is hashed
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(workers, **options)


class TreeSha256:
    """sha256 over the concatenated sha256 digests of each `piece`-byte piece of a byte stream.

    One sha256 is sequential, and on some hosts' CPUs it runs slower than the disk a
    checkpoint is written to (bench/results/README.md, "Checkpoints"); pieces are hashed
    on several threads at once (hashlib releases the GIL). Anyone can recompute it: hash each piece,
    then hash the digests in order (`file_tree_sha256`).

    `update` queues the bytes and returns the futures that read them: the caller keeps the buffer
    unchanged until they are done. `hexdigest` waits for every queued piece."""

    def __init__(self, piece: int = TREE_PIECE, threads: int | None = None):
        self.piece = piece
        # one single-threaded queue per lane: a piece's updates stay in order on its lane
        self._lanes = [_pool(1, thread_name_prefix="sha256") for _ in range(threads or _hash_threads())]
        self._leaves: list[Any] = []
        self._pending: list[Any] = []
        self._pos = 0

    def update(self, data: Any) -> list[Any]:
        mv = memoryview(data).cast("B")
        futures = []
        while mv:
            i, off = divmod(self._pos, self.piece)
            if off == 0:
                self._leaves.append(hashlib.sha256())
            take = min(len(mv), self.piece - off)
            futures.append(self._lanes[i % len(self._lanes)].submit(self._leaves[i].update, mv[:take]))
            mv, self._pos = mv[take:], self._pos + take
        self._pending += futures
        return futures

    def hexdigest(self) -> str:
        for f in self._pending:
            f.result()
        self._pending = []
        top = hashlib.sha256()
        for leaf in self._leaves:
            top.update(leaf.digest())
        return top.hexdigest()

    def close(self) -> None:
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)


def file_tree_sha256(path: str | os.PathLike[str], piece: int = TREE_PIECE, threads: int | None = None) -> str:
    """`TreeSha256` of a file, its pieces read and hashed on several threads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n = os.fstat(fd).st_size

        def leaf(i: int) -> bytes:
            h, at, end = hashlib.sha256(), i * piece, min(n, (i + 1) * piece)
            while at < end:
                block = os.pread(fd, min(_CHUNK * 16, end - at), at)
                if not block:
                    raise OSError(f"{path}: shorter than its size while hashing")
                h.update(block)
                at += len(block)
            return h.digest()

        with _pool(threads or _hash_threads()) as pool:
            leaves = list(pool.map(leaf, range(-(-n // piece))))
    finally:
        os.close(fd)
    return hashlib.sha256(b"".join(leaves)).hexdigest()


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


def json_bytes(obj: Any) -> bytes:
    """JSON for people: indented, keys sorted (so still deterministic), a final newline."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, canonical: bool = False) -> str:
    """Write JSON atomically and return the sha256 of the bytes written.

    `canonical=True` writes the canonical form, so the file hash equals `canonical_sha256(obj)`.
    Otherwise the file is indented for people, with sorted keys so it is still deterministic.
    """
    data = canonical_bytes(obj) if canonical else json_bytes(obj)
    write_bytes_atomic(path, data)
    return bytes_sha256(data)


class EvidenceFileError(UserError, ValueError):
    """A file of evidence that is missing, cut short or not what it must be. The message names the
    file; whoever reads evidence refuses on it rather than guess (a rank exits with the refusal
    status, so it is not restarted into the same damage)."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # in C: a report parses hundreds of thousands of objects, nearly all without a repeat
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {k!r}")
            seen.add(k)
    return out


def parse_json(text: str | bytes, where: str) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate keys (a second value must not silently win)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise EvidenceFileError(f"{where}: damaged, not valid JSON ({e})") from None


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise EvidenceFileError(f"{path}: missing") from None
    except OSError as e:
        raise EvidenceFileError(f"{path}: cannot be read ({e.strerror or e})") from None


def read_json(path: str | os.PathLike[str], *, keys: tuple[str, ...] = (), kind: type | None = dict) -> Any:
    """The one reader of a JSON file of evidence (a home's, a host's, a store's): refuses, naming the
    file, when it is missing, unreadable, not strict JSON, not a `kind` (an object, by default) or
    lacks any of `keys` at its top level."""
    obj = parse_json(_read(path), str(path))
    if kind is not None and not isinstance(obj, kind):
        raise EvidenceFileError(f"{path}: damaged, holds a JSON {type(obj).__name__} where a "
                                f"{'object' if kind is dict else kind.__name__} belongs")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise EvidenceFileError(f"{path}: damaged, no {', '.join(map(repr, missing))} in it")
    return obj


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A JSON-lines file of evidence: one object per line, each read as `read_json` reads a file."""
    text = _read(path)
    rows = []
    for n, line in enumerate(text.split(b"\n"), 1):
        if not line.strip():
            if line or n < text.count(b"\n") + 1:  # only the final newline may leave an empty tail
                raise EvidenceFileError(f"{path}:{n}: damaged, an empty line")
            continue
        row = parse_json(line, f"{path}:{n}")
        if not isinstance(row, dict):
            raise EvidenceFileError(f"{path}:{n}: damaged, not a JSON object")
        rows.append(row)
    return rows
