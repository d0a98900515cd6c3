"""File receipts: the sha256 and size of every file in a directory.

A receipt is what later stages verify before they trust a directory (a seed model, a checkpoint, a
prepared input set). Verification names the first file that is missing, altered or unexpected, so
the user knows what to restore.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from evidence.canonical import canonical_sha256, file_sha256, file_tree_sha256
from evidence.errors import UserError

RECEIPT_NAME = "receipt.json"


class ReceiptError(UserError, RuntimeError):
    """A directory does not match its receipt."""


def _walk(root: Path, exclude: Iterable[str]) -> list[str]:
    excluded = set(exclude)
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            rel = os.path.relpath(os.path.join(dirpath, fn), root).replace(os.sep, "/")
            if rel in excluded or fn.startswith("."):
                continue
            names.append(rel)
    return sorted(names)


def is_tree_entry(entry: dict[str, Any]) -> bool:
    """A receipt entry whose file is hashed as a tree: its digest and a usable piece size (what both
    `verify_receipt` and a reader that hashes while it reads need before they start)."""
    return (isinstance(entry.get("sha256_tree"), str) and isinstance(entry.get("piece_bytes"), int)
            and entry["piece_bytes"] > 0)


def make_receipt(
    root: str | os.PathLike[str], *, meta: dict[str, Any] | None = None, exclude: Iterable[str] = (),
    hashed: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Hash every regular file under `root` (hidden files and `exclude` left out).

    `hashed` gives the digest fields of files hashed as they were written (a checkpoint of
    gigabytes is then not read back a second time here): {"sha256": …}, or {"sha256_tree": …,
    "piece_bytes": …} for a `TreeSha256`; every other file is read and sha256-hashed."""
    root = Path(root)
    files = {}
    hashed = hashed or {}
    for rel in _walk(root, [RECEIPT_NAME, *exclude]):
        p = root / rel
        files[rel] = {**(hashed.get(rel) or {"sha256": file_sha256(p)}), "bytes": p.stat().st_size}
    receipt: dict[str, Any] = {"files": files, "meta": meta or {}}
    receipt["digest"] = receipt_digest(receipt)
    return receipt


def receipt_digest(receipt: dict[str, Any]) -> str:
    """The digest covers the file table and metadata, never itself."""
    return canonical_sha256({"files": receipt["files"], "meta": receipt.get("meta", {})})


def verify_receipt(
    root: str | os.PathLike[str],
    receipt: dict[str, Any],
    *,
    what: str = "directory",
    allow_extra: bool = False,
    exclude: Iterable[str] = (),
    defer: Iterable[str] = (),
) -> str:
    """Check `root` against `receipt`; return the receipt digest or raise naming the file.

    Files in `defer` are checked for presence and size only: the caller verifies their digest as
    it reads them (a checkpoint is then read once, not hashed and read again)."""
    defer = set(defer)
    root = Path(root)
    if receipt.get("digest") != receipt_digest(receipt):
        raise ReceiptError(f"{what} receipt {root / RECEIPT_NAME} is internally inconsistent (digest mismatch)")
    for rel, entry in receipt["files"].items():
        p = root / rel
        if not p.is_file():
            raise ReceiptError(f"{what} file missing: {p} (listed in its receipt)")
        size = p.stat().st_size
        if size != entry["bytes"]:
            raise ReceiptError(
                f"{what} file altered: {p} has {size} bytes, receipt says {entry['bytes']}"
            )
        kind = "sha256_tree" if "sha256_tree" in entry else "sha256"
        if kind == "sha256_tree" and not is_tree_entry(entry):
            raise ReceiptError(f"{what} receipt entry for {p} has no valid piece_bytes: {entry.get('piece_bytes')!r}")
        if rel in defer:
            continue
        digest = file_tree_sha256(p, entry["piece_bytes"]) if kind == "sha256_tree" else file_sha256(p)
        if digest != entry[kind]:
            raise ReceiptError(
                f"{what} file altered: {p} {kind} {digest[:16]}… differs from receipt "
                f"{entry[kind][:16]}…"
            )
    if not allow_extra:
        extra = sorted(set(_walk(root, [RECEIPT_NAME, *exclude])) - set(receipt["files"]))
        if extra:
            raise ReceiptError(f"{what} has files its receipt does not list: {root / extra[0]}")
    return receipt["digest"]
