"""Benchmark: checkpoint write against the disk's sequential write rate, in one run.

    python bench/checkpoint_io.py [--gib 4] [--dir DIR] [--device cuda] [--out result.json]

Builds a state of `--gib` GiB of float32 tensors (on the GPU when --device cuda, like a rank's
training state), then times, alternately and `--repeats` times each:
  plain     write + fsync of as many bytes from one buffer (the disk's sequential rate here)
  reread    torch.save to a file, fsync, then sha256 by reading the file back (the first receipt path)
  hashed    training.checkpoint.state_file.save_hashed: raw tensor bytes through pinned buffers, a tree sha256
            on other threads while they are written, then fsync (what checkpoints use now)
and, first, this CPU's in-memory rates of one sha256 and of the tree digest (the hashing bound).
and prints each one's rate and its fraction of the plain rate (the issue's target: ≥ 80 %). Then the
restore side, from a save_hashed file evicted from the page cache before each read
(posix_fadvise DONTNEED, so the disk is read):
  verify_then_load   file_tree_sha256, then load_state (the restore path before 2026-12-01)
  load_checked       load_state(expect=receipt entry): the digest fed by the one read
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evidence.canonical import TreeSha256, file_sha256, file_tree_sha256  # noqa: E402
from training.checkpoint.disk_baseline import plain_write_seconds  # noqa: E402
from training.checkpoint.state_file import load_state, save_hashed  # noqa: E402


def reread(state: dict, path: Path) -> str:
    torch.save(state, path)
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())
    return file_sha256(path)


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (it was fsynced), so the next read goes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default="/tmp/checkpoint-io")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    per = 256 << 20  # 256 MiB tensors, like a large layer group
    count = max(1, int(args.gib * (1 << 30) // per))
    state = {"model": {f"t{i}": torch.randn(per // 4, device=args.device) for i in range(count)}}
    n = count * per
    buf = os.urandom(1 << 30)
    t0 = time.perf_counter()
    hashlib.sha256(buf).digest()
    hash_rates = {"sha256": len(buf) / (time.perf_counter() - t0)}
    t0 = time.perf_counter()
    tree = TreeSha256()
    tree.update(buf)
    tree.hexdigest()
    tree.close()
    hash_rates["tree_sha256"] = len(buf) / (time.perf_counter() - t0)
    del buf
    print("in-memory hashing: " + ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in hash_rates.items()))
    times: dict[str, list[float]] = {"plain": [], "reread": [], "hashed": []}
    sizes = {"plain": n}
    for _ in range(args.repeats):
        times["plain"].append(plain_write_seconds(d / "plain.bin", n))
        for name, fn in (("reread", lambda p: reread(state, p)), ("hashed", lambda p: save_hashed(state, p))):
            p = d / f"{name}.bin"
            t0 = time.perf_counter()
            fn(p)
            times[name].append(time.perf_counter() - t0)
            sizes[name] = p.stat().st_size
            p.unlink()
    p = d / "restore.bin"
    entry = save_hashed(state, p)
    restore: dict[str, list[float]] = {"verify_then_load": [], "load_checked": []}
    for _ in range(args.repeats):
        for name, fn in (("verify_then_load", lambda: (file_tree_sha256(p), load_state(p))),
                         ("load_checked", lambda: load_state(p, expect=entry))):
            evict(p)
            t0 = time.perf_counter()
            fn()
            restore[name].append(time.perf_counter() - t0)
    restore_bytes = p.stat().st_size
    p.unlink()
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: sizes[k] / v for k, v in med.items()}
    print(f"{n / 2**30:.2f} GiB from {args.device}, {args.repeats} repeats, median seconds: "
          + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    for k in ("reread", "hashed"):
        print(f"{k:7}: {rate[k] / 1e9:.2f} GB/s = {rate[k] / rate['plain']:.1%} of the plain "
              f"{rate['plain'] / 1e9:.2f} GB/s (target ≥ 80 %)")
    rmed = {k: statistics.median(v) for k, v in restore.items()}
    print("restore from disk, median seconds: " + ", ".join(
        f"{k} {v:.2f} ({restore_bytes / v / 1e9:.2f} GB/s)" for k, v in rmed.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": " ".join(sys.argv), "bytes": n, "device": args.device, "seconds": times,
            "median_seconds": med, "bytes_per_second": rate,
            "fraction_of_plain": {k: rate[k] / rate["plain"] for k in ("reread", "hashed")},
            "hash_bytes_per_second": hash_rates, "restore_seconds": restore,
            "restore_median_seconds": rmed, "restore_bytes": restore_bytes}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
