"""`python -m training train`: one rank of one arm, from committed inputs to `result.json`.

    H/runs/<arm>/numerical-profile.json     committed by rank 0 before the first update
    H/runs/<arm>/rank-<r>/result.json       every rank (see `RESULT_FORMAT`)
    H/runs/<arm>/model/                      rank 0: final weights, tokenizer, receipt.json
    H/runs/<arm>/attempts/                   earlier unfinished attempts, moved aside, never deleted

Before training, every rank agrees (fixed-size byte digests) on the prepared inputs, the seed
receipt and the numerical profile; afterwards on the final parameters. The training-loop timer
runs from the first update through the final model's write, read-back verification and agreement;
seed verification, model loading and process-group setup are timed separately.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from evidence.canonical import canonical_sha256, fsync_dir, fsync_file, read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.receipts import make_receipt, verify_receipt
from training.arms import KINDS
from training.config import Arm, ConfigError, Experiment, Resolved
from training.checkpoint import (STATE, CheckpointError, checkpoint_dir, common_step, load_rank_state,
                                 orphan_after, plain_write_seconds, write_manifest, write_rank_state)
from training.errors import TrainError
from training.runs import _set_aside, local_manifests, run_dir

RESULT_FORMAT = "trial-result-v1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")



def resolved_from_prepared(prepared: dict[str, Any]) -> Resolved:
    """Rebuild the experiment exactly as committed (hosts never need the TOML files)."""
    d = prepared["experiment"]
    exp = Experiment.model_validate({**d["experiment"], "profiles": {d["profile_name"]: d["profile"]}})
    cfg = Resolved(experiment=exp, profile_name=d["profile_name"], profile=exp.profiles[d["profile_name"]])
    if canonical_sha256(d) != prepared["experiment_digest"]:  # the stored form, as committed
        raise TrainError("prepared.json's experiment does not match its own digest; prepare again")
    return cfg


def _publish(trainer: Any, rank_dir: Path, step: int, identity: dict[str, Any], device: Any,
             die_before_manifest: bool = False) -> dict[str, Any]:
    """Write this rank's state, exchange receipt digests, write the common manifest, confirm."""
    from training import comm
    from training.trainer import all_or_none

    t0 = time.perf_counter()
    with all_or_none(f"writing checkpoint step {step}", device):
        fig = write_rank_state(rank_dir, step, trainer.state(), identity)
    digests = [r.hex() for r in comm.gather_rows(bytes.fromhex(fig["receipt_digest"]), device)]
    common = {k: identity[k] for k in ("experiment", "profile", "arm", "prepared_digest",
                                       "numerical_profile")}
    if die_before_manifest:
        _die(rank_dir, f"fault injection: rank {identity['rank']} killed while publishing step {step}")
    with all_or_none(f"publishing the step {step} manifest", device):
        write_manifest(rank_dir, step, digests, common)
    fig["publish_seconds"] = time.perf_counter() - t0
    return fig


def _restore(trainer: Any, rank_dir: Path, rank: int, every: int | None, updates: int, device: Any,
             say: Callable[[str], None]) -> dict[str, Any]:
    """Resume from the latest step every rank holds an identical manifest for (or stop, naming why)."""
    from training.trainer import all_or_none

    t0 = time.perf_counter()
    candidates = sorted(set(range(every, updates + 1, every)) | {updates}) if every else [updates]
    step = common_step(rank_dir, candidates, device)
    with all_or_none("verifying the checkpoint to resume from", device):
        if step is None:
            raise CheckpointError(f"rank {rank}: no checkpoint step has an identical manifest on every "
                                  f"rank (this rank holds {sorted(local_manifests(rank_dir))}); nothing can be resumed")
        if step >= updates:
            raise CheckpointError(f"rank {rank}: the common manifest is the final step {step}; the run "
                                  "finished — its result files were lost after training, not resumable")
        state, _ = load_rank_state(rank_dir, step, rank)
    t_load = time.perf_counter() - t0
    trainer.load_state(state, warm_ddp=not trainer.spec.compile)  # under compile: compile_warm_up's pass
    orphans = orphan_after(rank_dir, step)
    size = (checkpoint_dir(rank_dir, step) / STATE).stat().st_size
    say(f"resumed from step {step} (common manifest on every rank); "
        f"{len(orphans)} later file(s) kept under orphaned/")
    return {"step": step, "bytes": size, "seconds": time.perf_counter() - t0,
            "verify_and_load_seconds": t_load, "orphaned": orphans}


def _fault_plan(rank: int) -> tuple[int, str] | None:
    """TRIAL_FAULT_KILL="RANK:UPDATE[:publish]" makes that rank SIGKILL itself after UPDATE, or
    (":publish") in the middle of publishing step UPDATE: after the receipt digests are exchanged,
    before its own manifest is written. For recovery trials and tests."""
    spec = os.environ.get("TRIAL_FAULT_KILL")
    if not spec:
        return None
    r, u, *phase = spec.split(":")
    return (int(u), phase[0] if phase else "after") if int(r) == rank else None


def _die(rank_dir: Path, msg: str) -> None:
    """SIGKILL this process (no cleanup, like a crash), after noting when in `fault.json`."""
    import signal

    write_json_atomic(rank_dir / "fault.json", {"at": time.time(), "pid": os.getpid(), "what": msg})
    print(msg, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _plain_write_baseline(rank_dir: Path, published: list[dict[str, Any]],
                          restored: dict[str, Any] | None) -> dict[str, Any] | None:
    """Time a plain sequential write + fsync of as many bytes as one checkpoint, in this run.

    Only with TRIAL_IO_BASELINE=1 (the recovery trial and benchmarks set it): at 1.7B that is
    gigabytes per rank, which an ordinary run has no reason to write.

    The ratio of checkpoint write (and restore) time to this says what the checkpoint format,
    hashing and publication cost on top of the disk itself.
    """
    sizes = [c["bytes"] for c in published] or ([restored["bytes"]] if restored else [])
    if not sizes:
        return None
    n = max(sizes)
    plain = plain_write_seconds(rank_dir / ".plain-write.tmp", n)
    out: dict[str, Any] = {"plain_write_bytes": n, "plain_write_seconds": plain}
    if published:
        w = sum(c["seconds"] for c in published) / len(published)
        p = sum(c["publish_seconds"] for c in published) / len(published)
        out.update(checkpoint_write_seconds_mean=w, checkpoint_publish_seconds_mean=p,
                   write_over_plain=w / plain if plain else None,
                   publish_over_plain=p / plain if plain else None)
    if restored:
        out.update(restore_seconds=restored["seconds"],
                   restore_over_plain=restored["seconds"] / plain if plain else None)
    return out


def _seed_everything(base: int, rank: int) -> None:
    """Every generator a rank could draw from starts from (experiment, rank), not from the OS:
    two runs of one arm then begin in the same state, and a checkpoint's RNG state is comparable
    with an uninterrupted run's. (Training itself draws nothing: no dropout, fixed schedule.)"""
    import random

    import numpy as np
    import torch

    seed = (base * 1_000_003 + rank) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device


class _profiler:
    """`TRIAL_PROFILE=DIR`: torch.profiler over the three updates after two warm ones; the kernel
    table and a per-phase summary go to DIR/<arm>-rank-<r>.txt (nothing, if the run has fewer than
    five updates left; nothing either if the run ends inside the window). `TRIAL_PROFILE_FROM=U`
    starts the window at update U instead (e.g. past PowerSGD's dense warm-up). A benchmark tool:
    the timings it records include the profiler's overhead."""

    def __init__(self, arm: str, rank: int, first: int):
        self.out = os.environ.get("TRIAL_PROFILE")
        start = max(first, int(os.environ.get("TRIAL_PROFILE_FROM") or first + 2))
        self.name, self.window = f"{arm}-rank-{rank}", range(start, start + 3)
        self.prof: Any = None

    @contextlib.contextmanager
    def around(self, update: int):
        if not self.out or update not in self.window:
            yield
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self.prof is None:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=acts, record_shapes=False)
            self.prof.__enter__()
        yield
        if update == self.window[-1]:
            self.prof.__exit__(None, None, None)
            key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
            table = self.prof.key_averages().table(sort_by=key, row_limit=45)
            phases = [e for e in self.prof.key_averages() if e.key.startswith("trial.")]
            lines = [f"{e.key:20} cpu {e.cpu_time_total / 1e3:10.1f} ms  device "
                     f"{getattr(e, 'device_time_total', getattr(e, 'cuda_time_total', 0)) / 1e3:10.1f} ms  "
                     f"x{e.count}" for e in phases]
            d = Path(self.out)
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{self.name}.txt").write_text(
                f"updates {list(self.window)} (3 updates)\n" + "\n".join(lines) + "\n\n" + table + "\n")


def _commit_profile(home: Path, arm: str, profile: dict[str, Any], digest: str) -> None:
    rel = f"runs/{arm}/numerical-profile.json"
    path = home / rel
    log = CommitmentLog(home)
    earlier = [e for e in log.entries() if e["kind"] == "numerical-profile" and e["subject"] == rel]
    if earlier:
        old = earlier[-1]["data"].get("profile_digest")
        if old != digest:
            raise TrainError(f"{rel} was committed with numerical profile {old}, this run has {digest}; "
                             "a run's numerics cannot change — use a new --home for new settings")
        if path.is_file() and canonical_sha256(read_json(path)) != digest:
            raise TrainError(f"{path} differs from its commitment ({digest}); restore it or use a "
                             "new --home")
        if not path.is_file():  # the commitment pins the content, so it can be written again
            write_json_atomic(path, profile, canonical=True)
        return
    write_json_atomic(path, profile, canonical=True)
    log.append("numerical-profile", rel, {"profile_digest": digest, "arm": arm})


def _write_model(model: Any, seed_dir: Path, out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Save weights + tokenizer in a hidden directory, receipt it, re-verify, then rename."""
    tmp = out.parent / f".{out.name}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (seed_dir / name).is_file():
            shutil.copy2(seed_dir / name, tmp / name)
    for f in tmp.iterdir():  # durable before the receipt vouches for them
        fsync_file(f)
    receipt = make_receipt(tmp, meta=meta)
    write_json_atomic(tmp / "receipt.json", receipt)
    verify_receipt(tmp, read_json(tmp / "receipt.json"), what="trained model")  # read back
    if out.exists():
        _set_aside(out)
    tmp.rename(out)
    fsync_dir(out.parent)
    return receipt


def _spec(arm: Arm, cfg: Resolved, plan: list[list[int]], world: int, rank: int, autocast: Any):
    """The arm's TrainSpec; the profile may scale the settings its kind names `profile_scaled` (DiLoCo's
    H, PowerSGD's dense warmup: they scale with the number of updates), never other rules."""
    from training.trainer import TrainSpec

    prof, exp = cfg.profile, cfg.experiment
    kind = KINDS[arm.kind]
    settings = {k: (getattr(prof, k) if k in kind.profile_scaled else None) or getattr(arm, k, None)
                for k in kind.settings_model.model_fields}
    return TrainSpec(
        kind=arm.kind, plan=plan, lr=exp.lr, warmup=exp.warmup, weight_decay=exp.weight_decay,
        grad_clip=exp.grad_clip, microbatch=arm.microbatch, world_size=world, rank=rank, settings=settings,
        autocast_dtype=autocast, compile=prof.compile, fused_optimizer=prof.fused_optimizer,
        pack=prof.pack, pack_tokens=prof.pack_tokens, pack_rows=prof.pack_rows)


# Keys every arm's numerical profile has carried since before arm kinds were modules (PowerSGD's and
# DDP's, at their defaults); kept so that profiles recorded before and after compare, digest for digest.
PROFILE_DEFAULTS = {"powersgd_seed": 0, "powersgd_batch_same_shape": False, "ddp_bucket_cap_mb": None}


def train(home: str | os.PathLike[str], model_dir: str | os.PathLike[str], arm_name: str, *,
          threads: int | None = None, say: Callable[[str], None] | None = None,
          resume: bool = False) -> dict[str, Any]:
    """Run this process's rank (identity from the environment); return its result."""
    import torch
    import torch.distributed as dist

    from training import comm, runtime
    from training.corpus import Corpus
    from training.prepare import require_prepared
    from training.seed import load_tokenizer, verify_seed
    from training.trainer import Trainer, all_or_none, barrier_ok, engine_choices, parameter_digest

    t_start = time.perf_counter()
    home, model_dir = Path(home), Path(model_dir)
    info = runtime.RankInfo.from_env()
    say = say or (lambda msg: None)
    lead = info.rank == 0

    prepared = require_prepared(home)
    prepared_digest = canonical_sha256(prepared)
    cfg = resolved_from_prepared(prepared)
    arm: Arm = cfg.arm(arm_name)
    if not KINDS[arm.kind].trains:
        raise ConfigError(f"arm '{arm.name}' is the untrained seed: evaluate it directly, there is "
                          "nothing to train")
    if arm.world_size != info.world_size:
        raise TrainError(f"arm {arm.name} runs on {arm.world_size} rank(s) but WORLD_SIZE="
                         f"{info.world_size}; start {arm.world_size} processes")
    rd = run_dir(home, arm.name)
    rank_dir = rd / f"rank-{info.rank}"
    if (rank_dir / "result.json").is_file():
        raise TrainError(f"{rank_dir / 'result.json'} already exists: this rank has finished; its "
                         "results are kept — use a new --home to train again (orchestrate moves a "
                         "partly finished group's files to runs/<arm>/attempts/ before relaunching)")
    if resume:
        if not (rank_dir / "manifests").is_dir():
            raise CheckpointError(f"rank {info.rank}: nothing to resume: {rank_dir / 'manifests'} does "
                                  "not exist (run without --resume to start from the seed)")
    else:
        _set_aside(rank_dir)
        rank_dir.mkdir(parents=True)

    if threads:
        torch.set_num_threads(threads)
    prof = cfg.profile
    if prof.device == "cuda":
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    device = runtime.pick_device(prof.device, info.local_rank)
    lock = runtime.device_lock(device)  # noqa: F841 (held for the life of the process)

    t0 = time.perf_counter()
    failure: Exception | None = None
    try:  # a local failure here must reach the peers, not leave them waiting for the group
        receipt = verify_seed(model_dir)
        if receipt["digest"] != prepared["model"]["receipt_digest"]:
            raise TrainError(f"seed {model_dir} has receipt {receipt['digest']}, but the inputs were "
                             f"prepared with {prepared['model']['receipt_digest']}; pass the same "
                             "--model-dir that prepare used")
    except Exception as e:  # noqa: BLE001 (re-raised below, after the peers are told)
        failure = e
    t_verify = time.perf_counter() - t0

    t0 = time.perf_counter()
    runtime.init_group(info, device)
    t_group = time.perf_counter() - t0
    barrier_ok(failure is None, "seed verification", device)
    if failure is not None:
        raise failure
    runtime.configure_numerics(device)

    _seed_everything(cfg.experiment.generator_seed, info.rank)

    t0 = time.perf_counter()
    from transformers import AutoModelForCausalLM

    from training.seed import quiet_libraries
    quiet_libraries()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tok = load_tokenizer(model_dir, verified=True)
    t_load = time.perf_counter() - t0
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    corpus_name = "train-damaged.safetensors" if arm.data == "damaged" else "train.safetensors"
    corpus = Corpus.load(home / "inputs" / corpus_name)
    plan = read_json(home / "inputs" / "schedule.json")["updates"]
    committed_w = prepared["schedule"]["weighted_targets_per_update"
                                       + ("_damaged" if arm.data == "damaged" else "")]
    autocast = getattr(torch, prof.dtype) if prof.dtype != "float32" else None
    try:
        spec = _spec(arm, cfg, plan, info.world_size, info.rank, autocast)
    except ValueError as e:
        raise ConfigError(f"arm {arm.name}: {e}") from None
    choice = engine_choices(spec, device, model)
    arm_numerics = {**arm.model_dump(mode="json"), **PROFILE_DEFAULTS,
                    **spec.arm.profile_keys(spec.settings, choice),
                    "microbatch": spec.microbatch, "sort_by_length": spec.sort_by_length,
                    "chunk_bytes": spec.chunk_bytes, "lr": spec.lr, "warmup": spec.warmup,
                    "weight_decay": spec.weight_decay, "grad_clip": spec.grad_clip,
                    "betas": list(spec.betas), "eps": spec.eps,
                    "rng_seed": "generator_seed * 1000003 + rank", "compile": spec.compile,
                    "fused_optimizer": choice["fused_optimizer"], "pack": spec.pack,
                    "pack_tokens": spec.pack_tokens,
                    # rows per forward only where set, so other runs' profiles (and digests) stay as they were
                    **({"pack_rows": spec.pack_rows} if spec.pack_rows > 1 else {})}
    numerics = runtime.numerical_profile(device, dtype=prof.dtype, arm=arm_numerics, attention=choice["attention"])
    numerics_digest = runtime.profile_digest(numerics)

    ledger = comm.Ledger(info.world_size)
    net_before = runtime.net_counters()
    with ledger.counting():
        t0 = time.perf_counter()
        if info.world_size > 1:
            with ledger.phase("control"):
                for name, digest in (("prepared-input", prepared_digest),
                                     ("seed receipt", receipt["digest"]),
                                     ("numerical-profile", numerics_digest)):
                    comm.agree(name, digest, device)
        with ledger.phase("control"), all_or_none("committing the numerical profile", device):
            if lead:
                _commit_profile(home, arm.name, numerics, numerics_digest)
        t_agree = time.perf_counter() - t0

        trainer = Trainer(model, corpus, spec, device, pad_id, ledger)
        if [trainer.global_weights[u] for u in range(spec.updates)] != committed_w:
            raise TrainError(f"the weighted target counts of {corpus_name} differ from the committed "
                             "schedule; the prepared inputs are inconsistent — prepare again")
        say(f"rank {info.rank}/{info.world_size} {arm.name} ({arm.kind}): {spec.updates} updates, "
            f"{len(spec.local_docs(0))} docs per rank per update, {trainer.numel:,} parameters on {device}")

        every = prof.checkpoint_every
        identity = {"experiment": cfg.experiment.name, "profile": cfg.profile_name, "arm": arm.name,
                    "rank": info.rank, "world_size": info.world_size,
                    "prepared_digest": prepared_digest, "numerical_profile": numerics_digest}
        restored = None
        if resume:
            restored = _restore(trainer, rank_dir, info.rank, every, spec.updates, device, say)
        compile_s = None
        if spec.compile and trainer.update < spec.updates:
            say("compiling the training step (one forward/backward; nothing is applied)")
            with all_or_none("compiling the training step", device):  # ranks enter the loop together
                compile_s = trainer.compile_warm_up()
            say(f"compiled in {compile_s:.1f} s")
        heartbeat = rank_dir / "heartbeat.json"
        fault = _fault_plan(info.rank)
        checkpoints: list[dict[str, Any]] = []
        t_loop0 = time.perf_counter()
        profiler = _profiler(arm.name, info.rank, trainer.update)
        while trainer.update < spec.updates:
            with profiler.around(trainer.update):
                rec = trainer.step()
            done = trainer.update
            say(f"update {done}/{spec.updates} loss_local {rec['loss_local']:.4f} "
                f"grad_norm {rec['grad_norm']:.3f} {rec['seconds']:.3f} s"
                + (" +outer" if rec["outer_step"] else ""))
            if every and (done % every == 0 or done == spec.updates):
                die = fault == (done, "publish")
                with ledger.phase("control"):
                    checkpoints.append(_publish(trainer, rank_dir, done, identity, device, die))
                say(f"checkpoint step {done} published ({checkpoints[-1]['bytes'] / 1e6:.1f} MB, "
                    f"{checkpoints[-1]['seconds']:.2f} s)")
            write_json_atomic(heartbeat, {"update": done, "time": time.time(), "pid": os.getpid()})
            if fault == (done, "after"):
                _die(rank_dir, f"fault injection: rank {info.rank} killed after update {done}")
        records = trainer.journal
        t_updates = time.perf_counter() - t_loop0

        t0 = time.perf_counter()
        final_digest = parameter_digest(model)
        with ledger.phase("control"):
            if info.world_size > 1:
                comm.agree("final-parameters", final_digest, device)
        model_receipt = None
        with ledger.phase("control"), all_or_none("writing the final model", device):
            if lead:
                model_receipt = _write_model(model, model_dir, rd / "model", meta={
                    "experiment": cfg.experiment.name, "profile": cfg.profile_name, "arm": arm.name,
                    "parameters_sha256": final_digest, "seed_receipt": receipt["digest"],
                    "prepared_digest": prepared_digest, "numerical_profile": numerics_digest})
        t_final = time.perf_counter() - t0
        t_loop = time.perf_counter() - t_loop0
    net_after = runtime.net_counters()

    totals = ledger.snapshot()
    train_labels = ("gradient", "outer-delta")
    train_payload = sum(totals.get(k, {}).get("payload_bytes", 0) for k in train_labels)
    result = {
        "format": RESULT_FORMAT,
        "experiment": cfg.experiment.name, "profile": cfg.profile_name,
        "arm": arm.model_dump(mode="json"),
        "rank": info.rank, "world_size": info.world_size,
        "identity": {"rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank,
                     "master_addr": info.master_addr, "master_port": info.master_port,
                     "device": str(device)},
        "digests": {"prepared": prepared_digest, "seed_receipt": receipt["digest"],
                    "numerical_profile": numerics_digest, "final_parameters": final_digest},
        "parameters": trainer.numel,
        "numerical_profile": numerics,
        "runtime": runtime.runtime_settings(device),
        "updates": records,
        "comm": {
            "by_label": totals,
            "by_collective": {k: dict(v) for k, v in ledger.ops.items()},
            "training_payload_bytes": train_payload,
            "training_payload_bytes_per_update": train_payload / spec.updates,
            "dense_gradient_bytes_per_update": trainer.numel * 4,
            "note": "logical payload handed to collectives by this rank; ring wire bytes per rank "
                    "= 2(N-1)/N x payload for all-reduce",
        },
        "network": {"before": net_before, "after": net_after,
                    "delta": runtime.net_delta(net_after, net_before),
                    "note": "whole-host interface counters: include all other traffic on the host"},
        "timers": {
            "seed_verification_seconds": t_verify, "process_group_seconds": t_group,
            "model_load_seconds": t_load, "agreement_and_commit_seconds": t_agree,
            "compile_warm_up_seconds": compile_s,
            "updates_seconds": t_updates, "final_agreement_and_model_seconds": t_final,
            "training_loop_seconds": t_loop,
            "note": "training_loop = first update through final model write, read-back "
                    "verification and parameter agreement; under compile, the compilation runs "
                    "before it (compile_warm_up_seconds)",
        },
        "checkpoints": {"every": every, "published": checkpoints, "restored": restored,
                        "io": (_plain_write_baseline(rank_dir, checkpoints, restored)
                              if os.environ.get("TRIAL_IO_BASELINE") == "1" else None)},
        "model": ({"dir": f"runs/{arm.name}/model", "receipt_digest": model_receipt["digest"]}
                  if model_receipt else None),
        "resources": runtime.process_figures(device),
        "process_seconds_in_train": time.perf_counter() - t_start,
    }
    write_json_atomic(rank_dir / "result.json", result)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def main_say(rank: int) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if rank == 0:
            print(msg, file=sys.stderr, flush=True)
    return say
