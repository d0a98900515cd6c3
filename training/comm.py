"""Collectives the arms use, and a ledger of the logical bytes every collective carried.

Logical payload is what the algorithm hands to a collective (bytes of the tensor reduced or
gathered), measured where the call is made rather than estimated from the model size, so a
compressing hook (PowerSGD) is counted by what it actually sent. Ring wire bytes per rank are
derived from it: an all-reduce moves 2(N−1)/N × payload, an all-gather (N−1) × the input.
Whole-host network counters are recorded separately (`runtime.net_counters`): they include every
other byte on the host and are reported as such.

DDP's built-in reducer calls the process group from C++, so every arm routes its gradient
reductions through a Python communication hook (`allreduce_hook` or `powerSGD_hook`), whose
`dist.all_reduce` calls the ledger sees while `Ledger.counting()` is active.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from training.errors import DigestMismatch

CHUNK_BYTES = 32 << 20  # the DiLoCo reduction bound: 32 MiB of FP32 per collective

# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns); hosts with an
# older torch have only the old one
GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
_COUNTED = ("all_reduce", GATHER, "broadcast")



def wire_bytes(op: str, payload: int, world: int) -> float:
    if world <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (world - 1) / world * payload
    if op == GATHER:
        return float((world - 1) * payload)
    return float(payload)  # broadcast: the root sends it once per hop in a chain


class Ledger:
    """Per-label counts of collective calls and logical payload bytes in this process."""

    def __init__(self, world_size: int):
        self.world = world_size
        self.label = "setup"
        self._lock = threading.Lock()
        self.totals: dict[str, dict[str, float]] = defaultdict(
            lambda: {"calls": 0, "payload_bytes": 0, "ring_wire_bytes": 0.0})
        self.ops: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "payload_bytes": 0})

    def record(self, op: str, tensor: torch.Tensor) -> None:
        payload = tensor.numel() * tensor.element_size()
        with self._lock:
            t = self.totals[self.label]
            t["calls"] += 1
            t["payload_bytes"] += payload
            t["ring_wire_bytes"] += wire_bytes(op, payload, self.world)
            o = self.ops[f"{self.label}/{op}"]
            o["calls"] += 1
            o["payload_bytes"] += payload

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Attribute collectives issued (or completed by hook callbacks) inside to `label`."""
        old, self.label = self.label, label
        try:
            yield
        finally:
            self.label = old

    @contextlib.contextmanager
    def counting(self) -> Iterator["Ledger"]:
        """Count every `torch.distributed` collective called through the module while active."""
        originals = {name: getattr(dist, name) for name in _COUNTED}

        def wrap(name: str, fn: Callable) -> Callable:
            def counted(tensor, *args, **kwargs):
                # all-gather(output, input): the payload is the input a rank sends
                if name == GATHER:
                    self.record(name, args[0] if args else kwargs["input_tensor"])
                else:
                    self.record(name, tensor)
                return fn(tensor, *args, **kwargs)
            return counted

        for name, fn in originals.items():
            setattr(dist, name, wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {k: dict(v) for k, v in self.totals.items()}

    @staticmethod
    def diff(after: dict, before: dict) -> dict[str, dict[str, float]]:
        out = {}
        for label, a in after.items():
            b = before.get(label, {})
            d = {k: a[k] - b.get(k, 0) for k in a}
            if d["calls"]:
                out[label] = d
        return out


# ---------------------------------------------------------------- digests as fixed-size bytes

def gather_rows(row: bytes, device: torch.device | str = "cpu") -> list[bytes]:
    """Every rank's `row` (the same length on each), in rank order: one fixed-size all-gather.

    No object collectives: nothing a peer sends is ever unpickled. Without a process group, [row].
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world == 1:
        return [row]
    if dist.get_backend() == "gloo":  # gloo (ranks that share a GPU) stages a CUDA tensor through the host anyway
        device = "cpu"
    mine = torch.tensor(list(row) or [0], dtype=torch.uint8, device=device)
    every = torch.empty(world * mine.numel(), dtype=torch.uint8, device=device)
    getattr(dist, GATHER)(every, mine)
    return [bytes(r)[:len(row)] for r in every.cpu().view(world, -1).tolist()]


def agree(name: str, hexdigest: str, device: torch.device | str = "cpu") -> list[str]:
    """All-gather a sha256 hex digest as 32 raw bytes; raise `DigestMismatch` unless all equal."""
    raw = bytes.fromhex(hexdigest)
    if len(raw) != 32:
        raise ValueError(f"{name}: expected a sha256 hex digest, got {hexdigest!r}")
    digests = [r.hex() for r in gather_rows(raw, device)]
    if len(set(digests)) != 1:
        lines = ", ".join(f"rank {r} has {d}" for r, d in enumerate(digests))
        raise DigestMismatch(f"ranks disagree on the {name} digest: {lines}")
    return digests


# ---------------------------------------------------------------- bounded chunked reduction

@dataclass(frozen=True)
class Piece:
    """Elements [start, end) of flat tensor `index`, placed at `offset` in the chunk buffer."""

    index: int
    start: int
    end: int
    offset: int


def chunk_plan(sizes: Sequence[int], chunk_elems: int) -> list[list[Piece]]:
    """Cover the concatenation of `sizes` elements with chunks of at most `chunk_elems`."""
    if chunk_elems < 1:
        raise ValueError("chunk_elems must be positive")
    chunks: list[list[Piece]] = []
    cur: list[Piece] = []
    used = 0
    for i, n in enumerate(sizes):
        start = 0
        while start < n:
            take = min(n - start, chunk_elems - used)
            cur.append(Piece(i, start, start + take, used))
            used += take
            start += take
            if used == chunk_elems:
                chunks.append(cur)
                cur, used = [], 0
    if cur:
        chunks.append(cur)
    return chunks


def chunked_mean(sizes: Sequence[int], fill: Callable[[torch.Tensor, Piece], None],
                 consume: Callable[[torch.Tensor, Piece], None], *, device: torch.device | str,
                 chunk_bytes: int = CHUNK_BYTES, buffers: int = 2) -> int:
    """Average a virtual FP32 vector over ranks through two reusable device buffers.

    `fill(view, piece)` writes this rank's values for a piece into `view` (on `device`);
    `consume(view, piece)` receives the rank mean of those elements. At most 2 × `chunk_bytes` of
    device memory is used, whatever the vector's length: while one chunk is being reduced (NCCL's
    own stream, or gloo's thread), the next one is filled, so the copies and arithmetic around the
    reduction hide behind it instead of adding to it. `buffers=1` does one chunk at a time (the
    comparison in bench/outer_step.py); more than 2 would not help, since one reduction is in
    flight at a time. Returns the payload bytes reduced.
    """
    world = dist.get_world_size()
    chunk_elems = max(1, chunk_bytes // 4)
    plan = chunk_plan(sizes, chunk_elems)
    if not plan:
        return 0
    n = min(chunk_elems, sum(sizes))
    bufs = [torch.empty(n, dtype=torch.float32, device=device) for _ in range(max(1, min(buffers, 2, len(plan))))]
    total = 0
    inflight: tuple | None = None

    def finish(work: dist.Work, view: torch.Tensor, pieces: list[Piece]) -> None:
        work.wait()  # on CUDA: the current stream waits for the reduction; the CPU goes on
        view.div_(world)
        for p in pieces:
            consume(view[p.offset:p.offset + p.end - p.start], p)

    for k, pieces in enumerate(plan):
        buf = bufs[k % len(bufs)]  # its previous chunk (k − 2) was consumed in the last iteration
        used = pieces[-1].offset + pieces[-1].end - pieces[-1].start
        for p in pieces:
            fill(buf[p.offset:p.offset + p.end - p.start], p)
        view = buf[:used]
        work = dist.all_reduce(view, async_op=True)
        if inflight is not None:
            finish(*inflight)
        inflight = (work, view, pieces)
        if len(bufs) == 1:
            finish(*inflight)
            inflight = None
        total += used * 4
    if inflight is not None:
        finish(*inflight)
    return total
