"""PowerSGD (rank-r gradient compression with error feedback) as a DDP communication hook whose
orthogonalization is a parameter.

torch's `powerSGD_hook` orthogonalizes every P and Q with its own Householder QR, one small
factorization per matrix. At the 1.7B architecture's shapes those hundreds of QRs are most of what the
compression adds to an update; a batched Cholesky QR does the same job in a few kernels per
shape (bench/powersgd_step.py; figures in bench/results/2026-12-01-warmup-powersgd-restore-1xh200/README.md). This
hook runs the same algorithm as torch's — P = MQ, all-reduce P, orthogonalize P, Q = MᵀP, all-reduce
Q, M ≈ PQᵀ, error feedback, warm-started Q — on torch's `PowerSGDState` (so the dense warm-up, which
it leaves to torch's hook, and the checkpointed state are unchanged), with the orthogonalization a
parameter. With torch's own orthogonalization it gives torch's result bit for bit
(tests/training/test_powersgd.py). It does not log torch's periodic compression statistics (the counters are
kept).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_hook

Orthogonalize = Callable[[torch.Tensor, float], None]

_SHIFT = 1e-15  # first pass's diagonal shift, relative to trace(XᵀX): lets an exactly singular X factorize
_ORTHONORMAL_TOL = 1e-4  # |QᵀQ − I| above this (or not finite): that matrix falls back to Householder


def cholesky_qr2(matrices: torch.Tensor, epsilon: float = 0.0) -> None:
    """Orthonormalize the columns of each n × r matrix of a batch in place, keeping their span.

    Two passes of X ← X·L⁻ᵀ, L the Cholesky factor of XᵀX (CholeskyQR2), in FP64: the r × r Gram
    matrices and the n × r solves are small next to the gradient, FP64 squares away FP32's
    condition-number limit (FP32 inputs up to a condition number of 1e9 came out orthonormal to
    1e-6, tests/training/test_powersgd.py), and no TF32 setting can touch it. Any invertible factor keeps
    the span, so the first pass's tiny diagonal shift only lets an exactly singular (e.g. all-zero)
    matrix factorize. A matrix whose result is still not orthonormal to 1e-4 is redone by
    Householder QR (one host sync per call). `epsilon` is accepted for the hook's signature."""
    del epsilon
    eye = torch.eye(matrices.shape[-1], device=matrices.device, dtype=torch.float64)
    x = matrices.double()
    for i in range(2):
        gram = x.mT @ x
        shift = (_SHIFT if i == 0 else 0.0) * gram.diagonal(dim1=1, dim2=2).sum(-1)
        gram = gram + shift.clamp_min(torch.finfo(torch.float64).tiny)[:, None, None] * eye
        chol = torch.linalg.cholesky_ex(gram).L
        x = torch.linalg.solve_triangular(chol.mT, x, upper=True, left=False)
    off = (x.mT @ x - eye).abs().amax(dim=(1, 2))
    bad = ~(off <= _ORTHONORMAL_TOL)  # NaN counts as bad
    if bool(bad.any()):
        x[bad] = torch.linalg.qr(matrices[bad].double()).Q
    matrices.copy_(x)


def householder(matrices: torch.Tensor, epsilon: float = 0.0) -> None:
    """torch.linalg.qr per matrix (what torch's hook does for rank > 2 in FP32)."""
    del epsilon
    matrices.copy_(torch.linalg.qr(matrices).Q)


ORTHOGONALIZATIONS: dict[str, Orthogonalize] = {"cholesky-qr2": cholesky_qr2,
                                                 "householder": householder}


def powersgd_hook(state: Any, bucket: Any, orthogonalize: Orthogonalize) -> torch.futures.Future:
    """One bucket's reduction: torch's dense all-reduce for the first `start_powerSGD_iter`
    updates, then the compressed reduction below, with `orthogonalize` for Q (warm start) and P."""
    if state.iter < state.start_powerSGD_iter:
        return torch_hook.powerSGD_hook(state, bucket)  # all-reduce, and it counts the update
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = group.size()
    flat = bucket.buffer()
    device, dtype, index = flat.device, flat.dtype, bucket.index()

    before = None
    if state.use_error_feedback:  # add what earlier compressions left out; keep the sum to compare
        if index in state.error_dict:
            flat.add_(state.error_dict[index])
        else:
            state.error_dict[index] = torch.zeros(flat.shape[0], device=device, dtype=dtype)
        before = flat.detach().clone()

    # each gradient as a matrix (rows × the rest); compressed only where rank-r factors are smaller
    to_compress, dense = [], []
    p_size = q_size = 0
    for g in bucket.gradients():
        m = g.view(g.shape[0], -1)
        n, k = m.shape
        r = min(n, k, state.matrix_approximation_rank)
        compressed, original = (n + k) * r, n * k
        state.total_numel_before_compression += original
        if compressed * state.min_compression_rate < original:
            to_compress.append(m)
            p_size, q_size = p_size + n * r, q_size + k * r
            state.total_numel_after_compression += compressed
        else:
            dense.append(g)
            state.total_numel_after_compression += original
    dense_flat = (torch.cat([t.view(-1) for t in dense]) if dense
                  else torch.tensor([], device=device, dtype=dtype))

    fresh = not state.warm_start or index not in state.p_memory_dict
    if fresh:
        state.p_memory_dict[index] = torch.empty(p_size, device=device, dtype=dtype)
        state.q_memory_dict[index] = torch.empty(q_size, device=device, dtype=dtype)

    # same-shaped matrices stacked into one batch (one batched matmul and one orthogonalization each)
    by_shape: dict[torch.Size, list[torch.Tensor]] = defaultdict(list)
    for m in to_compress:
        by_shape[m.shape].append(m)
    batches, ps, qs = [], [], []
    p_at = q_at = 0
    for same in by_shape.values():
        if len(same) == 1 or not state.batch_tensors_with_same_shape:
            group_batches = [t.unsqueeze(0) for t in same]
        else:
            group_batches = [torch.stack(same)]
        for b in group_batches:
            count, n, k = b.shape
            r = min(n, k, state.matrix_approximation_rank)
            batches.append(b)
            ps.append(state.p_memory_dict[index][p_at:p_at + count * n * r].view(count, n, r))
            qs.append(state.q_memory_dict[index][q_at:q_at + count * k * r].view(count, k, r))
            p_at, q_at = p_at + count * n * r, q_at + count * k * r

    if fresh:  # Q from a normal draw seeded by the state's generator (the same on every rank)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))
                orthogonalize(q, state.orthogonalization_epsilon)
    else:
        for q in qs:
            orthogonalize(q, state.orthogonalization_epsilon)
    for b, q, p in zip(batches, qs, ps):
        torch.bmm(b, q, out=p)

    def reduce_p(fut):
        mean = fut.value()[0].div_(world)
        at = 0
        for t in dense:
            t.copy_(mean[at:at + t.numel()].view_as(t))
            at += t.numel()
        return dist.all_reduce(state.p_memory_dict[index], group=group, async_op=True).get_future().wait()[0]

    def reduce_q(fut):
        state.p_memory_dict[index] = fut.value()
        for p in ps:
            orthogonalize(p, state.orthogonalization_epsilon)
        for b, p, q in zip(batches, ps, qs):
            torch.bmm(b.transpose(1, 2), p, out=q)
        return dist.all_reduce(state.q_memory_dict[index], group=group, async_op=True).get_future().wait()[0]

    def decompress(fut):
        state.q_memory_dict[index] = fut.value().div_(world)
        for p, q, b in zip(ps, qs, batches):
            torch.bmm(p, q.transpose(1, 2), out=b)
        if state.batch_tensors_with_same_shape:  # stacked copies back into the bucket's views
            for b in batches:
                if b.shape[0] > 1:
                    for i, m in enumerate(by_shape[b.shape[1:]]):
                        m.copy_(b[i])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if before is not None:
            state.error_dict[index] = before - flat
        if not state.warm_start:
            state.p_memory_dict.clear()
            state.q_memory_dict.clear()
        state.maybe_increase_iter(bucket)
        return flat

    first = dist.all_reduce(dense_flat, group=group, async_op=True).get_future()
    return first.then(reduce_p).then(reduce_q).then(decompress)
