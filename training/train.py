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

import os
import random
import shutil
import sys
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Callable

import numpy as np

from evidence.canonical import canonical_sha256, fsync_dir, fsync_file, read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.receipts import RECEIPT_NAME, make_receipt, verify_receipt
from training import lease
from training.arms import KINDS
from training.checkpoint.disk_baseline import io_baseline
from training.config import Arm, ConfigError, Experiment, Resolved
from training.corpus import Corpus
from training.errors import CheckpointError, TrainError
from training.hold import NEW_HOME
from training.faults import FaultPlan
from training.heap import long_lived
from training.identity import RankInfo  # who this rank is, read without loading torch
from training.prepare import require_prepared
from training.profiling import UpdateProfiler
from training.runs import _set_aside, run_dir
from training.seed import load_tokenizer, quiet_libraries, verify_seed

RESULT_FORMAT = "trial-result-v1"
# what a trained model keeps of its seed besides its own weights and config: every other file
# (tokenizer, vocabulary, merges, chat template, licence — whatever the seed has), but never the
# seed's weights or index, and the seed's generation config (how it ends an answer) over the default
SEED_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf", "*.onnx",
                "*.index.json")
SEED_KEPT_OVER_SAVED = ("generation_config.json",)


def seed_files_kept(seed_dir: Path, saved: set[str]) -> list[Path]:
    """The seed's files a trained model copies: see SEED_WEIGHTS."""
    return [p for p in sorted(seed_dir.iterdir())
            if p.is_file() and not p.name.startswith(".") and p.name != RECEIPT_NAME
            and not any(fnmatch(p.name, w) for w in SEED_WEIGHTS)
            and (p.name not in saved or p.name in SEED_KEPT_OVER_SAVED)]



def resolved_from_prepared(prepared: dict[str, Any]) -> Resolved:
    """Rebuild the experiment exactly as committed (hosts never need the TOML files)."""
    d = prepared["experiment"]
    exp = Experiment.model_validate({**d["experiment"], "profiles": {d["profile_name"]: d["profile"]}})
    cfg = Resolved(experiment=exp, profile_name=d["profile_name"], profile=exp.profiles[d["profile_name"]])
    if canonical_sha256(d) != prepared["experiment_digest"]:  # the stored form, as committed
        raise TrainError("prepared.json's experiment does not match its own digest; prepare again")
    return cfg


def _seed_everything(base: int, rank: int) -> None:
    """Every generator a rank could draw from starts from (experiment, rank), not from the OS:
    two runs of one arm then begin in the same state, and a checkpoint's RNG state is comparable
    with an uninterrupted run's. (Training itself draws nothing: no dropout, fixed schedule.)"""
    import torch  # see RankRun's docstring

    seed = (base * 1_000_003 + rank) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device


def _commit_profile(home: Path, arm: str, profile: dict[str, Any], digest: str) -> None:
    rel = f"runs/{arm}/numerical-profile.json"
    path = home / rel
    log = CommitmentLog(home)
    earlier = [e for e in log.entries() if e["kind"] == "numerical-profile" and e["subject"] == rel]
    if earlier:
        old = earlier[-1]["data"].get("profile_digest")
        if old != digest:
            raise TrainError(f"{rel} was committed with numerical profile {old}, this run has {digest}; "
                             f"a run's numerics cannot change — for new settings, {NEW_HOME}")
        if path.is_file() and canonical_sha256(read_json(path)) != digest:
            raise TrainError(f"{path} differs from its commitment ({digest}); restore it or {NEW_HOME}")
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
    for p in seed_files_kept(seed_dir, {f.name for f in tmp.iterdir()}):
        shutil.copy2(p, tmp / p.name)
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
    from training.trainer import TrainSpec  # torch: see RankRun's docstring

    prof, exp = cfg.profile, cfg.experiment
    settings = cfg.arm_settings(arm)
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
    return RankRun(home, model_dir, arm_name, threads=threads, say=say, resume=resume).run()


class RankRun:
    """One rank's run of one arm, in the order its phases must happen: inputs checked, the group
    joined, the model loaded and its numerics fixed, agreement, (restore,) the updates, the final
    model, the result. Each phase records its own figures; `result` gathers them.

    An object rather than one function because the phases share a dozen values (the rank, its
    directory, device, spec, trainer, ledger): held once here, each phase reads only what it needs.
    Torch and the trainer are imported inside the phases: `training.train` itself is read by CLIs
    (for `resolved_from_prepared`) that must not import torch (~1.5 s); `run` loads them once, under
    `long_lived`, before its clock starts.
    """

    def __init__(self, home: str | os.PathLike[str], model_dir: str | os.PathLike[str], arm_name: str, *,
                 threads: int | None = None, say: Callable[[str], None] | None = None, resume: bool = False):
        self.home, self.model_dir, self.arm_name = Path(home), Path(model_dir), arm_name
        self.threads, self.resume = threads, resume
        self.info = RankInfo.from_env()
        self.say = say or (lambda msg: None)
        self.timers: dict[str, Any] = {}  # filled phase by phase, in the result's order

    def run(self) -> dict[str, Any]:
        self.check_inputs()  # before any library loads: a refused rank spends no time loading them
        with long_lived():  # loaded once, kept to the end: out of the collector's sight (training/heap.py)
            import torch.distributed  # noqa: F401  the libraries load before the clock starts, so that
            import training.checkpoint.group  # noqa: F401  process_seconds_in_train is the train phases' own
            from training import comm, runtime, trainer  # noqa: F401  (imports vary by host)
        self.t_start = time.perf_counter()
        self.join_group()
        model = self.load_model()
        spec, numerics, numerics_digest = self.fix_numerics(model)
        ledger = comm.Ledger(self.info.world_size)
        net_before = runtime.net_counters()
        with ledger.counting():
            self.agree(ledger, numerics, numerics_digest)
            trainer = self.make_trainer(model, spec, ledger)
            identity = self.identity(numerics_digest)
            restored = self.restore(trainer, spec) if self.resume else None
            self.compile(trainer, spec)
            t_loop0 = time.perf_counter()
            checkpoints = self.loop(trainer, spec, ledger, identity)
            final_digest, model_receipt = self.finish(model, ledger, numerics_digest)
            self.timers["training_loop_seconds"] = time.perf_counter() - t_loop0
        net_after = runtime.net_counters()
        result = self.result(trainer, spec, ledger, numerics, numerics_digest, final_digest, model_receipt,
                             {"before": net_before, "after": net_after}, checkpoints, restored)
        write_json_atomic(self.rank_dir / "result.json", result)
        self.leave_group()
        return result

    def check_inputs(self) -> None:
        """The committed inputs, the arm, this rank's directory: everything refusable before a device."""
        info = self.info
        self.prepared = require_prepared(self.home)
        self.prepared_digest = canonical_sha256(self.prepared)
        self.cfg = resolved_from_prepared(self.prepared)
        self.arm: Arm = self.cfg.arm(self.arm_name)
        arm = self.arm
        if not KINDS[arm.kind].trains:
            raise ConfigError(f"arm '{arm.name}' is the untrained seed: evaluate it directly, there is "
                              "nothing to train")
        if arm.world_size != info.world_size:
            raise TrainError(f"arm {arm.name} runs on {arm.world_size} rank(s) but WORLD_SIZE="
                             f"{info.world_size}; start {arm.world_size} processes")
        self.rd = run_dir(self.home, arm.name)
        self.rank_dir = rank_dir = self.rd / f"rank-{info.rank}"
        if (rank_dir / "result.json").is_file():
            raise TrainError(f"{rank_dir / 'result.json'} already exists: this rank has finished; its "
                             f"results are kept — to train again, {NEW_HOME} (orchestrate moves a "
                             "partly finished group's files to runs/<arm>/attempts/ before relaunching)")
        if self.resume:
            if not (rank_dir / "manifests").is_dir():
                raise CheckpointError(f"rank {info.rank}: nothing to resume: {rank_dir / 'manifests'} does "
                                      "not exist (run without --resume to start from the seed)")
        else:
            _set_aside(rank_dir)
            rank_dir.mkdir(parents=True)

    def join_group(self) -> None:
        """Take the device, verify the seed, join the process group; a local failure reaches the peers."""
        import torch  # see the class's docstring

        from training import runtime
        from training.trainer import barrier_ok

        info, prepared = self.info, self.prepared
        if self.threads:
            torch.set_num_threads(self.threads)
        if self.cfg.profile.device == "cuda":
            os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        self.share = share = runtime.DeviceShare.from_env()  # ranks that share GPUs on purpose (gloo)
        self.device = device = runtime.pick_device(self.cfg.profile.device, info.local_rank, share)
        self.device_lock = runtime.device_lock(device, share)  # held for the life of the run

        t0 = time.perf_counter()
        failure: Exception | None = None
        try:  # a local failure here must reach the peers, not leave them waiting for the group
            self.seed_receipt = verify_seed(self.model_dir)
            if self.seed_receipt["digest"] != prepared["model"]["receipt_digest"]:
                raise TrainError(f"seed {self.model_dir} has receipt {self.seed_receipt['digest']}, but the "
                                 f"inputs were prepared with {prepared['model']['receipt_digest']}; pass the "
                                 "same --model-dir that prepare used")
        except Exception as e:  # noqa: BLE001 (re-raised below, after the peers are told)
            failure = e
        self.timers["seed_verification_seconds"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        runtime.init_group(info, device, share=share)
        self.timers["process_group_seconds"] = time.perf_counter() - t0
        barrier_ok(failure is None, "seed verification", device)
        if failure is not None:
            raise failure
        runtime.configure_numerics(device, deterministic=self.cfg.profile.deterministic)
        _seed_everything(self.cfg.experiment.generator_seed, info.rank)

    def load_model(self) -> Any:
        """The seed's weights and tokenizer (the pad id), then this arm's corpus and schedule."""
        import torch  # see the class's docstring

        t0 = time.perf_counter()  # the libraries' import counts as loading, as it always has
        with long_lived():
            from transformers import AutoModelForCausalLM  # likewise

            quiet_libraries()
            model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
            tok = load_tokenizer(self.model_dir, verified=True)
        self.timers["model_load_seconds"] = time.perf_counter() - t0
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

        damaged = self.arm.data == "damaged"
        self.corpus_name = "train-damaged.safetensors" if damaged else "train.safetensors"
        self.corpus = Corpus.load(self.home / "inputs" / self.corpus_name)
        self.plan = read_json(self.home / "inputs" / "schedule.json")["updates"]
        self.committed_w = self.prepared["schedule"]["weighted_targets_per_update" + ("_damaged" if damaged else "")]
        return model

    def fix_numerics(self, model: Any) -> tuple[Any, dict[str, Any], str]:
        """The arm's TrainSpec and the numerical profile every rank must agree on (and its digest)."""
        import torch  # see the class's docstring

        from training import runtime
        from training.trainer import engine_choices

        arm, prof, info = self.arm, self.cfg.profile, self.info
        autocast = getattr(torch, prof.dtype) if prof.dtype != "float32" else None
        try:
            spec = _spec(arm, self.cfg, self.plan, info.world_size, info.rank, autocast)
        except ValueError as e:
            raise ConfigError(f"arm {arm.name}: {e}") from None
        choice = engine_choices(spec, self.device, model)
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
        numerics = runtime.numerical_profile(self.device, dtype=prof.dtype, arm=arm_numerics,
                                             attention=choice["attention"],
                                             backend=runtime.group_backend(self.device, self.share))
        return spec, numerics, runtime.profile_digest(numerics)

    def agree(self, ledger: Any, numerics: dict[str, Any], numerics_digest: str) -> None:
        """Every rank holds the same inputs, seed and numerics; rank 0 commits the profile."""
        from training import comm  # torch: see the class's docstring
        from training.trainer import all_or_none

        t0 = time.perf_counter()
        if self.info.world_size > 1:
            with ledger.phase("control"):
                for name, digest in (("prepared-input", self.prepared_digest),
                                     ("seed receipt", self.seed_receipt["digest"]),
                                     ("numerical-profile", numerics_digest)):
                    comm.agree(name, digest, self.device)
        with ledger.phase("control"), all_or_none("committing the numerical profile", self.device):
            if self.info.rank == 0:
                _commit_profile(self.home, self.arm.name, numerics, numerics_digest)
        self.timers["agreement_and_commit_seconds"] = time.perf_counter() - t0

    def make_trainer(self, model: Any, spec: Any, ledger: Any) -> Any:
        """The trainer, checked against the committed schedule's weighted target counts."""
        from training.trainer import Trainer  # torch: see the class's docstring

        trainer = Trainer(model, self.corpus, spec, self.device, self.pad_id, ledger)
        if [trainer.global_weights[u] for u in range(spec.updates)] != self.committed_w:
            raise TrainError(f"the weighted target counts of {self.corpus_name} differ from the committed "
                             "schedule; the prepared inputs are inconsistent — prepare again")
        self.say(f"rank {self.info.rank}/{self.info.world_size} {self.arm.name} ({self.arm.kind}): "
                 f"{spec.updates} updates, {len(spec.local_docs(0))} docs per rank per update, "
                 f"{trainer.numel:,} parameters on {self.device}")
        return trainer

    def identity(self, numerics_digest: str) -> dict[str, Any]:
        """What every checkpoint receipt and manifest of this run names."""
        return {"experiment": self.cfg.experiment.name, "profile": self.cfg.profile_name, "arm": self.arm.name,
                "rank": self.info.rank, "world_size": self.info.world_size,
                "prepared_digest": self.prepared_digest, "numerical_profile": numerics_digest}

    def restore(self, trainer: Any, spec: Any) -> dict[str, Any]:
        """Resume from the latest step every rank holds (`--resume`); its figures for the result."""
        from training.checkpoint import group  # torch: see the class's docstring

        return group.restore(trainer, self.rank_dir, self.info.rank, spec.updates, self.device, self.say)

    def compile(self, trainer: Any, spec: Any) -> None:
        """Under compile, one warm-up pass before the loop, entered by every rank together."""
        from training.trainer import all_or_none  # torch: see the class's docstring

        compile_s = None
        if spec.compile and trainer.update < spec.updates:
            self.say("compiling the training step (one forward/backward; nothing is applied)")
            with all_or_none("compiling the training step", self.device):  # ranks enter the loop together
                compile_s = trainer.compile_warm_up()
            self.say(f"compiled in {compile_s:.1f} s")
        self.timers["compile_warm_up_seconds"] = compile_s

    def loop(self, trainer: Any, spec: Any, ledger: Any, identity: dict[str, Any]) -> list[dict[str, Any]]:
        """The updates, a checkpoint published every `checkpoint_every`; returns their figures."""
        from training.checkpoint import group  # torch: see the class's docstring

        every = self.cfg.checkpoint_interval
        heartbeat = self.rank_dir / "heartbeat.json"
        fault = FaultPlan.from_env(self.rank_dir, self.info.rank)
        checkpoints: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        profiler = UpdateProfiler(self.arm.name, self.info.rank, trainer.update)
        while trainer.update < spec.updates:
            with profiler.around(trainer.update):
                rec = trainer.step()
            done = trainer.update
            self.say(f"update {done}/{spec.updates} loss_local {rec['loss_local']:.4f} "
                     f"grad_norm {rec['grad_norm']:.3f} {rec['seconds']:.3f} s"
                     + (" +outer" if rec["outer_step"] else ""))
            if every and (done % every == 0 or done == spec.updates):
                with ledger.phase("control"):
                    checkpoints.append(group.publish(trainer, self.rank_dir, done, identity, self.device,
                                               fault.while_publishing(done)))
                self.say(f"checkpoint step {done} published ({checkpoints[-1]['bytes'] / 1e6:.1f} MB, "
                         f"{checkpoints[-1]['seconds']:.2f} s)")
                if done < spec.updates:  # nothing runs unsupervised for long (training/lease.py)
                    with ledger.phase("control"):
                        lease.stop_if_gone(done, self.device)
            write_json_atomic(heartbeat, {"update": done, "time": time.time(), "pid": os.getpid()})
            fault.after_update(done)
        self.timers["updates_seconds"] = time.perf_counter() - t0
        return checkpoints

    def finish(self, model: Any, ledger: Any, numerics_digest: str) -> tuple[str, dict[str, Any] | None]:
        """Agree on the final parameters; rank 0 writes the model. Returns their digest and its receipt."""
        from training import comm  # torch: see the class's docstring
        from training.trainer import all_or_none, parameter_digest

        t0 = time.perf_counter()
        final_digest = parameter_digest(model)
        with ledger.phase("control"):
            if self.info.world_size > 1:
                comm.agree("final-parameters", final_digest, self.device)
        model_receipt = None
        with ledger.phase("control"), all_or_none("writing the final model", self.device):
            if self.info.rank == 0:
                model_receipt = _write_model(model, self.model_dir, self.rd / "model", meta={
                    "experiment": self.cfg.experiment.name, "profile": self.cfg.profile_name,
                    "arm": self.arm.name, "parameters_sha256": final_digest,
                    "seed_receipt": self.seed_receipt["digest"], "prepared_digest": self.prepared_digest,
                    "numerical_profile": numerics_digest})
        self.timers["final_agreement_and_model_seconds"] = time.perf_counter() - t0
        return final_digest, model_receipt

    def result(self, trainer: Any, spec: Any, ledger: Any, numerics: dict[str, Any], numerics_digest: str,
               final_digest: str, model_receipt: dict[str, Any] | None, net: dict[str, Any],
               checkpoints: list[dict[str, Any]], restored: dict[str, Any] | None) -> dict[str, Any]:
        """This rank's `result.json` (RESULT_FORMAT): its fields and their order are the format."""
        from training import runtime  # torch: see the class's docstring

        info, device, arm = self.info, self.device, self.arm
        every = self.cfg.checkpoint_interval
        return {
            "format": RESULT_FORMAT,
            "experiment": self.cfg.experiment.name, "profile": self.cfg.profile_name,
            "arm": arm.model_dump(mode="json"),
            "rank": info.rank, "world_size": info.world_size,
            "identity": {"rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank,
                         "master_addr": info.master_addr, "master_port": info.master_port,
                         "device": str(device)},
            "digests": {"prepared": self.prepared_digest, "seed_receipt": self.seed_receipt["digest"],
                        "numerical_profile": numerics_digest, "final_parameters": final_digest},
            "parameters": trainer.numel,
            "numerical_profile": numerics,
            "runtime": runtime.runtime_settings(device),
            "updates": trainer.journal,
            "comm": comm_figures(ledger, trainer.numel, spec.updates),
            "network": {**net, "delta": runtime.net_delta(net["after"], net["before"]),
                        "note": "whole-host interface counters: include all other traffic on the host"},
            "timers": {**self.timers,
                       "note": "training_loop = first update through final model write, read-back "
                               "verification and parameter agreement; under compile, the compilation runs "
                               "before it (compile_warm_up_seconds)"},
            "checkpoints": {"every": every, "published": checkpoints, "restored": restored,
                            "io": (io_baseline(self.rank_dir, checkpoints, restored)
                                   if os.environ.get("TRIAL_IO_BASELINE") == "1" else None)},
            "model": ({"dir": f"runs/{arm.name}/model", "receipt_digest": model_receipt["digest"]}
                      if model_receipt else None),
            "resources": runtime.process_figures(device),
            "process_seconds_in_train": time.perf_counter() - self.t_start,
        }

    def leave_group(self) -> None:
        import torch.distributed as dist  # see the class's docstring

        if dist.is_initialized():
            dist.destroy_process_group()


def comm_figures(ledger: Any, numel: int, updates: int) -> dict[str, Any]:
    """The ledger's counts, and the training payload set against a dense gradient's bytes."""
    totals = ledger.snapshot()
    train_payload = sum(totals.get(k, {}).get("payload_bytes", 0) for k in ("gradient", "outer-delta"))
    return {
        "by_label": totals,
        "by_collective": {k: dict(v) for k, v in ledger.ops.items()},
        "training_payload_bytes": train_payload,
        "training_payload_bytes_per_update": train_payload / updates,
        "dense_gradient_bytes_per_update": numel * 4,
        "note": "logical payload handed to collectives by this rank; ring wire bytes per rank "
                "= 2(N-1)/N x payload for all-reduce",
    }


def main_say(rank: int) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if rank == 0:
            print(msg, file=sys.stderr, flush=True)
    return say
