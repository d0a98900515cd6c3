"""Evidence stores and preservation: every file of a trial home, content-addressed, each object read
back from the store and re-hashed after upload, then an index of what was preserved.

    <store>/objects/sha256/<first two hex>/<digest>     the bytes; the key is their sha256
    <store>/indexes/<trial>/<utc time>.json              {"files": {relative path: {"sha256", "size"}}, ...}

Two stores behind one interface: `file://DIR` (the embedded default) and `s3://BUCKET/PREFIX` (boto3
with s3transfer: multipart above 64 MiB, a SHA-256 checksum sent with every upload). A store's echo
of a checksum is not trusted — moto, for one, accepts and echoes a wrong one — so preservation
streams every object back and hashes what it reads. An index is written only after every object
verified, and is itself read back. `verify_index` repeats the whole read-back later (teardown does).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from evidence.canonical import (bytes_sha256, canonical_bytes, file_sha256, fsync_file, write_bytes_atomic,
                                write_json_atomic)

CHUNK = 1 << 20
PRESERVED = "preserved.json"  # in the home: where its evidence went, and the index's digest


class PreservationError(RuntimeError):
    """An object or index that does not read back as written, or a store that cannot be used."""


def _hash_stream(chunks: Iterator[bytes]) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for c in chunks:
        h.update(c)
        n += len(c)
    return h.hexdigest(), n


class FileStore:
    def __init__(self, root: Path):
        self.root = root
        self.url = f"file://{root}/"

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        dst = self.root / key
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        shutil.copyfile(path, tmp)
        fsync_file(tmp)
        os.replace(tmp, dst)

    def put_bytes(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self.root / key, data)

    def exists(self, key: str) -> bool:
        return (self.root / key).is_file()

    def read_chunks(self, key: str) -> Iterator[bytes]:
        with open(self.root / key, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk


class S3Store:
    def __init__(self, bucket: str, prefix: str, session: Any = None, multipart_mb: int = 64):
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.bucket, self.prefix = bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self.s3 = (session or boto3.Session()).client("s3")
        self.transfer = TransferConfig(multipart_threshold=multipart_mb << 20,
                                       multipart_chunksize=multipart_mb << 20)

    def _key(self, key: str) -> str:
        return self.prefix + key

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        self.s3.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer,
                            ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": sha256}})

    def put_bytes(self, key: str, data: bytes) -> None:
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        self.s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, ChecksumSHA256=digest)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def read_chunks(self, key: str) -> Iterator[bytes]:
        body = self.s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        try:
            while chunk := body.read(CHUNK):
                yield chunk
        finally:
            body.close()


def open_store(url: str, session: Any = None, **s3_options: Any) -> FileStore | S3Store:
    u = urlparse(url)
    if u.scheme == "file":
        return FileStore(Path(u.netloc + u.path) if u.netloc else Path(u.path))
    if u.scheme == "s3":
        if not u.netloc:
            raise PreservationError(f"{url}: an s3 URL names a bucket (s3://BUCKET/PREFIX)")
        return S3Store(u.netloc, u.path, session, **s3_options)
    raise PreservationError(f"unknown evidence store '{url}' (file://DIR or s3://BUCKET/PREFIX)")


def object_key(sha256: str) -> str:
    return f"objects/sha256/{sha256[:2]}/{sha256}"


def _files(home: Path) -> list[Path]:
    """Every regular file of the home except the preservation record itself (it names the index)."""
    return sorted(p for p in home.rglob("*") if p.is_file() and not p.is_symlink() and p.name != PRESERVED)


def _read_back(store: Any, key: str, sha256: str, size: int) -> None:
    got, n = _hash_stream(store.read_chunks(key))
    if (got, n) != (sha256, size):
        raise PreservationError(f"{store.url}{key} reads back as {got} ({n} bytes), written as {sha256} "
                                f"({size} bytes): the store does not hold what was uploaded")


def preserve(home: str | os.PathLike[str], url: str | FileStore | S3Store, *, trial: str, session: Any = None,
             say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Upload every file of `home` (skipping objects the store already holds and that read back
    right), verify each, then write and verify the index; record it in <home>/preserved.json."""
    home = Path(home)
    store = open_store(url, session) if isinstance(url, str) else url
    files, total = {}, 0
    paths = _files(home)
    for i, p in enumerate(paths, 1):
        digest, size = file_sha256(p), p.stat().st_size
        key = object_key(digest)
        uploaded = False
        if not store.exists(key):
            store.put_file(key, p, digest)
            uploaded = True
        _read_back(store, key, digest, size)  # uploaded now or earlier: either way it must read back
        files[str(p.relative_to(home))] = {"sha256": digest, "size": size}
        total += size if uploaded else 0
        if i % 50 == 0 or i == len(paths):
            say(f"preserved {i}/{len(paths)} files ({total / 1e6:,.1f} MB uploaded this time)")
    at = _dt.datetime.now(_dt.timezone.utc)
    index = {"format": "trial-evidence-index-v1", "trial": trial, "store": store.url,
             "at": at.isoformat(), "files": files, "bytes": sum(f["size"] for f in files.values())}
    body = canonical_bytes(index)
    digest = bytes_sha256(body)
    key = f"indexes/{trial}/{at.strftime('%Y%m%dT%H%M%S%fZ')}.json"
    store.put_bytes(key, body)
    _read_back(store, key, digest, len(body))
    record = {"store": store.url, "index": key, "index_sha256": digest, "files": len(files),
              "bytes": index["bytes"], "uploaded_bytes": total, "at": index["at"]}
    write_json_atomic(home / PRESERVED, record)
    return record


def verify_index(url: str, key: str, sha256: str, *, session: Any = None,
                 say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Re-read the index and every object it names from the store; raise on the first mismatch."""
    store = open_store(url, session)
    body = b"".join(store.read_chunks(key))
    if bytes_sha256(body) != sha256:
        raise PreservationError(f"{store.url}{key}: the index differs from the one recorded ({sha256})")
    index = json.loads(body)
    for i, (rel, f) in enumerate(sorted(index["files"].items()), 1):
        try:
            _read_back(store, object_key(f["sha256"]), f["sha256"], f["size"])
        except PreservationError as e:
            raise PreservationError(f"{rel}: {e}") from None
        except Exception as e:  # noqa: BLE001 — a missing object is as bad as a wrong one
            raise PreservationError(f"{rel}: object {object_key(f['sha256'])} cannot be read: {e}") from None
        if i % 200 == 0:
            say(f"verified {i}/{len(index['files'])} objects")
    return {"index": key, "files": len(index["files"]), "bytes": index["bytes"]}
