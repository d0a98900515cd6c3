"""One rank's `state.bin`: large tensors' raw bytes at page-aligned offsets behind a small pickled
skeleton, hashed as a tree digest while written and while read (see `save_hashed`)."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from evidence.canonical import TREE_PIECE, TreeSha256
from evidence.receipts import is_tree_entry
from training.checkpoint import _Ref
from training.errors import CheckpointError


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
