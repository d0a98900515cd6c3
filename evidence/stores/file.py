"""`file://DIR`: a directory (the embedded default). Only the machine that holds it reads it, so
staging cannot relay through it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, ClassVar, Iterator
from urllib.parse import urlparse

from evidence.canonical import fsync_file, write_bytes_atomic
from evidence.stores.base import CHUNK


class FileStore:
    form: ClassVar[str] = "file://DIR"
    staging_relay: ClassVar[bool] = False

    def __init__(self, root: Path):
        self.root = root
        self.url = f"file://{root}/"

    @staticmethod
    def url_for(root: Path) -> str:
        """A directory as a store URL (the default store beside the trial homes)."""
        return f"file://{root}"

    @classmethod
    def from_url(cls, url: str, session: Any = None, **options: Any) -> "FileStore":
        u = urlparse(url)
        return cls(Path(u.netloc + u.path) if u.netloc else Path(u.path))

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        dst = self.root / key
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        shutil.copyfile(path, tmp)
        fsync_file(tmp)
        os.replace(tmp, dst)

    def put_bytes(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self.root / key, data)

    def size(self, key: str) -> int | None:
        p = self.root / key
        return p.stat().st_size if p.is_file() else None

    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (files being written, hidden or `.part`, left out)."""
        top = self.root / prefix
        base = top if prefix.endswith("/") or top.is_dir() else top.parent
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".part")
                      and str(p.relative_to(self.root)).startswith(prefix))

    def read_chunks(self, key: str) -> Iterator[bytes]:
        with open(self.root / key, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
