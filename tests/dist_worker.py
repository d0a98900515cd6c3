"""One rank of a multi-process test: `python tests/dist_worker.py OUT MODEL_DIR JOBS_JSON`.

Rank identity comes from the environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT), as in a
real run. Each job writes `OUT/<job name>-rank<r>.pt`; an exception in a job is recorded there
(type and message) and the next job runs, so a test can assert on the failure itself.

`TRIAL_TEST_DEVICE=cuda` runs the same jobs on the GPU (the GPU machine's check of the same
equivalences): one GPU per rank with NCCL where there are enough, else the ranks share the GPUs
through gloo, exactly as `orchestrate run --share-gpus` places them (training.runtime.DeviceShare);
results are saved on the CPU either way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_cases import case  # noqa: E402

from training.arms import KINDS  # noqa: E402
from training.comm import Ledger, agree, chunked_mean  # noqa: E402
from training.diloco import OuterNesterov  # noqa: E402
from training.trainer import Trainer, TrainSpec, barrier_ok, parameter_digest  # noqa: E402

CUDA = os.environ.get("TRIAL_TEST_DEVICE") == "cuda"


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu")


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def train_state(trainer: Trainer, records: list) -> dict:
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    adam = {}
    for p in trainer.params:
        st = trainer.optimizer.state[p]
        adam[names[id(p)]] = {"exp_avg": st["exp_avg"].clone(), "exp_avg_sq": st["exp_avg_sq"].clone(),
                              "step": float(st["step"])}
    out = {"params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
           "adam": adam, "records": records, "digest": parameter_digest(trainer.model),
           "ledger": trainer.ledger.snapshot()}
    if trainer.spec.kind == "diloco":
        out["outer_v"] = [v.clone() for v in trainer.kind_state.v]
    return out


def settings(job: dict) -> dict:
    """The job's keys that are its arm kind's settings."""
    return {k: v for k, v in job.items() if k in KINDS[job["kind"]].settings_model.model_fields}


def run_train(job: dict, model_dir: str, rank: int, world: int) -> dict:
    from transformers import AutoModelForCausalLM

    corpus, plan = case(job["case"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    spec = TrainSpec(kind=job["kind"], plan=plan, lr=job.get("lr", 1e-3), warmup=job.get("warmup", 0),
                     microbatch=job.get("microbatch"), world_size=world, rank=rank, settings=settings(job),
                     pack=job.get("pack", False), pack_tokens=job.get("pack_tokens"),
                     pack_rows=job.get("pack_rows", 1))
    ledger = Ledger(world)
    trainer = Trainer(model.to(device()), corpus, spec, device(), pad_id=2, ledger=ledger)
    with ledger.counting():
        records = [trainer.step() for _ in range(job.get("updates", spec.updates))]
    return train_state(trainer, records)


def run_resume(job: dict, model_dir: str, rank: int, world: int, out: Path) -> dict:
    """Uninterrupted run vs a fresh model + fresh DDP restored from the state after `at` updates
    (with and without the bucket warm-up pass), to the same final update."""
    from transformers import AutoModelForCausalLM

    corpus, plan = case(job["case"])

    def fresh() -> Trainer:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        spec = TrainSpec(kind=job["kind"], plan=plan, lr=1e-3, microbatch=job.get("microbatch"),
                         world_size=world, rank=rank, settings=settings(job))
        return Trainer(model.to(device()), corpus, spec, device(), pad_id=2, ledger=Ledger(world))

    path = out / f"{job['name']}-state-rank{rank}.pt"
    a = fresh()
    for _ in range(job["at"]):
        a.step()
    torch.save(a.state(), path)
    while a.update < len(plan):
        a.step()
    digests = {"uninterrupted": parameter_digest(a.model)}
    for label, warm in (("resumed", True), ("resumed_without_warmup", False)):
        b = fresh()
        b.load_state(torch.load(path, weights_only=False), warm_ddp=warm)
        while b.update < len(plan):
            b.step()
        digests[label] = parameter_digest(b.model)
        if job["kind"] == "powersgd":
            digests[label + "_error_feedback_buckets"] = sorted(b.kind_state.error_dict)
    return digests


def values(rank: int, sizes: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(n, generator=g) for n in sizes]


def run_chunked_mean(job: dict, rank: int) -> dict:
    sizes = job["sizes"]
    mine = values(rank, sizes)
    out = [torch.full((n,), float("nan")) for n in sizes]
    seen = []

    def fill(view, pc):
        view.copy_(mine[pc.index][pc.start:pc.end])

    def consume(mean, pc):
        seen.append((pc.index, pc.start, pc.end))
        out[pc.index][pc.start:pc.end] = mean

    sent = chunked_mean(sizes, fill, consume, device="cpu", chunk_bytes=job["chunk_bytes"])
    return {"mean": out, "pieces": seen, "sent": sent}


def run_outer(job: dict, rank: int, world: int) -> dict:
    """Parent x; worker r ends each round at y_r = x − (r+1)·δ_k; two outer steps."""
    g = torch.Generator().manual_seed(7)
    sizes = job["sizes"]
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in sizes]
    start = [p.detach().clone() for p in params]
    outer = OuterNesterov(params, job["lr"], job["momentum"], chunk_bytes=job["chunk_bytes"])
    after = []
    for k, delta in enumerate(job["deltas"]):
        with torch.no_grad():
            for p, x in zip(params, outer.x):
                p.copy_(x - (rank + 1) * delta)
        outer.step()
        after.append({"params": [p.detach().clone() for p in params],
                      "x": [x.clone() for x in outer.x], "v": [v.clone() for v in outer.v]})
    return {"start": start, "rounds": after}


def main() -> None:
    out, model_dir, jobs = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    from training.runtime import DeviceShare, group_backend, pick_device

    world = int(os.environ["WORLD_SIZE"])
    share = None
    if CUDA and world > torch.cuda.device_count():
        share = DeviceShare(torch.cuda.device_count(), f"dist-worker-{os.environ['MASTER_PORT']}")
    dev = pick_device("cuda" if CUDA else "cpu", int(os.environ["RANK"]), share)
    dist.init_process_group(group_backend(dev, share))
    if int(os.environ["RANK"]) == 0:
        print(f"dist_worker: {world} ranks on {dev.type}, backend {dist.get_backend()}"
              + (f", sharing {share.gpus} GPU(s)" if share else ""), file=sys.stderr)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    for job in jobs:
        try:
            if job["type"] == "train":
                res = run_train(job, model_dir, rank, world)
            elif job["type"] == "chunked-mean":
                res = run_chunked_mean(job, rank)
            elif job["type"] == "outer":
                res = run_outer(job, rank, world)
            elif job["type"] == "resume":
                res = run_resume(job, model_dir, rank, world, out)
            elif job["type"] == "barrier":  # rank 1 reports a failure; returns normally there
                barrier_ok(rank != 1, "a test step", device())
                res = {"returned": True}
            elif job["type"] == "agree":
                res = {"digests": agree(job["what"], job["digests"][rank], device())}
            else:
                raise KeyError(job["type"])
        except Exception as e:  # recorded for the test to assert on
            res = {"error": type(e).__name__, "message": str(e)}
        torch.save(to_cpu(res), out / f"{job['name']}-rank{rank}.pt")
    dist.destroy_process_group()
    # skip interpreter finalization: see training.__main__._exit_now for the gloo abort it avoids
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
