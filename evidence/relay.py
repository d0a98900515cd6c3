"""Staging's relay through the trial's bucket: the controller uploads each artifact once, the hosts
fetch it in region.

Staging over SSH sends every wheel and every seed file from the operator's machine once per host: for
the 1.7B study, four copies of a 6.8 GB seed through a home uplink. With a bucket, the controller puts
each artifact once under the trial's prefix, content-addressed (`staging/<sha256>`), read back and
checked by S3 on receipt (an object already there at its size is not sent again); every host then
fetches what it needs from there, all hosts at once, and hashes each file before it is put in place. A file that does not hash to what was staged is refused, naming the
object, and nothing is written in its place.

The host side is `python -m evidence.relay fetch --store URL --manifest FILE --root DIR`: stdlib and
boto3 only (through `evidence.stores`), so it runs from the project's own wheel before anything else is
installed — it never imports `orchestrate`, `infra` or `training`. On AWS it reads with the instance
role, which may read the trial's `staging/` objects and nothing else it did not write.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable

from evidence.canonical import file_sha256
from evidence.stores import PreservationError, Store, known_forms, open_store, staging_key


class RelayError(RuntimeError):
    """An artifact that does not arrive as it was staged, or a manifest that names a path outside the
    host's root; the message names the object or the path."""


def upload_once(store: Store, paths: Iterable[Path],
                say: Callable[[str], None] = lambda m: None) -> tuple[dict[Path, dict[str, Any]], int]:
    """Every path into the store once under `staging_key` of its sha256. Returns ({path: {"sha256",
    "size"}}, bytes uploaded now).

    Not read back here, unlike evidence: every host hashes each artifact before it takes its place
    (`_fetch_one`), which is the check that matters, and a read-back would bring every artifact (a
    6.85 GB seed at 1.7B) back down to the operator's machine on every run. S3 itself checks each
    part's SHA-256 on receipt (`put_file` asks for it). An object already there at the right size is
    not sent again; one at another size (a broken earlier upload) is replaced: staging objects are
    inputs, not evidence, and the key names the content they must have."""
    out: dict[Path, dict[str, Any]] = {}
    sent = 0
    for p in dict.fromkeys(paths):  # the same file named twice is one object
        digest, size = file_sha256(p), p.stat().st_size
        key = staging_key(digest)
        if store.size(key) != size:
            store.put_file(key, p, digest)
            sent += size
        out[p] = {"sha256": digest, "size": size}
    say(f"relay: {len(out)} artifact(s), {sum(f['size'] for f in out.values()) / 1e6:,.1f} MB in {store.url}staging/ "
        f"({sent / 1e6:,.1f} MB uploaded now; each host hashes what it fetches)")
    return out, sent


def _under(root: Path, rel: str) -> Path:
    """`root/rel`, refused unless `rel` is a plain relative path: a manifest never writes elsewhere."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or any(c in rel for c in "\0\n\r"):
        raise RelayError(f"the manifest names {rel!r}, which is not a path under {root}")
    return root / p


def _fetch_one(store: Store, root: Path, rel: str, f: dict[str, Any]) -> int:
    """One artifact to `root/rel`, hashed as it streams; 0 when a verified copy was there already."""
    dst = _under(root, rel)
    if dst.is_file() and dst.stat().st_size == f["size"] and file_sha256(dst) == f["sha256"]:
        return 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    key, tmp = staging_key(f["sha256"]), dst.with_name(dst.name + ".relay")
    try:
        h, n = hashlib.sha256(), 0
        with open(tmp, "wb") as out:
            for c in store.read_chunks(key):
                out.write(c)
                h.update(c)
                n += len(c)
        got = h.hexdigest()
    except Exception as e:  # noqa: BLE001 — missing, unreadable, no permission: the object named either way
        tmp.unlink(missing_ok=True)
        raise RelayError(f"{store.url}{key} ({rel}) cannot be read: {e}") from None
    if (got, n) != (f["sha256"], f["size"]):
        tmp.unlink(missing_ok=True)
        raise RelayError(f"{store.url}{key} reads as {got} ({n} bytes), staged as {f['sha256']} ({f['size']} bytes): "
                         f"refused, {rel} was not written")
    os.replace(tmp, dst)
    return n


def fetch(url: str, manifest: dict[str, dict[str, Any]], root: str | os.PathLike[str], *, workers: int = 4,
          session: Any = None) -> dict[str, int]:
    """On a host: every artifact of `manifest` ({path under root: {"sha256", "size"}}) from the store,
    a few at once, each hashed before it takes its place. Returns {"files", "fetched", "bytes"}."""
    root = Path(root)
    store = open_store(url, session)
    for rel in manifest:
        _under(root, rel)  # every path checked before anything is fetched
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="relay") as pool:
        got = list(pool.map(lambda kv: _fetch_one(store, root, *kv), sorted(manifest.items())))
    return {"files": len(manifest), "fetched": sum(1 for n in got if n), "bytes": sum(got)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evidence.relay", description="staging's relay, on a host")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="fetch and verify a manifest's artifacts from the trial's store")
    f.add_argument("--store", required=True, help=f"the trial's store, one of {known_forms()}")
    f.add_argument("--manifest", required=True, type=Path, help="JSON {path under root: {sha256, size}}")
    f.add_argument("--root", required=True, type=Path, help="the host's staging root")
    f.add_argument("--workers", type=int, default=4)
    args = ap.parse_args(argv)
    try:
        manifest = json.loads(args.manifest.read_text())
        if not isinstance(manifest, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("sha256"), str) and type(v.get("size")) is int
                and len(v["sha256"]) == 64 and all(c in "0123456789abcdef" for c in v["sha256"])
                for v in manifest.values()):
            raise RelayError(f"{args.manifest}: not a staging manifest ({{path: {{sha256, size}}}})")
        print(json.dumps(fetch(args.store, manifest, args.root, workers=args.workers)))
    except (RelayError, PreservationError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
