"""Benchmark: DiLoCo's outer step alone, at the 1.7B architecture's parameter shapes, 2 ranks.

    NCCL_... python bench/outer_step.py [--variants mean:1,mean:2,diloco:1,diloco:2] [--steps 1]

Each variant is MODE:BUFFERS — `mean`: comm.chunked_mean with a plain copy in and nothing out (the
reduction and its chunking alone); `diloco`: OuterNesterov.step (x and v pinned on the host, the
update on the GPU). BUFFERS is chunked_mean's buffer count (1: one chunk at a time; 2: the next chunk
is filled while one is reduced). Prints each step's seconds from rank 0 as it goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from make_arch_seed import parameter_shapes  # noqa: E402  (bench/ is on sys.path when run as a script)
from orchestrate.launch.command import free_port  # noqa: E402


def worker(rank: int, world: int, port: int, variants: list[str], steps: int,
           shapes: list[tuple[int, ...]]) -> None:
    from training.comm import chunked_mean
    from training.diloco import OuterNesterov

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    g = torch.Generator(device="cuda").manual_seed(rank)
    params = [torch.randn(s, device="cuda", generator=g) for s in shapes]
    n = sum(p.numel() for p in params)
    if rank == 0:
        print(f"{n:,} parameters ({n * 4 / 1e9:.2f} GB FP32) per rank, {world} ranks", flush=True)
    for v in variants:
        mode, buffers = v.split(":")
        t0 = time.perf_counter()
        outer = OuterNesterov(params, 0.7, 0.9, buffers=int(buffers)) if mode == "diloco" else None
        setup = time.perf_counter() - t0
        flat = [p.view(-1) for p in params]
        for i in range(steps):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if outer is not None:
                outer.step()
            else:
                chunked_mean([f.numel() for f in flat],
                             lambda view, pc: view.copy_(flat[pc.index][pc.start:pc.end]),
                             lambda mean, pc: None, device=torch.device("cuda", rank), buffers=int(buffers))
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if rank == 0:
                print(f"{v:10} step {i + 1}: {dt:.3f} s ({n * 4 / dt / 1e9:.2f} GB/s of payload)"
                      + (f"; pinned x, v allocated in {setup:.1f} s" if outer is not None and i == 0 else ""),
                      flush=True)
        del outer
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="mean:1,mean:2,diloco:1,diloco:2")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    mp.spawn(worker, args=(args.world, free_port(), args.variants.split(","), args.steps, parameter_shapes()),
             nprocs=args.world)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
