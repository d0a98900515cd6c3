"""Durable group checkpoints: per-rank state with receipts, then a manifest every rank holds.

Layout, per rank (each rank writes only under its own directory, so ranks on different hosts need
no shared filesystem):

    runs/<arm>/rank-<r>/checkpoints/step-000064/state.bin      this rank's whole training state
    runs/<arm>/rank-<r>/checkpoints/step-000064/receipt.json   tree sha256 of state.bin + (rank, step, …)
    runs/<arm>/rank-<r>/checkpoints/step-000064/host.json      hostname: recorded, not in the receipt
    runs/<arm>/rank-<r>/manifests/step-000064.json             every rank's receipt digest

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
the hostname is not (so an identical replacement host restores the same rank).
"""

from __future__ import annotations

import copy
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from evidence.attempts import next_attempt
from evidence.canonical import fsync_dir, read_json, write_json_atomic
from evidence.receipts import ReceiptError, make_receipt, verify_receipt
from training.arms import CHECKPOINT_PARTS
from training.errors import TrainError
from training.runs import latest_common, local_manifests

FORMAT = "trial-checkpoint-v2"  # v2: state.bin written by save_hashed (v1: a torch.save zip)
STATE = "state.bin"


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
    receipt = make_receipt(tmp, meta={"format": FORMAT, **identity, "step": step},
                           exclude=["host.json"], hashed={STATE: save_hashed(state, tmp / STATE)})
    write_json_atomic(tmp / "receipt.json", receipt)
    write_json_atomic(tmp / "host.json", {"hostname": socket.gethostname(), "pid": os.getpid()})  # fsyncs tmp
    tmp.rename(final)
    fsync_dir(final.parent)
    return {"step": step, "receipt_digest": receipt["digest"], "bytes": (final / STATE).stat().st_size,
            "seconds": time.perf_counter() - t0}


class _Ref:
    """Where a large tensor stood in the state: the index of its entry in the file's table."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self) -> tuple:
        return (_Ref, (self.index,))


def _map(obj: Any, leaf: Any) -> Any:
    """`obj` with `leaf` applied inside dicts (their type and attributes kept, e.g. a state_dict's
    `_metadata`), lists and plain tuples."""
    if isinstance(obj, dict):
        out = copy.copy(obj)
        for k, v in obj.items():
            out[k] = _map(v, leaf)
        return out
    if isinstance(obj, list):
        return [_map(v, leaf) for v in obj]
    if type(obj) is tuple:
        return tuple(_map(v, leaf) for v in obj)
    return leaf(obj)


def _strip(obj: Any, big: list[torch.Tensor]) -> Any:
    """`obj` with every tensor of at least INLINE_MAX bytes replaced by a _Ref; the same view reached
    twice (tied embeddings) is written once and shared again on load."""
    seen: dict[tuple, int] = {}

    def leaf(x: Any) -> Any:
        if not torch.is_tensor(x) or x.numel() * x.element_size() < INLINE_MAX:
            return x
        key = (x.device, x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape),
               tuple(x.stride()), x.dtype)
        if key not in seen:
            seen[key] = len(big)
            big.append(x.detach())
        return _Ref(seen[key])

    return _map(obj, leaf)


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    return _map(obj, lambda x: tensors[x.index] if isinstance(x, _Ref) else x)


MAGIC = b"TRIALCK2"
INLINE_MAX = 1 << 20  # smaller tensors (RNG states, step counters, norms) stay in the pickled skeleton
ALIGN = 4096          # each large tensor's bytes start on a page boundary
CHUNK = 64 << 20      # bytes per pinned staging slot and per write
SLOTS = 4             # device-to-host copies run this far ahead of the disk


def save_hashed(obj: Any, path: Path) -> dict[str, Any]:
    """Write `obj` to `path`, fsync it, and return its receipt digest fields (a `TreeSha256`:
    {"sha256_tree", "piece_bytes"}), without reading the file back (a 1.7B model's training state is
    ~20 GB per rank).

    torch.save reached about a third of the disk's rate: it copies each device storage to pageable
    memory and feeds a zip writer through Python. Here the large tensors' raw bytes go through a few
    reused pinned buffers instead: the device-to-host copy of one chunk overlaps the write of the
    previous one, and the tree digest's pieces are hashed on other threads over the same buffers
    while they are written (hashing and writing release the GIL). A single sha256 thread capped the
    write at ~0.8 GB/s on an H200 host whose disk takes 1.37 GB/s. Everything else (numbers, RNG
    states, small tensors, the layout of the dicts) is pickled by torch.save into a small header.
    Layout: MAGIC, two little-endian u64 lengths, the pickled skeleton, a JSON table of {dtype,
    shape, offset, nbytes}, then, from the first page boundary after it, each tensor's bytes at its
    page-aligned offset (counted from there). `load_state` reads it.

    What the training state holds round-trips exactly (tied tensors stay tied). Limits, for other
    uses: large tensors are found only inside dicts, lists and tuples (elsewhere they stay in the
    pickle); only identical views are shared again; an `nn.Parameter` comes back a plain tensor;
    a small view of a large storage pickles the whole storage.
    """
    import io
    import json
    import struct
    from concurrent.futures import Future, ThreadPoolExecutor

    from evidence.canonical import TREE_PIECE, TreeSha256

    big: list[torch.Tensor] = []
    skel = io.BytesIO()
    torch.save(_strip(obj, big), skel)
    table, at = [], 0
    for t in big:  # offsets count from the data region's start, so the table's length moves none
        n = t.numel() * t.element_size()
        table.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": at,
                      "nbytes": n})
        at = _aligned(at + n)
    tab = json.dumps(table).encode()
    head = MAGIC + struct.pack("<QQ", len(skel.getvalue()), len(tab)) + skel.getvalue() + tab
    data_start = _aligned(len(head))
    tree = TreeSha256(TREE_PIECE)
    writer = ThreadPoolExecutor(1, thread_name_prefix="write")
    fd = -1
    pos = 0

    def write_all(mv: memoryview) -> None:
        while mv:
            mv = mv[os.write(fd, mv):]

    def emit(data: Any, ready: Any = None) -> list[Future]:
        """Queue `data` for the file and the digest; the returned futures hold it until done."""
        nonlocal pos
        mv = memoryview(data).cast("B")
        pos += len(mv)
        if ready is not None:  # nothing may read the slot before its copy landed (~3 ms of ~50)
            ready.synchronize()
        return [*tree.update(mv), writer.submit(write_all, mv)]

    pending: list[Future] = []
    slots: list[torch.Tensor] = []
    busy: list[list[Future]] = []
    staged = 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pending += emit(head)
        for e, t in zip(table, big):
            pending += emit(bytes(data_start + e["offset"] - pos))  # zero padding to the entry
            # one tensor at a time: a non-contiguous or off-device tensor's copy lives only while written
            f = (t if t.device.type in ("cpu", "cuda") else t.cpu()).contiguous().view(-1).view(torch.uint8)
            if f.device.type == "cpu":  # written from where it lies (each numpy slice keeps f alive)
                arr = f.numpy()
                pending += [fut for off in range(0, f.numel(), CHUNK) for fut in emit(arr[off:off + CHUNK])]
                continue
            if not slots:
                slots = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(SLOTS)]
                busy = [[] for _ in range(SLOTS)]
            for off in range(0, f.numel(), CHUNK):
                k, staged = staged % SLOTS, staged + 1
                for fut in busy[k]:
                    fut.result()  # the slot's previous chunk is hashed and written (or its error raised)
                m = min(CHUNK, f.numel() - off)
                slots[k][:m].copy_(f[off:off + m], non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(f.device))
                busy[k] = emit(slots[k][:m].numpy(), ready=ready)
                pending += busy[k]
        for fut in pending:
            fut.result()
        os.fsync(fd)
        return {"sha256_tree": tree.hexdigest(), "piece_bytes": TREE_PIECE}
    finally:
        tree.close()
        writer.shutdown(wait=True, cancel_futures=True)
        if fd >= 0:
            os.close(fd)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def load_state(path: Path, expect: dict[str, Any] | None = None) -> Any:
    """Read a `save_hashed` file into CPU tensors.

    With `expect` (the file's receipt entry: `sha256_tree`, `piece_bytes`) every byte read is also
    fed to the tree digest, and a mismatch raises before the skeleton — a pickle — is unpickled: a
    restore reads its ~20 GB once instead of hashing it and then reading it again. Without it the
    caller must have verified the file already."""
    import io
    import struct

    from evidence.canonical import TreeSha256
    from evidence.receipts import is_tree_entry

    if expect is not None and not is_tree_entry(expect):
        raise CheckpointError(f"{path}: its receipt entry is not a tree digest: {sorted(expect)}")
    tree = TreeSha256(expect["piece_bytes"]) if expect is not None else None
    try:
        with open(path, "rb", buffering=0) as f:
            pos = 0

            def read_into(view: memoryview) -> None:
                """Fill `view` from the file and queue it for the digest (the tree holds the view,
                and so the buffer, until it is hashed)."""
                nonlocal pos
                got = 0
                while got < len(view):
                    n = f.readinto(view[got:])
                    if not n:
                        raise CheckpointError(f"{path}: ends at byte {pos + got}, inside what its header "
                                              f"describes")
                    got += n
                pos += got
                if tree is not None:
                    tree.update(view)

            def read(n: int) -> bytes:
                buf = bytearray(n)
                read_into(memoryview(buf))
                return bytes(buf)

            size = os.fstat(f.fileno()).st_size
            head = read(len(MAGIC) + 16)
            if head[:len(MAGIC)] != MAGIC:
                raise CheckpointError(f"{path}: not a checkpoint (starts with {head[:len(MAGIC)]!r})")
            n_skel, n_tab = struct.unpack("<QQ", head[len(MAGIC):])
            if pos + n_skel + n_tab > size:
                raise CheckpointError(f"{path}: its header claims {n_skel + n_tab} bytes; the file has {size}")
            skel = read(n_skel)
            data_start = _aligned(pos + n_tab)
            table = _checked_table(read(n_tab), data_start, size, path)
            tensors = []
            for e in table:
                read(data_start + e["offset"] - pos)  # the padding up to the entry (hashed too)
                raw = torch.empty(e["nbytes"], dtype=torch.uint8)
                view = memoryview(raw.numpy())
                for off in range(0, len(view), CHUNK):  # in pieces, so hashing follows the reads
                    read_into(view[off:off + CHUNK])
                tensors.append(raw.view(getattr(torch, e["dtype"])).view(e["shape"]))
            if tree is not None:
                while tail := f.read(CHUNK):  # nothing, for a file save_hashed wrote: hashed if there
                    pos += len(tail)
                    tree.update(tail)
                digest = tree.hexdigest()
                if digest != expect["sha256_tree"]:
                    raise CheckpointError(f"{path}: sha256_tree {digest[:16]}… differs from its receipt "
                                          f"{expect['sha256_tree'][:16]}… (file altered)")
    finally:
        if tree is not None:
            tree.close()
    return _fill(torch.load(io.BytesIO(skel), map_location="cpu", weights_only=False), tensors)


def _checked_table(raw: bytes, data_start: int, size: int, path: Path) -> list[dict[str, Any]]:
    """The tensor table, checked against the file and save_hashed's layout before anything is
    allocated from it (so padding stays under a page and no entry reaches past the file): when the
    digest is checked during the read, a damaged table is met before the digest can reject it."""
    import json
    import math

    try:
        table = json.loads(raw)
        at = 0  # where save_hashed put the entry: each at the page boundary after the last
        for e in table:
            dtype = getattr(torch, str(e["dtype"]), None)
            ok = (isinstance(dtype, torch.dtype) and e["offset"] == at and isinstance(e["nbytes"], int)
                  and all(isinstance(d, int) and d >= 0 for d in e["shape"])
                  and math.prod(e["shape"]) * dtype.itemsize == e["nbytes"] and data_start + at + e["nbytes"] <= size)
            if not ok:
                raise ValueError(e)
            at = _aligned(at + e["nbytes"])
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
        raise CheckpointError(f"{path}: its tensor table does not fit the file ({type(err).__name__}: "
                              f"{str(err)[:80]})") from None
    return table


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


NUMERICAL_PARTS = ("update", "model", "optimizer", "rng", *CHECKPOINT_PARTS)  # the arm kinds' extra states


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Tensor-content comparison of two rank states (never file hashes: the pickled skeleton's bytes are not
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
