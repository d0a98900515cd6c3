"""Benchmark: the gradient reduction of the ddp and powersgd arms alone, at the 1.7B architecture's
parameter shapes — what PowerSGD's compression costs on this device (one rank), and with two ranks
over the network what its P and Q all-reduces add.

    [NCCL_...] python bench/powersgd_step.py [--world 1] [--steps 8] [--profile DIR] [--small]
        [--variants none,ddp,powersgd:torch,powersgd:householder,powersgd:cholesky-qr2]

Each rank holds the architecture's parameters (FP32) behind a backward that writes fresh random
gradients (a generator per rank), wrapped in DDP exactly as the trainer wraps the powersgd arm: one
bucket holding every gradient (`training.arms.powersgd.bucket_cap_mb`) and the hook from the arm
kind's `reduction` (rank 32, here 2 dense updates, then compressed). Variants:
  none                  a hook that returns the bucket unchanged: backward and DDP's copies (baseline)
  ddp                   the all-reduce hook (the ddp arm, and powersgd's dense warm-up)
  powersgd:ORTHO        PowerSGD with that orthogonalization: `torch` is torch's own hook (a
                        Householder QR per matrix); `householder` and `cholesky-qr2` are our hook
                        (training/powersgd.py), the latter what the arm uses on CUDA
Each step is timed from a barrier to the end of backward (the hook's future included), the slowest
rank's time; the summary is the median over the steps after the first compressed one, and that median
minus the baseline's: what the reduction adds to an update. `--small` shrinks the architecture for a
CPU check (gloo).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from make_arch_seed import parameter_shapes  # noqa: E402  (bench/ is on sys.path when run as a script)
from orchestrate.launch.command import free_port  # noqa: E402

RANK, DENSE = 32, 2
SMALL = dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4)


class _RandomGradients(torch.autograd.Function):
    """Forward: a zero loss; backward: a fresh normal gradient for every parameter."""

    @staticmethod
    def forward(ctx, gen, *params):
        ctx.gen, ctx.like = gen, [(p.shape, p.device) for p in params]
        return params[0].new_zeros(())

    @staticmethod
    def backward(ctx, _grad):
        return (None, *[torch.randn(s, device=d, generator=ctx.gen) for s, d in ctx.like])


class Gradients(nn.Module):
    def __init__(self, shapes, device, seed: int):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s, device=device)) for s in shapes])
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def forward(self, _x):  # DDP moves its inputs to the device and needs at least one
        return _RandomGradients.apply(self.gen, *self.ps)


def worker(rank: int, world: int, port: int, variants: list[str], steps: int, shapes, profile: str | None,
           cuda: bool) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from training.arms import KINDS
    from training.arms.ddp import passthrough
    from training.arms.powersgd import bucket_cap_mb

    torch.set_num_threads(1 if not cuda else torch.get_num_threads())
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": device} if cuda else {}))
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    n = sum(torch.Size(s).numel() for s in shapes)
    if rank == 0:
        print(f"{n:,} parameters ({n * 4 / 1e9:.2f} GB FP32 of gradient) per rank, {world} rank(s), "
              f"{'cuda' if cuda else 'cpu'}", flush=True)
    summary = {}
    for v in variants:
        module = Gradients(shapes, device, seed=rank)
        ddp = DDP(module, device_ids=[device] if cuda else None, bucket_cap_mb=bucket_cap_mb(module))
        if v == "none":
            hook = lambda _state, bucket: passthrough(bucket)  # noqa: E731
        else:
            kind, _, ortho = v.partition(":")
            arm = KINDS[kind]
            settings = arm.settings({"powersgd_rank": RANK, "dense_warmup": DENSE} if kind == "powersgd" else {})
            reduce, state = arm.reduction(settings, {"powersgd_batch_same_shape": True,
                                                     "powersgd_orthogonalization": ortho or "torch"})
            hook = lambda _state, bucket, reduce=reduce: reduce(bucket)  # noqa: E731
        ddp.register_comm_hook(None, hook)
        times = []
        for i in range(steps):
            prof = None
            if profile and v.startswith("powersgd") and i == steps - 1:
                from torch.profiler import ProfilerActivity
                prof = torch.profiler.profile(activities=[ProfilerActivity.CPU]
                                              + ([ProfilerActivity.CUDA] if cuda else []))
                prof.__enter__()
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            ddp(torch.zeros((), device=device)).backward()
            sync()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            if prof is not None:
                prof.__exit__(None, None, None)
                Path(profile).mkdir(parents=True, exist_ok=True)
                key = "cuda_time_total" if cuda else "cpu_time_total"
                (Path(profile) / f"{v.replace(':', '-')}-world{world}-rank{rank}.txt").write_text(
                    prof.key_averages().table(sort_by=key, row_limit=40) + "\n")
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times.append(float(dt))
            if rank == 0:
                phase = "" if v in ("none", "ddp") else (" (dense)" if i < DENSE else " (compressed)")
                print(f"{v:21} step {i + 1}: {times[-1]:.4f} s{phase}", flush=True)
        later = times[DENSE + 1:] if v.startswith("powersgd") else times[1:]
        summary[v] = statistics.median(later) if later else float("nan")
        del ddp, module, hook
        reduce = state = None  # the error feedback and P/Q (GBs) go before the next variant allocates
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0:
        base = summary.get("none")
        for v, t in summary.items():
            extra = f", {t - base:+.4f} s over the baseline" if base is not None and v != "none" else ""
            print(f"median {v:21} {t:.4f} s{extra}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="none,ddp,powersgd:torch,powersgd:householder,powersgd:cholesky-qr2")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--profile", help="write a torch.profiler table of each PowerSGD variant's last step here")
    ap.add_argument("--small", action="store_true", help="a small architecture, for a CPU check")
    args = ap.parse_args()
    if args.steps < DENSE + 2:
        ap.error(f"--steps must be at least {DENSE + 2} (PowerSGD starts compressing after {DENSE})")
    cuda = torch.cuda.is_available()
    shapes = parameter_shapes(**(SMALL if args.small else {}))
    mp.spawn(worker, args=(args.world, free_port(), args.variants.split(","), args.steps, shapes, args.profile,
                           cuda), nprocs=args.world)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
