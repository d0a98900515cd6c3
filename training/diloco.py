"""DiLoCo's outer step: average the workers' deltas from a common parent, then a Nesterov step.

For parent x, worker endpoints y_r (r = 1…N), outer rate η and momentum μ:
    d = mean_r(x − y_r);   v ← μ·v + d;   x ← x − η·(d + μ·v)
Every worker then replaces its model with x and keeps its own Adam moments.

x and v are FP32 on the CPU (they never occupy accelerator memory: 13.7 GB at 1.7B, which a 48 GB
L40S cannot spare next to the model, its gradients and Adam). The mean is reduced on the device
through `comm.chunked_mean`'s two bounded buffers, and each chunk's update is applied as soon as its
mean arrives, so there is no full-model d either. On CUDA, x and v live in pinned memory and each
chunk's update runs on the GPU (x and v copied in and back, asynchronously): the CPU doing the
update and pageable copies made one sync several times slower than DDP's all-reduce of the same
bytes (bench/results/README.md, "DiLoCo outer step alone"). Deltas are exchanged rather than weights:
a delta is small relative to the parent, so the FP32 sum loses less than summing parents would.

This is the only implementation of the step (NOTES: `torch.optim.SGD(nesterov=True)` agrees only
up to rounding), and `apply_update` is exposed so tests can check the formula and its sign.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from training.comm import CHUNK_BYTES, Piece, chunked_mean


def apply_update(x: torch.Tensor, v: torch.Tensor, d: torch.Tensor, lr: float, momentum: float) -> None:
    """In place: v ← μv + d; x ← x − η(d + μv)."""
    v.mul_(momentum).add_(d)
    x.sub_(d.add(v, alpha=momentum), alpha=lr)


class OuterNesterov:
    def __init__(self, params: Sequence[nn.Parameter], lr: float, momentum: float, *,
                 chunk_bytes: int = CHUNK_BYTES, buffers: int = 2):
        self.params = list(params)
        self.lr, self.momentum, self.chunk_bytes, self.buffers = lr, momentum, chunk_bytes, buffers
        pin = bool(self.params) and self.params[0].device.type == "cuda"  # allocated pinned: no second copy
        self.x = [torch.empty(p.numel(), dtype=torch.float32, pin_memory=pin).copy_(p.detach().reshape(-1))
                  for p in self.params]
        self.v = [torch.zeros(t.numel(), dtype=torch.float32, pin_memory=pin) for t in self.x]
        self.steps = 0

    def state_dict(self) -> dict[str, object]:
        return {"x": self.x, "v": self.v, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        for dst, src in zip(self.x, state["x"]):
            dst.copy_(src)
        for dst, src in zip(self.v, state["v"]):
            dst.copy_(src)
        self.steps = int(state["steps"])

    @torch.no_grad()
    def step(self) -> int:
        """One synchronization; returns the payload bytes this rank reduced."""
        flat = [p.data.view(-1) for p in self.params]
        device = flat[0].device
        on_gpu = device.type == "cuda"

        def fill(view: torch.Tensor, pc: Piece) -> None:  # x − y_r for this piece
            view.copy_(self.x[pc.index][pc.start:pc.end], non_blocking=on_gpu)
            view.sub_(flat[pc.index][pc.start:pc.end])

        def consume(mean: torch.Tensor, pc: Piece) -> None:  # outer step, then y_r ← x
            x, v = self.x[pc.index][pc.start:pc.end], self.v[pc.index][pc.start:pc.end]
            if on_gpu:  # same formula on the GPU; stream order keeps the copies and kernels in sequence
                xd, vd = x.to(device, non_blocking=True), v.to(device, non_blocking=True)
                apply_update(xd, vd, mean, self.lr, self.momentum)
                flat[pc.index][pc.start:pc.end].copy_(xd)
                x.copy_(xd, non_blocking=True)
                v.copy_(vd, non_blocking=True)
            else:
                apply_update(x, v, mean.to("cpu", torch.float32), self.lr, self.momentum)
                flat[pc.index][pc.start:pc.end].copy_(x)

        sent = chunked_mean([t.numel() for t in self.x], fill, consume, device=device,
                            chunk_bytes=self.chunk_bytes, buffers=self.buffers)
        if on_gpu:  # x and v are read on the CPU next (checkpoints); the copies must have landed
            torch.cuda.synchronize(device)
        self.steps += 1
        return sent
