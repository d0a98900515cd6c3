"""DDP with global token weighting: N ranks each hold 1/N of the update's documents.

Each rank's loss sum is scaled by N / W (W: the whole update's weighted targets), and DDP averages
the gradients over N, so the reduced gradient is Σ_r g_r / W: the single process's exactly.
Microbatches before the last run under `no_sync` (forward included), so one reduction happens per
update. Subclasses change only the reduction (PowerSGD).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from training.arms.base import ArmKind, Settings


def passthrough(bucket: Any) -> Any:
    """A DDP communication hook's result that leaves the bucket as it is: no reduction (a resume's
    warm-up pass; the benchmark's baseline)."""
    # start-up: torch ~1.5 s; arm kinds are read by every orchestrate command (training/arms/base.py)
    import torch

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


class DDPKind(ArmKind):
    name = "ddp"
    reduces_each_update = True

    def loss_scale(self, world_size: int, w_local: float, w_global: float) -> float:
        return world_size / w_global

    def reduction(self, settings: Settings, choice: dict[str, Any]) -> tuple[Callable[[Any], Any], Any]:
        """The communication hook, as a function of the bucket, and its state (None: stateless)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # start-up: torch (see passthrough)

        return (lambda bucket: default_hooks.allreduce_hook(None, bucket)), None

    def engine(self, loss: Any, device: Any, settings: Settings, choice: dict[str, Any],
               warming: Callable[[], bool]) -> tuple[Any, Any]:
        from torch.nn.parallel import DistributedDataParallel as DDP  # start-up: torch (see passthrough)

        # init_sync=False: every rank loaded the same verified seed (digests agreed before), so the
        # setup broadcast of all weights would only move bytes. Buffers (rotary frequencies) are
        # identical by construction: never sync them. torch 2.13 spells that forward_sync_buffers
        # (broadcast_buffers warns); older torch, the latter.
        no_buffer_sync = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                          else {"broadcast_buffers": False})
        engine = DDP(loss, device_ids=[device] if device.type == "cuda" else None, init_sync=False,
                     bucket_cap_mb=choice.get("ddp_bucket_cap_mb"), **no_buffer_sync)
        real, state = self.reduction(settings, choice)

        def hook(_state, bucket):  # unannotated: DDP refuses a hook whose bucket is not typed GradBucket
            """The arm's reduction; during a resume's warm-up pass, the bucket unchanged."""
            return passthrough(bucket) if warming() else real(bucket)

        engine.register_comm_hook(None, hook)
        return engine, state


KIND = DDPKind()
