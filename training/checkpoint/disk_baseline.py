"""The disk's own rate, measured in the same run, to set a checkpoint's write and restore against."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def plain_write_seconds(path: Path, n: int, block_bytes: int = 64 << 20) -> float:
    """Seconds to write `n` bytes sequentially from one buffer and fsync them, then remove the file:
    the disk's own rate, to set a checkpoint write against in the same run."""
    block = os.urandom(block_bytes)
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        left = n
        while left > 0:
            fh.write(block[:min(left, len(block))])
            left -= len(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


def io_baseline(rank_dir: Path, published: list[dict[str, Any]],
                restored: dict[str, Any] | None) -> dict[str, Any] | None:
    """Time a plain sequential write + fsync of as many bytes as one checkpoint, in this run.

    Only with TRIAL_IO_BASELINE=1 (the recovery trial and benchmarks set it): at 1.7B that is
    gigabytes per rank, which an ordinary run has no reason to write.

    The ratio of checkpoint write (and restore) time to this says what the checkpoint format,
    hashing and publication cost on top of the disk itself.
    """
    sizes = [c["bytes"] for c in published] or ([restored["bytes"]] if restored else [])
    if not sizes:
        return None
    n = max(sizes)
    plain = plain_write_seconds(rank_dir / ".plain-write.tmp", n)
    out: dict[str, Any] = {"plain_write_bytes": n, "plain_write_seconds": plain}
    if published:
        w = sum(c["seconds"] for c in published) / len(published)
        p = sum(c["publish_seconds"] for c in published) / len(published)
        out.update(checkpoint_write_seconds_mean=w, checkpoint_publish_seconds_mean=p,
                   write_over_plain=w / plain if plain else None,
                   publish_over_plain=p / plain if plain else None)
    if restored:
        out.update(restore_seconds=restored["seconds"],
                   restore_over_plain=restored["seconds"] / plain if plain else None)
    return out
