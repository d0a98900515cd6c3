"""Durable group checkpoints: per-rank state with receipts, then a manifest every rank holds.

Layout, per rank (each rank writes only under its own directory, so ranks on different hosts need
no shared filesystem):

    runs/<arm>/rank-<r>/checkpoints/step-000064/state.pt       this rank's whole training state
    runs/<arm>/rank-<r>/checkpoints/step-000064/receipt.json   sha256 of state.pt + (rank, step, …)
    runs/<arm>/rank-<r>/checkpoints/step-000064/host.json      hostname: recorded, not in the receipt
    runs/<arm>/rank-<r>/manifests/step-000064.json             every rank's receipt digest

Publishing a step: each rank writes and fsyncs its state in a hidden directory, receipts it, renames
it into place; the ranks all-gather their receipt digests (32 raw bytes each); each rank writes the
same manifest; a final all-reduce confirms every rank wrote it. A crash anywhere before the last
manifest leaves that step unpublished on some rank, so restart never picks it.

Restart: every rank all-gathers the digests of the manifests it holds; the group resumes from the
latest step whose manifest is identical on every rank. Each rank then checks that the manifest's
entry for *its* rank is the receipt it finds on disk, re-hashes the files, and only then loads them.
A missing or corrupt file stops the group with a message naming the rank and the file; an older
checkpoint is never substituted silently. Checkpoints and manifests after the chosen step are moved
to `orphaned/attempt-<n>/`, never deleted.

The rank is part of the receipt (so another rank's optimizer state cannot be restored in its place);
the hostname is not (so an identical replacement host restores the same rank).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from evidence.attempts import next_attempt
from evidence.canonical import fsync_dir, read_json, write_json_atomic
from evidence.receipts import ReceiptError, make_receipt, verify_receipt
from training.errors import TrainError
from training.runs import latest_common, local_manifests

FORMAT = "trial-checkpoint-v1"
STATE = "state.pt"


class CheckpointError(TrainError):
    """A checkpoint or manifest that cannot be used; the message names rank and file."""


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_dir(rank_dir: Path, step: int) -> Path:
    return rank_dir / "checkpoints" / step_name(step)


def manifest_path(rank_dir: Path, step: int) -> Path:
    return rank_dir / "manifests" / f"{step_name(step)}.json"


def write_rank_state(rank_dir: Path, step: int, state: dict[str, Any], identity: dict[str, Any]
                     ) -> dict[str, Any]:
    """Write, fsync and receipt this rank's state for `step`; returns figures and the receipt."""
    t0 = time.perf_counter()
    final = checkpoint_dir(rank_dir, step)
    tmp = final.parent / f".{final.name}.partial"
    if final.exists():
        raise CheckpointError(f"rank {identity['rank']}: {final} already exists; a published step is "
                              "never overwritten")
    if tmp.exists():  # a crash mid-write left it; nothing refers to it, but it is kept, not deleted
        stale = rank_dir / "orphaned" / f"partial-{time.time_ns()}"
        stale.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(stale)
    tmp.mkdir(parents=True)
    digest = save_hashed(state, tmp / STATE)
    receipt = make_receipt(tmp, meta={"format": FORMAT, **identity, "step": step},
                           exclude=["host.json"], hashed={STATE: digest})
    write_json_atomic(tmp / "receipt.json", receipt)
    write_json_atomic(tmp / "host.json", {"hostname": socket.gethostname(), "pid": os.getpid()})  # fsyncs tmp
    tmp.rename(final)
    fsync_dir(final.parent)
    return {"step": step, "receipt_digest": receipt["digest"], "bytes": (final / STATE).stat().st_size,
            "seconds": time.perf_counter() - t0}


class _HashingWriter:
    """A file that hashes what passes through it: sha256 runs on a second thread over the same
    buffer while this one writes it (both release the GIL), so hashing adds little to the write."""

    def __init__(self, fh: Any, pool: Any):
        import hashlib

        self.fh, self.pool, self.h = fh, pool, hashlib.sha256()

    def write(self, b: Any) -> int:
        pending = self.pool.submit(self.h.update, b)
        try:
            n = self.fh.write(b)
        except BaseException:
            pending.exception()  # wait (the buffer must outlive the hash), keep the write's error
            raise
        pending.result()  # torch may reuse the buffer once write returns
        return n

    def flush(self) -> None:
        self.fh.flush()

    def seek(self, *_: Any) -> int:
        # torch.save seeks only when skipping tensor data; then the hash would not be the file's
        raise OSError("a hashed checkpoint is written front to back; seeking would unpin its sha256")


def save_hashed(obj: Any, path: Path) -> str:
    """torch.save `obj` to `path`, fsync it, and return the sha256 of the bytes written, without
    reading the file back (a 1.7B model's training state is ~20 GB per rank)."""
    from concurrent.futures import ThreadPoolExecutor

    crc = torch.serialization.get_crc32_options()
    # the zip records' CRC32 is a second checksum pass over every byte; the sha256 taken here (and
    # re-checked before any load) already covers them, and torch.load reads CRC-less files
    torch.serialization.set_crc32_options(False)
    try:
        with open(path, "wb") as fh, ThreadPoolExecutor(1, thread_name_prefix="sha256") as pool:
            w = _HashingWriter(fh, pool)
            torch.save(obj, w)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        torch.serialization.set_crc32_options(crc)
    return w.h.hexdigest()


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


def write_manifest(rank_dir: Path, step: int, digests: list[str], common: dict[str, Any]) -> str:
    """The manifest is identical on every rank: step, every rank's receipt digest, run identity."""
    body = {"format": FORMAT, "step": step, "world_size": len(digests),
            "ranks": [{"rank": r, "receipt_digest": d} for r, d in enumerate(digests)], **common}
    path = manifest_path(rank_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(path, body, canonical=True)  # atomic and fsynced; the hash of what it wrote


def common_step(rank_dir: Path, candidates: list[int], device: torch.device) -> int | None:
    """`latest_common` over every rank's manifests among `candidates`.

    One fixed-size all-gather: for each candidate step, 32 bytes (zeros where absent).
    """
    from training.comm import gather_rows

    mine = local_manifests(rank_dir)
    row = b"".join(bytes.fromhex(mine[s]) if s in mine else bytes(32) for s in candidates)
    held = []
    for got in gather_rows(row, device):
        cells = {s: got[i * 32:(i + 1) * 32] for i, s in enumerate(candidates)}
        held.append({s: c.hex() for s, c in cells.items() if c != bytes(32)})
    return latest_common(held)


def load_rank_state(rank_dir: Path, step: int, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify this rank's checkpoint for `step` against the common manifest, then load it."""
    mpath = manifest_path(rank_dir, step)
    manifest = read_json(mpath)
    entries = {e["rank"]: e["receipt_digest"] for e in manifest["ranks"]}
    cdir = checkpoint_dir(rank_dir, step)
    rpath = cdir / "receipt.json"
    if not rpath.is_file():
        raise CheckpointError(f"rank {rank}: {rpath} is missing (manifest {mpath} names it); "
                              "restore that rank's checkpoint files — no other step is substituted")
    receipt = read_json(rpath)
    owner = receipt.get("meta", {}).get("rank")
    if owner != rank:
        raise CheckpointError(f"rank {rank}: {cdir} holds rank {owner}'s checkpoint; a rank restores "
                              "only its own state — check which directory each rank was given")
    if receipt.get("digest") != entries.get(rank):
        raise CheckpointError(f"rank {rank}: {rpath} has digest {receipt.get('digest')}, but manifest "
                              f"{mpath} names {entries.get(rank)} for rank {rank}")
    try:
        verify_receipt(cdir, receipt, what=f"rank {rank} checkpoint", exclude=["host.json"])
    except ReceiptError as e:
        raise CheckpointError(f"rank {rank}: {e}; no other step is substituted") from None
    state = torch.load(cdir / STATE, map_location="cpu", weights_only=False)  # hash-verified above
    return state, manifest


def orphan_after(rank_dir: Path, step: int) -> list[str]:
    """Move checkpoints and manifests beyond `step` to orphaned/attempt-<n>/ (kept, not deleted)."""
    later = [p for p in (rank_dir / "checkpoints").glob("*step-*") if _step_of(p) > step]
    later += [p for p in (rank_dir / "manifests").glob("step-*.json") if _step_of(p) > step]
    if not later:
        return []
    base = rank_dir / "orphaned"
    dest = base / f"attempt-{next_attempt(base)}"
    moved = []
    for p in later:
        d = dest / p.parent.name
        d.mkdir(parents=True, exist_ok=True)
        p.rename(d / p.name)
        moved.append(f"{p.parent.name}/{p.name}")
    return moved


def _step_of(p: Path) -> int:
    name = p.name.lstrip(".").removesuffix(".json").removesuffix(".partial")
    try:
        return int(name[5:])
    except ValueError:
        return -1


NUMERICAL_PARTS = ("update", "model", "optimizer", "rng", "outer", "powersgd")


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Tensor-content comparison of two rank states (never file hashes: torch.save's bytes are not
    canonical). Per part: tensors compared, elements, max |Δ|, and any non-tensor leaf that differs.
    Timing records (journal, ledger) are not numerical state and are left out."""
    import numpy as np

    out: dict[str, Any] = {}
    for part in NUMERICAL_PARTS:
        acc = {"tensors": 0, "elements": 0, "max_abs_diff": 0.0, "mismatches": []}

        def walk(x: Any, y: Any, path: str) -> None:
            if torch.is_tensor(x) or isinstance(x, np.ndarray):
                tx = torch.as_tensor(x).detach().cpu()
                ty = torch.as_tensor(y).detach().cpu() if (torch.is_tensor(y) or
                                                            isinstance(y, np.ndarray)) else None
                if ty is None or tx.shape != ty.shape or tx.dtype != ty.dtype:
                    acc["mismatches"].append(f"{path}: shape/dtype/type differs")
                    return
                acc["tensors"] += 1
                acc["elements"] += tx.numel()
                if tx.numel():
                    fx, fy = tx.to(torch.float64), ty.to(torch.float64)
                    same_nan = torch.isnan(fx) & torch.isnan(fy)
                    diff = (fx - fy).abs().masked_fill(same_nan, 0.0)
                    if torch.isnan(diff).any():  # NaN on one side only: never "identical"
                        acc["mismatches"].append(f"{path}: NaN on one side")
                        diff = diff.nan_to_num(nan=float("inf"))
                    d = diff.max().item()
                    if d == 0.0 and not torch.equal(tx.view(-1).view(torch.uint8) if tx.is_floating_point()
                                                    else tx, ty.view(-1).view(torch.uint8)
                                                    if ty.is_floating_point() else ty):
                        acc["mismatches"].append(f"{path}: bitwise different (e.g. -0.0)")
                    acc["max_abs_diff"] = max(acc["max_abs_diff"], d)
            elif isinstance(x, dict):
                if not isinstance(y, dict) or set(x) != set(y):
                    acc["mismatches"].append(f"{path}: keys differ")
                    return
                for k in x:
                    walk(x[k], y[k], f"{path}/{k}")
            elif isinstance(x, (list, tuple)):
                if not isinstance(y, (list, tuple)) or len(x) != len(y):
                    acc["mismatches"].append(f"{path}: length differs")
                    return
                for i, (xi, yi) in enumerate(zip(x, y)):
                    walk(xi, yi, f"{path}/{i}")
            elif hasattr(x, "get_state") and hasattr(y, "get_state"):  # numpy RandomState
                walk(x.get_state(), y.get_state(), f"{path}/state")
            elif x != y:
                acc["mismatches"].append(f"{path}: {x!r} != {y!r}")

        walk(a.get(part), b.get(part), part)
        out[part] = acc
    out["max_abs_diff"] = max(v["max_abs_diff"] for v in out.values() if isinstance(v, dict))
    out["identical"] = out["max_abs_diff"] == 0.0 and not any(
        v["mismatches"] for v in out.values() if isinstance(v, dict))
    return out
