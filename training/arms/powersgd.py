"""DDP whose gradient reduction is PowerSGD: rank-r factors P and Q of every matrix all-reduced
instead of the matrix, with error feedback, after `dense_warmup` dense updates.

The hook is torch's (`powerSGD_hook`) or ours (`training.powersgd`, a batched orthogonalization),
chosen by device (`orthogonalization`). All gradients go into one DDP bucket (`bucket_cap_mb`).
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import Field

from training.arms.base import Settings
from training.arms.ddp import DDPKind


class PowerSGDSettings(Settings):
    powersgd_rank: int = Field(ge=1)
    # PyTorch's minimum with error feedback is 2 dense updates
    dense_warmup: int = Field(ge=2)
    powersgd_seed: int = 0
    # None: by device (see `orthogonalization`)
    powersgd_orthogonalization: str | None = None


def bucket_cap_mb(model: Any) -> int:
    """One DDP bucket holding every gradient.

    On gloo that is needed: PowerSGD issues each bucket's Q all-reduce from a callback of its P
    all-reduce, and gloo's futures complete when the bytes arrive, so with several buckets one rank
    can issue bucket k's Q before bucket k+1's P while its peer does the opposite, and gloo aborts on
    the size mismatch (seen with the 135M model: "18432 vs 2304"). On CUDA it is what makes
    PowerSGD cheap: with one bucket, every same-shaped matrix of the model is compressed in one
    batched matmul and one batched orthogonalization call (`batch_tensors_with_same_shape`; torch's
    own still factorizes each matrix inside it, see training/powersgd.py), where DDP's 25 MB buckets
    meant hundreds of hook calls with a QR per matrix (bench/results/2026-12-01-warmup-powersgd-restore-1xh200/README.md). The
    cost is memory: the hook holds a copy of the whole bucket, the stacked matrices and the new
    error feedback at once (about 20 GB at 1.7B in FP32, after the activations are freed).
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total // (1 << 20) + 1


def orthogonalization(settings: PowerSGDSettings, device: Any) -> str:
    """How P and Q are orthonormalized: "torch" (torch's own hook: a Householder QR per matrix,
    Gram-Schmidt at rank ≤ 2), or one of `training.powersgd.ORTHOGONALIZATIONS` in our hook. By
    default a batched Cholesky QR on CUDA, where torch's per-matrix QRs dominate the compression,
    and torch's hook on CPU, where LAPACK's QR is cheap."""
    return settings.powersgd_orthogonalization or ("cholesky-qr2" if device.type == "cuda" else "torch")


class PowerSGDKind(DDPKind):
    name = "powersgd"
    settings_model = PowerSGDSettings
    profile_scaled = ("dense_warmup",)
    checkpoint_part = "powersgd"
    plan_needs = {"payload_bytes_per_sync": "PowerSGD's measured payload per update"}

    def engine_choices(self, settings: PowerSGDSettings, device: Any, model: Any) -> dict[str, Any]:
        return {"ddp_bucket_cap_mb": bucket_cap_mb(model), "powersgd_batch_same_shape": True,
                "powersgd_orthogonalization": orthogonalization(settings, device)}

    def reduction(self, settings: PowerSGDSettings, choice: dict[str, Any]) -> tuple[Callable[[Any], Any], Any]:
        # start-up: torch ~1.5 s; arm kinds are read by every orchestrate command (training/arms/base.py)
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        from training.powersgd import ORTHOGONALIZATIONS, powersgd_hook

        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=settings.powersgd_rank,
            start_powerSGD_iter=settings.dense_warmup, use_error_feedback=True, warm_start=True,
            random_seed=settings.powersgd_seed, batch_tensors_with_same_shape=choice["powersgd_batch_same_shape"])
        ortho = choice["powersgd_orthogonalization"]
        if ortho == "torch":
            return (lambda bucket: powerSGD_hook.powerSGD_hook(state, bucket)), state
        if ortho not in ORTHOGONALIZATIONS:
            raise ValueError(f"unknown PowerSGD orthogonalization {ortho!r}; "
                             f"choose torch or one of {sorted(ORTHOGONALIZATIONS)}")
        return (lambda bucket: powersgd_hook(state, bucket, ORTHOGONALIZATIONS[ortho])), state

    def update_record(self, state: Any, update: int) -> dict[str, Any]:
        return {"powersgd_compressed": update >= state.start_powerSGD_iter}

    def state_dict(self, state: Any) -> Any:
        return {k: getattr(state, k) for k in state.__slots__ if k != "process_group"}

    def load_state_dict(self, state: Any, saved: Any, device: Any) -> None:
        import torch  # start-up: torch (see reduction)

        for k, v in saved.items():
            if isinstance(v, dict):  # error feedback and P/Q memories live on the device
                v = {i: t.to(device) if torch.is_tensor(t) else t for i, t in v.items()}
            setattr(state, k, v)

    def profile_keys(self, settings: PowerSGDSettings, choice: dict[str, Any]) -> dict[str, Any]:
        return {"dense_warmup": settings.dense_warmup, "powersgd_seed": settings.powersgd_seed,
                "powersgd_batch_same_shape": choice["powersgd_batch_same_shape"],
                "ddp_bucket_cap_mb": choice["ddp_bucket_cap_mb"],
                "powersgd_orthogonalization": choice["powersgd_orthogonalization"]}


KIND = PowerSGDKind()
