"""The ranks' checkpoint protocol: publish a step every rank holds, agree on one, restore it.

Publishing a step: each rank writes and fsyncs its state in a hidden directory, receipts it, renames
it into place; the ranks all-gather their receipt digests (32 raw bytes each); each rank writes the
same manifest; a final all-reduce confirms every rank wrote it. A crash anywhere before the last
manifest leaves that step unpublished on some rank, so restart never picks it.

Restart: every rank all-gathers the digests of the manifests it holds; the group resumes from the
latest step whose manifest is identical on every rank. Each rank then checks that the manifest's
entry for *its* rank is the receipt it finds on disk, and re-hashes state.bin as it reads it: the
digest is compared before anything read is unpickled or used.
A missing or corrupt file stops the group with a message naming the rank and the file; an older
checkpoint is never substituted silently. Checkpoints and manifests after the chosen step are moved
to `orphaned/attempt-<n>/`, never deleted.

The rank is part of the receipt (so another rank's optimizer state cannot be restored in its place);
the hostname is not (so an identical replacement host restores the same rank). Where the files lie:
`training.runs`.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

import torch

from evidence.canonical import fsync_dir, read_json, write_json_atomic
from evidence.receipts import ReceiptError, make_receipt, verify_receipt
from training.checkpoint.state_file import load_state, save_hashed
from training.comm import gather_rows
from training.errors import CheckpointError
from training.runs import STATE, checkpoint_dir, latest_common, local_manifests, manifest_path, orphan_after
from training.trainer import all_or_none

FORMAT = "trial-checkpoint-v2"  # v2: state.bin written by save_hashed (v1: a torch.save zip)


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
    receipt = make_receipt(tmp, meta={"format": FORMAT, **identity, "step": step},
                           exclude=["host.json"], hashed={STATE: save_hashed(state, tmp / STATE)})
    write_json_atomic(tmp / "receipt.json", receipt)
    write_json_atomic(tmp / "host.json", {"hostname": socket.gethostname(), "pid": os.getpid()})  # fsyncs tmp
    tmp.rename(final)
    fsync_dir(final.parent)
    return {"step": step, "receipt_digest": receipt["digest"], "bytes": (final / STATE).stat().st_size,
            "seconds": time.perf_counter() - t0}


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
    manifest = read_json(mpath, keys=("format", "step", "world_size", "ranks"))
    try:
        entries = {e["rank"]: e["receipt_digest"] for e in manifest["ranks"]}
    except (TypeError, KeyError):
        raise CheckpointError(f"rank {rank}: {mpath} is damaged (its ranks table)") from None
    if (manifest["format"], manifest["step"], manifest["world_size"]) != (FORMAT, step, len(entries)):
        raise CheckpointError(f"rank {rank}: {mpath} is damaged: it says format {manifest['format']!r}, step "
                              f"{manifest['step']!r}, {manifest['world_size']!r} ranks with {len(entries)} receipts")
    cdir = checkpoint_dir(rank_dir, step)
    rpath = cdir / "receipt.json"
    if not rpath.is_file():
        raise CheckpointError(f"rank {rank}: {rpath} is missing (manifest {mpath} names it); "
                              "restore that rank's checkpoint files — no other step is substituted")
    receipt = read_json(rpath)
    if receipt.get("meta", {}).get("format") != FORMAT:
        raise CheckpointError(f"rank {rank}: {cdir} is a {receipt.get('meta', {}).get('format')!r} checkpoint; "
                              f"this version reads {FORMAT!r} only — resume it with the version that wrote it")
    owner = receipt.get("meta", {}).get("rank")
    if owner != rank:
        raise CheckpointError(f"rank {rank}: {cdir} holds rank {owner}'s checkpoint; a rank restores "
                              "only its own state — check which directory each rank was given")
    if receipt.get("digest") != entries.get(rank):
        raise CheckpointError(f"rank {rank}: {rpath} has digest {receipt.get('digest')}, but manifest "
                              f"{mpath} names {entries.get(rank)} for rank {rank}")
    meta = receipt.get("meta", {})
    differ = sorted(k for k, v in manifest.items() if k not in ("ranks", "world_size") and meta.get(k) != v)
    if differ:  # the run's identity, once in the manifest and once in the receipt it names
        raise CheckpointError(f"rank {rank}: {mpath} and {rpath} disagree on {', '.join(differ)}: one of them "
                              "is damaged or from another run")
    try:  # state.bin's digest is checked as it is loaded: one read of ~20 GB, not two
        verify_receipt(cdir, receipt, what=f"rank {rank} checkpoint", exclude=["host.json"], defer=[STATE])
        state = load_state(cdir / STATE, expect=receipt["files"][STATE])
    except (ReceiptError, CheckpointError) as e:
        raise CheckpointError(f"rank {rank}: {e}; no other step is substituted") from None
    return state, manifest


def publish(trainer: Any, rank_dir: Path, step: int, identity: dict[str, Any], device: Any,
            before_manifest: Callable[[], None] | None = None) -> dict[str, Any]:
    """Write this rank's state, exchange receipt digests, write the common manifest, confirm.

    `before_manifest` runs after the digests are exchanged and before this rank's manifest is
    written: where a fault injection kills a rank mid-publication."""
    t0 = time.perf_counter()
    with all_or_none(f"writing checkpoint step {step}", device):
        fig = write_rank_state(rank_dir, step, trainer.state(), identity)
    digests = [r.hex() for r in gather_rows(bytes.fromhex(fig["receipt_digest"]), device)]
    common = {k: identity[k] for k in ("experiment", "profile", "arm", "prepared_digest",
                                       "numerical_profile")}
    if before_manifest is not None:
        before_manifest()
    with all_or_none(f"publishing the step {step} manifest", device):
        write_manifest(rank_dir, step, digests, common)
    fig["publish_seconds"] = time.perf_counter() - t0
    return fig


def restore(trainer: Any, rank_dir: Path, rank: int, updates: int, device: Any,
            say: Callable[[str], None]) -> dict[str, Any]:
    """Resume from the latest step every rank holds an identical manifest for (or stop, naming why)."""
    t0 = time.perf_counter()
    # every step, not only the interval's: a home stopped under another interval (a default that changed, a
    # profile edited since) still resumes from what its ranks published — the manifests decide, not the profile
    candidates = list(range(1, updates + 1))
    step = common_step(rank_dir, candidates, device)
    with all_or_none("verifying the checkpoint to resume from", device):
        if step is None:
            raise CheckpointError(f"rank {rank}: no checkpoint step has an identical manifest on every "
                                  f"rank (this rank holds {sorted(local_manifests(rank_dir))}); nothing can be resumed")
        if step >= updates:
            raise CheckpointError(f"rank {rank}: the common manifest is the final step {step}; the run "
                                  "finished — its result files were lost after training, not resumable")
        state, _ = load_rank_state(rank_dir, step, rank)
    t_load = time.perf_counter() - t0
    trainer.load_state(state, warm_ddp=not trainer.spec.compile)  # under compile: compile_warm_up's pass
    orphans = orphan_after(rank_dir, step)
    size = (checkpoint_dir(rank_dir, step) / STATE).stat().st_size
    say(f"resumed from step {step} (common manifest on every rank); "
        f"{len(orphans)} later file(s) kept under orphaned/")
    return {"step": step, "bytes": size, "seconds": time.perf_counter() - t0,
            "verify_and_load_seconds": t_load, "orphaned": orphans}
