"""Our PowerSGD hook (training/powersgd.py) against torch's, and its batched Cholesky QR.

The hook comparison runs DDP in this process on a one-rank group (gloo on CPU; NCCL on CUDA with
TRIAL_TEST_DEVICE=cuda) through a file store, so it needs no port: with torch's own
orthogonalization passed in, our hook must give torch's hook's gradients and state bit for bit, in
the dense warm-up and in the compressed updates after it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_worker import CUDA, device
from training.powersgd import ORTHOGONALIZATIONS, powersgd_hook, cholesky_qr2


def conditioned(count: int, n: int, r: int, cond: float, seed: int = 0) -> torch.Tensor:
    """A batch of n × r matrices with singular values spread from 1 to 1/cond (made in FP64)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(count, n, r, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(count, r, r, generator=g, dtype=torch.float64)).Q
    s = torch.logspace(0, -torch.log10(torch.tensor(cond)).item(), r, dtype=torch.float64)
    return ((u * s) @ v.mT).float()


@pytest.mark.parametrize("cond", [1.0, 1e3, 1e6, 1e9])
def test_cholesky_qr2_is_orthonormal_and_keeps_the_span(cond):
    x = conditioned(3, 1024, 32, cond).to(device())
    q = x.clone()
    cholesky_qr2(q)
    eye = torch.eye(32, device=q.device)
    assert float((q.mT @ q - eye).abs().max()) < 1e-5
    # every column of x lies in span(q): the projection leaves nothing out
    assert float((x - q @ (q.mT @ x)).norm() / x.norm()) < 1e-5
    # and it came from the Cholesky passes, not the Householder fallback: R = QᵀX is upper
    # triangular with a positive diagonal (LAPACK's Householder R has negative entries)
    r = q.mT @ x
    assert (torch.diagonal(r, dim1=1, dim2=2) > 0).all()
    assert float(torch.tril(r, -1).abs().max() / r.abs().max()) < 1e-4


def test_cholesky_qr2_falls_back_where_cholesky_cannot():
    """An all-zero matrix factorizes (the shift) into zeros, fails the orthonormality check, and is
    redone by Householder QR; its well-conditioned neighbours in the batch keep the Cholesky result."""
    x = torch.cat([conditioned(1, 512, 8, 10.0), torch.zeros(1, 512, 8), conditioned(1, 512, 8, 1e4)]).to(device())
    q = x.clone()
    cholesky_qr2(q)
    eye = torch.eye(8, device=q.device)
    assert torch.isfinite(q).all()
    for i in range(3):
        assert float((q[i].mT @ q[i] - eye).abs().max()) < 1e-5
    for i in (0, 2):
        assert float((x[i] - q[i] @ (q[i].mT @ x[i])).norm() / x[i].norm()) < 1e-5
        assert (torch.diagonal(q[i].mT @ x[i]) > 0).all()
    assert not (torch.diagonal(torch.linalg.qr(x[2]).R) > 0).all()  # so the sign check can tell


class Grads(nn.Module):
    """Parameters of several shapes (same-shaped matrices, one too small to compress at the rank,
    vectors) and a loss whose gradient is the fixed random tensor of the step."""

    SHAPES = [(48, 40), (48, 40), (40, 48), (6, 5), (48,), (64, 16), (48, 40)]

    def __init__(self):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in self.SHAPES])

    def forward(self, targets):
        return sum((p * t).sum() for p, t in zip(self.ps, targets))


def run(orthogonalize, batch: bool, rank: int, steps: int):
    """Gradients after each step, and the PowerSGD state at the end, with torch's hook (None) or ours."""
    dev = device()
    model = Grads().to(dev)
    # one bucket, as the arm runs (trainer.bucket_cap_mb: several buckets deadlock this hook's
    # callback-issued all-reduces on gloo)
    ddp = DDP(model, device_ids=[dev] if dev.type == "cuda" else None, bucket_cap_mb=1)
    state = torch_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                                     use_error_feedback=True, warm_start=True, random_seed=7,
                                     batch_tensors_with_same_shape=batch)
    if orthogonalize is None:
        ddp.register_comm_hook(state, torch_hook.powerSGD_hook)
    else:
        ddp.register_comm_hook(state, lambda s, bucket: powersgd_hook(s, bucket, orthogonalize))
    g = torch.Generator().manual_seed(3)
    grads = []
    for _ in range(steps):
        targets = [torch.randn(s, generator=g).to(dev) for s in Grads.SHAPES]
        model.zero_grad(set_to_none=True)
        ddp(targets).backward()
        grads.append([p.grad.detach().cpu().clone() for p in model.ps])
    return grads, state


# Every group made here stays referenced until the session ends. A group whose last reference drops
# on one of its own worker threads (a hook's callback still finishing there after the test returned,
# or a garbage collection those callbacks set off) is destroyed there, joins that very thread and
# aborts the whole run: "terminate called after throwing an instance of 'std::system_error' what():
# Resource deadlock avoided" (4 runs of 30 of this file after test_arms and test_checkpoints).
GROUPS: list = []


@pytest.fixture()
def one_rank_group(tmp_path):
    dist.init_process_group("nccl" if CUDA else "gloo", init_method=f"file://{tmp_path / 'store'}",
                            rank=0, world_size=1, **({"device_id": device()} if CUDA else {}))
    GROUPS.append(dist.group.WORLD)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "per-matrix"])
@pytest.mark.parametrize("rank", [2, 4])
def test_hook_with_torchs_orthogonalization_is_torchs_hook(one_rank_group, batch, rank):
    theirs, ts = run(None, batch, rank, steps=5)
    ours, os_ = run(torch_hook._orthogonalize, batch, rank, steps=5)
    for step, (a, b) in enumerate(zip(theirs, ours)):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"step {step + 1}"
    assert ts.iter == os_.iter == 5
    for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
        mine, ref = getattr(os_, name), getattr(ts, name)
        assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref)
    assert (os_.total_numel_before_compression, os_.total_numel_after_compression) == \
        (ts.total_numel_before_compression, ts.total_numel_after_compression)
    # the updates after the 2 dense ones really compressed: a 48 × 40 gradient of rank ≤ r, where
    # the dense updates passed the full-rank random gradient through
    assert int(torch.linalg.matrix_rank(ours[1][0])) == 40
    assert int(torch.linalg.matrix_rank(ours[3][0])) <= rank


@pytest.mark.parametrize("name", sorted(ORTHOGONALIZATIONS))
def test_every_orthogonalization_gives_torchs_compressed_gradient(one_rank_group, name):
    """Any orthonormal basis of P's span gives the same P·Pᵀ·M: each choice matches torch's hook to
    rounding, update after update (error feedback included)."""
    theirs, _ = run(None, True, 4, steps=5)
    ours, _ = run(ORTHOGONALIZATIONS[name], True, 4, steps=5)
    for a, b in zip(theirs, ours):
        for x, y in zip(a, b):
            assert torch.allclose(x, y, rtol=1e-4, atol=1e-5)
