"""One training loop for every arm; the arms differ only in small decisions their kind makes.

| arm       | engine                     | loss scale per microbatch      | after the optimizer step   |
|-----------|----------------------------|--------------------------------|----------------------------|
| single    | the model                  | 1 / W (global weighted targets)| —                          |
| ddp       | DDP, allreduce hook        | N / W  (DDP divides by N)      | —                          |
| powersgd  | DDP, PowerSGD hook         | N / W                          | —                          |
| diloco    | the model (no per-step sync)| 1 / W_r (this worker's targets)| every H updates: outer step|

Each row is one module of `training.arms`; this loop asks the spec's kind for its engine, loss scale,
outer step and extra state, and never names a kind. With N ranks each holding 1/N of the update's
documents, the DDP average of N·g_r/W is Σ_r g_r / W, the single-process objective exactly.
Microbatches before the last run under `no_sync` (forward included), so one reduction happens per
update; clipping and AdamW follow it on every rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function
import torch.distributed as dist
from torch import nn

from training.arms import CHECKPOINT_PARTS, ArmKind, Settings, kind as arm_kind
from training.comm import CHUNK_BYTES, Ledger
from training.config import check_pack
from training.corpus import Corpus
from training.errors import PeerFailed
from training.objective import WeightedResponseLoss, make_microbatches, packed_attention, weighted_targets


@dataclass
class TrainSpec:
    kind: str  # a key of training.arms.KINDS
    plan: list[list[int]]  # the global documents of every update
    lr: float
    warmup: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    microbatch: int | None = None
    world_size: int = 1
    rank: int = 0
    settings: dict[str, Any] | Settings = field(default_factory=dict)  # the kind's own (training.arms)
    autocast_dtype: torch.dtype | None = None
    sort_by_length: bool = True
    chunk_bytes: int = CHUNK_BYTES
    compile: bool = False  # torch.compile of the decoder: same math, fused kernels
    fused_optimizer: bool = False  # AdamW(fused=True) on CUDA
    pack: bool = False  # each microbatch's documents in one row, no padding (same sum)
    pack_tokens: int | None = None  # packed rows of exactly this width, filled first-fit (one graph)
    pack_rows: int = 1  # such rows per forward (objective.group_rows): the remainder goes one by one
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        self.arm: ArmKind = arm_kind(self.kind)
        if not self.arm.trains:
            raise ValueError(f"the {self.kind} arm is not trained")
        self.arm.check_world(self.world_size)
        if not isinstance(self.settings, self.arm.settings_model):
            self.settings = self.arm.settings(dict(self.settings))
        for u, docs in enumerate(self.plan):
            if len(docs) % self.world_size:
                raise ValueError(f"update {u} has {len(docs)} documents, not divisible by "
                                 f"{self.world_size} ranks")

    @property
    def updates(self) -> int:
        return len(self.plan)

    def local_docs(self, update: int) -> list[int]:
        docs = self.plan[update]
        k = len(docs) // self.world_size
        return list(docs[self.rank * k:(self.rank + 1) * k])

    def lr_at(self, update: int) -> float:
        """Linear warmup over `warmup` updates, then constant."""
        if self.warmup and update < self.warmup:
            return self.lr * (update + 1) / self.warmup
        return self.lr

    def syncs_after(self, update: int) -> bool:
        """Whether an outer synchronization follows update `update` (the kind's schedule)."""
        return self.arm.outer_step_after(update, self.updates, self.settings)


def engine_choices(spec: "TrainSpec", device: torch.device, model: nn.Module) -> dict[str, Any]:
    """What the trainer decides from its spec and device, in one place: the trainer applies these and
    train.py commits them in the numerical profile, so the record cannot drift from the run."""
    check_pack(device.type, spec.pack, spec.compile)
    return {"attention": packed_attention(device) if spec.pack else str(model.config._attn_implementation),
            "fused_optimizer": spec.fused_optimizer and device.type == "cuda",
            **spec.arm.engine_choices(spec.settings, device, model)}


PAD_MULTIPLE = 256  # microbatch widths under torch.compile: at most max_context / 256 graphs
PACK_MULTIPLE = 1024  # packed row lengths under torch.compile: under 1024 tokens of padding per row


def _allow_recompiles(widths: int) -> None:
    """Let dynamo compile one graph per possible width (its default stops at 8 and then runs the
    decoder eagerly, silently), and fail loudly if more ever occur."""
    import torch._dynamo.config as dynamo  # start-up: ~2 s after torch, needed only under compile

    dynamo.recompile_limit = max(dynamo.recompile_limit, widths + 2)
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        dynamo.fail_on_recompile_limit_hit = True


def pad_multiple(spec: TrainSpec) -> int | None:
    """What a microbatch's width is rounded up to: only under torch.compile, where every new width
    is a new graph; packed rows are several documents long, so they take a coarser step."""
    if not spec.compile:
        return None
    return PACK_MULTIPLE if spec.pack else PAD_MULTIPLE


@dataclass
class Trainer:
    model: nn.Module
    corpus: Corpus
    spec: TrainSpec
    device: torch.device
    pad_id: int
    ledger: Ledger = field(default_factory=lambda: Ledger(1))

    def __post_init__(self) -> None:
        s = self.spec
        self.model.to(self.device).train()
        choice = engine_choices(s, self.device, self.model)
        if s.pack:  # a packed row needs attention that stays inside each document
            self.model.set_attn_implementation(choice["attention"])
        self.loss = WeightedResponseLoss(self.model)
        self._warming = False
        self.engine, self.kind_state = s.arm.engine(self.loss, self.device, s.settings, choice,
                                                    lambda: self._warming)
        if s.compile:  # the decoder, in place (parameter names unchanged); widths rounded up by
            # pad_multiple() give a bounded set of static graphs, each compiled once; the loss head
            # stays eager
            _allow_recompiles(self._widths())
            self.model.get_decoder().compile(dynamic=False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=s.lr, betas=s.betas, eps=s.eps,
                                           weight_decay=s.weight_decay,
                                           **({"fused": True} if choice["fused_optimizer"] else {}))
        if self.kind_state is None:  # a kind's state comes from its engine or after the optimizer
            self.kind_state = s.arm.make_outer(self.params, s.settings, s.chunk_bytes)
        self.update = 0  # the next update to run
        self.journal: list[dict[str, Any]] = []  # every update's record, carried in checkpoints
        self.global_weights = [weighted_targets(self.corpus, docs) for docs in s.plan]

    def _widths(self) -> int:
        """How many microbatch widths (graphs) can occur: padded rows are at most the longest
        document; a packed row holds up to `microbatch` documents (or the whole local batch), or
        exactly `pack_tokens` (one row or `pack_rows` rows per forward)."""
        s, longest = self.spec, int(self.corpus.lengths.max())
        if s.pack and s.pack_tokens:
            return 1 if s.pack_rows == 1 else 2  # `pack_rows` rows, or one (group_rows)
        per_row = (s.microbatch or max(len(s.local_docs(u)) for u in range(s.updates))) if s.pack else 1
        return -(-per_row * longest // pad_multiple(s))

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def _bucket_sizes(self) -> list[int] | None:
        """DDP's current bucket sizes in bytes (as its logger reports them), None without DDP."""
        if not hasattr(self.engine, "_get_ddp_logging_data"):
            return None
        sizes = str(self.engine._get_ddp_logging_data().get("bucket_sizes", ""))
        return [int(x) for x in sizes.split(",") if x.strip()]

    def _microbatches(self, docs: list[int]) -> list:
        """This rank's documents as the update runs them (the warm-up pass must see the same)."""
        s = self.spec
        return make_microbatches(self.corpus, docs, s.microbatch, pad_id=self.pad_id,
                                 sort_by_length=s.sort_by_length, pad_multiple=pad_multiple(s), pack=s.pack,
                                 pack_tokens=s.pack_tokens, pack_rows=s.pack_rows)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.spec.autocast_dtype is None or self.device.type != "cuda":
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self.spec.autocast_dtype)

    def step(self) -> dict[str, Any]:
        """Run update `self.update`; return its record."""
        s, u = self.spec, self.update
        if u >= s.updates:
            raise IndexError(f"all {s.updates} updates already ran")
        self._sync()
        t0 = time.perf_counter()
        before = self.ledger.snapshot()
        local = s.local_docs(u)
        w_local = weighted_targets(self.corpus, local)
        w_global = self.global_weights[u]
        scale = s.arm.loss_scale(s.world_size, w_local, w_global)
        mbs = self._microbatches(local)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        with self.ledger.phase("gradient"):
            for i, mb in enumerate(mbs):
                quiet = (self.engine.no_sync() if s.arm.reduces_each_update and i < len(mbs) - 1
                         else contextlib.nullcontext())
                with quiet:
                    with record_function("trial.forward"), self._autocast():
                        part = self.engine(*mb.to(self.device).args())
                    with record_function("trial.backward"):
                        (part * scale).backward()
                loss_sum += part.detach().double()
        with record_function("trial.clip"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, s.grad_clip)
        lr = s.lr_at(u)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        with record_function("trial.optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        t_inner = time.perf_counter()
        outer = s.syncs_after(u)
        if outer:
            with self.ledger.phase("outer-delta"):
                s.arm.outer_step(self.kind_state)
            self._sync()
        t1 = time.perf_counter()
        self.update += 1
        ls = float(loss_sum)
        rec = {
            "update": u, "global_docs": list(s.plan[u]), "local_docs": local,
            "microbatches": [len(mb.docs) for mb in mbs],
            "microbatch_docs": [mb.docs for mb in mbs],  # the order they ran in
            "weighted_targets_local": w_local, "weighted_targets_global": w_global,
            "loss_sum_local": ls, "loss_local": ls / w_local,
            "loss": ls / w_global if s.world_size == 1 else None,  # global: Σ_r loss_sum / W
            "grad_norm": float(grad_norm), "lr": lr,
            **s.arm.update_record(self.kind_state, u),
            "outer_step": outer,
            "ddp_bucket_bytes": self._bucket_sizes(),
            "seconds": t1 - t0, "inner_seconds": t_inner - t0, "outer_seconds": t1 - t_inner,
            "comm": Ledger.diff(self.ledger.snapshot(), before),
        }
        self.journal.append(rec)
        return rec

    # ------------------------------------------------------------------ checkpoint state

    def state(self) -> dict[str, Any]:
        """This rank's whole training state: enough to continue bit for bit."""
        arm = self.spec.arm
        return {
            "update": self.update,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self._rng_state(),
            **{part: None for part in CHECKPOINT_PARTS},
            **({arm.checkpoint_part: arm.state_dict(self.kind_state)} if arm.checkpoint_part else {}),
            "ledger": {"totals": self.ledger.snapshot(), "ops": {k: dict(v) for k, v in self.ledger.ops.items()}},
            "journal": self.journal,
        }

    def load_state(self, state: dict[str, Any], *, warm_ddp: bool = True) -> None:
        """Restore `state()`. `warm_ddp=False` skips DDP's warm-up pass: a test shows why it is needed,
        and a run under compile leaves it to `compile_warm_up`, which runs the same pass next."""
        with torch.no_grad():
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        arm = self.spec.arm
        if arm.checkpoint_part:
            arm.load_state_dict(self.kind_state, state[arm.checkpoint_part], self.device)
        for label, t in state["ledger"]["totals"].items():
            self.ledger.totals[label].update(t)
        for k, v in state["ledger"]["ops"].items():
            self.ledger.ops[k].update(v)
        self.journal = list(state["journal"])
        self.update = int(state["update"])
        if arm.reduces_each_update and warm_ddp:
            self._warm_pass()
        self._set_rng_state(state["rng"])  # last: the warm-up pass must not be what moves any generator

    def _rng_state(self) -> dict[str, Any]:
        return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None}

    def _set_rng_state(self, rng: dict[str, Any]) -> None:
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(rng["cuda"])

    def _warm_pass(self) -> None:
        """One forward/backward of the next update's first microbatch whose reduction hook (if any)
        returns the bucket unchanged (no communication); the gradients are then dropped.

        It also gives a fresh DDP its rebuilt bucket layout: DDP re-buckets parameters by
        gradient-ready order after its first backward, and an uninterrupted run reduces (and keeps
        PowerSGD's error feedback) in that layout, so a resumed run must reach it before its first
        reduction."""
        self._warming = True
        try:
            for mb in self._warm_batches():
                with self._autocast():
                    part = self.engine(*mb.to(self.device).args())
                part.backward()
        finally:
            self._warming = False
        self.optimizer.zero_grad(set_to_none=True)

    def _warm_batches(self) -> list:
        """The next update's first microbatch and, where forwards take several packed rows
        (`pack_rows`), a one-row microbatch too: a remainder row is the step's second compiled
        shape, which would otherwise compile inside some later update's timing."""
        s = self.spec
        docs = s.local_docs(min(self.update, s.updates - 1))
        mbs = self._microbatches(docs)
        if s.compile and s.pack_tokens and s.pack_rows > 1 and mbs[0].input_ids.shape[0] > 1:
            one = make_microbatches(self.corpus, docs, s.microbatch, pad_id=self.pad_id, pack=True,
                                    pack_tokens=s.pack_tokens)[0]
            return [mbs[0], one]
        return mbs[:1]

    def compile_warm_up(self) -> float:
        """Compile before the timed loop; returns the seconds it took.

        Under torch.compile the first update would otherwise carry the compilation (about a minute at
        1.7B; bench/results/README.md, "compile warm-up"), and ranks that do not synchronize every update (DiLoCo) would then charge a
        slower rank's compilation to the next synchronization. `_warm_pass` touches no parameter,
        optimizer state or collective, and the RNG states are put back (Inductor's autotuning
        draws random inputs): a single or DiLoCo run trains bit for bit as without it (tested).
        With DDP it also rebuilds the buckets before update 0, as a resume does, so update 0
        reduces in the rebuilt layout; the sum is the same up to the reduction's order."""
        t0 = time.perf_counter()
        rng = self._rng_state()
        self._warm_pass()
        self._set_rng_state(rng)
        self._sync()
        return time.perf_counter() - t0


def parameter_digest(model: nn.Module) -> str:
    """sha256 over every parameter's name, dtype, shape and bytes, in a fixed order."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@contextlib.contextmanager
def all_or_none(what: str, device: torch.device):
    """Run a step some ranks do alone (a commit, a file write); then every rank learns whether all
    succeeded. The rank that failed re-raises its own error; the others stop at `barrier_ok`."""
    try:
        yield
    except BaseException:
        barrier_ok(False, what, device)
        raise
    barrier_ok(True, what, device)


def barrier_ok(ok: bool, what: str, device: torch.device) -> None:
    """Every rank learns whether every rank succeeded at `what`.

    A rank that failed calls this with ok=False from its error path and then re-raises its own
    error (the one that names the cause); the others stop here with a message pointing to it.
    """
    if not dist.is_initialized():
        return
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if ok and not int(flag.item()):
        raise PeerFailed(f"another rank failed at {what}; its log names the cause — this rank "
                         "stops too")
