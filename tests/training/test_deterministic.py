"""CI keeps the recovery exact (#57): the training step of every arm kind, with the profile's
`deterministic = true`, uses no operation that torch's deterministic mode refuses on CUDA.

On the CPU torch raises for few ops, so a step that runs clean here proves little by itself. The test
therefore also records every aten op one update of each kind runs (a TorchDispatchMode, in this process,
on the tiny seed; the ranks of a multi-rank kind as rank 0 of two over torch's fake process group, whose
collectives return at once) and refuses any op that deterministic mode alerts on for CUDA tensors with no
deterministic implementation there. That list, `ALERTS_ON_CUDA`, is read from torch's own sources:

  - torch/__init__.py, `use_deterministic_algorithms`'s docstring (the installed 2.13): the ops that "will
    throw a RuntimeError when mode=True" (the ones it lists as acting deterministically are allowed);
  - the `globalContext().alertNotDeterministic(...)` sites of aten/src/ATen/native/cuda/ (pytorch/pytorch):
    e.g. ScatterGatherKernel.cu `scatter_add_cuda` (deterministic under the mode through index_put),
    NLLLoss2d.cu `nll_loss2d_forward_out_cuda_template` and Loss.cu's nll_loss forward (only with a sum or
    mean reduction), AdaptiveAveragePooling3d.cu, EmbeddingBag.cu `embedding_bag_backward_cuda_max`,
    LossCTC.cu `ctc_loss_backward_gpu`, GridSampler.cu, SummaryOps.cu (histc, bincount with weights),
    Sorting.cu (median with indices), ReduceOps/ScanKernels (floating cumsum).

A CPU trace cannot see which kernel CUDA would pick (SDPA's backend, cuBLAS's split): that is what the
GPU runs in bench/results/ measure. What it does catch is a step that starts to use one of these ops.
The second test shows the option reaches real ranks: their committed numerical profile says it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_ranks
from dist_cases import case
from evidence.canonical import read_json
from evidence.commitments import CommitmentLog
from training.arms import KINDS
from training.config import resolve
from training.prepare import prepare
from training.runtime import DETERMINISTIC_CUBLAS
from training.trainer import Trainer, TrainSpec

Args = tuple[Any, ...]


def _always(args: Args, kwargs: dict[str, Any]) -> bool:
    return True


def _reduced(args: Args, kwargs: dict[str, Any]) -> bool:  # nll_loss{,2d}_forward(self, target, weight, reduction, …)
    return (args[3] if len(args) > 3 else kwargs.get("reduction", 1)) != 0  # 0: Reduction::None


def _floating(args: Args, kwargs: dict[str, Any]) -> bool:  # cumsum(self, dim, dtype=None)
    dtype = kwargs.get("dtype") or (args[2] if len(args) > 2 else None) or args[0].dtype
    return dtype.is_floating_point or dtype.is_complex


def _weighted(args: Args, kwargs: dict[str, Any]) -> bool:  # bincount(self, weights=None, minlength=0)
    return (args[1] if len(args) > 1 else kwargs.get("weights")) is not None


def _prod(args: Args, kwargs: dict[str, Any]) -> bool:  # scatter_reduce(self, dim, index, src, reduce, …)
    return (args[4] if len(args) > 4 else kwargs.get("reduce")) == "prod"


def _max_mode(args: Args, kwargs: dict[str, Any]) -> bool:  # _embedding_bag_backward(…, mode, …): 2 is max
    return 2 in [a for a in args if isinstance(a, int) and not isinstance(a, bool)][:4]


ALERTS_ON_CUDA: dict[str, Callable[[Args, dict[str, Any]], bool]] = {
    # aten op (overload packet) → when its CUDA kernel alerts with no deterministic implementation
    **{op: _always for op in (
        "avg_pool3d_backward", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
        "adaptive_max_pool2d_backward", "fractional_max_pool2d_backward", "fractional_max_pool3d_backward",
        "max_unpool2d", "max_unpool3d", "upsample_linear1d_backward", "upsample_bilinear2d_backward",
        "upsample_bicubic2d_backward", "upsample_trilinear3d_backward", "_upsample_bilinear2d_aa_backward",
        "_upsample_bicubic2d_aa_backward", "reflection_pad1d_backward", "reflection_pad2d_backward",
        "reflection_pad3d_backward", "_ctc_loss_backward", "put", "put_", "histc", "median", "nanmedian",
        "grid_sampler_2d_backward", "grid_sampler_3d_backward", "_embedding_bag_dense_backward")},
    "nll_loss_forward": _reduced, "nll_loss2d_forward": _reduced,
    "cumsum": _floating, "cumsum_": _floating,
    "bincount": _weighted, "scatter_reduce": _prod, "scatter_reduce_": _prod,
    "_embedding_bag_backward": _max_mode,
}


class Ops(TorchDispatchMode):
    """Every aten op run under it, by name, and those ALERTS_ON_CUDA flags with their arguments' say."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()
        self.flagged: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.seen[name] += 1
        alerts = ALERTS_ON_CUDA.get(name)
        if alerts is not None and alerts(args, kwargs):
            self.flagged.append(str(func))
        return func(*args, **kwargs)


SETTINGS = {"single": {}, "ddp": {}, "diloco": {"sync_every": 1, "outer_lr": 0.7, "outer_momentum": 0.9},
            "powersgd": {"powersgd_rank": 2, "dense_warmup": 2}}
UPDATES = {"powersgd": 3}  # past its dense warm-up: the third update compresses


class _Done:
    """An asynchronous all-reduce's handle whose future holds [the tensor], as gloo's does: the fake group's
    holds None, which DDP's and PowerSGD's hooks (`fut.value()[0]`) cannot read."""

    def __init__(self, tensor: torch.Tensor):
        self.fut: torch.futures.Future = torch.futures.Future()
        self.fut.set_result([tensor])

    def get_future(self) -> torch.futures.Future:
        return self.fut

    def wait(self) -> bool:
        return True


@pytest.fixture
def fake_pair(monkeypatch):
    """This process as rank 0 of two: every collective returns at once (a sum of one, as if the other rank
    sent zeros), the ranks' own ops all run here."""
    real = dist.all_reduce

    def all_reduce(tensor, *args, async_op=False, **kwargs):
        work = real(tensor, *args, async_op=async_op, **kwargs)
        return _Done(tensor) if async_op else work

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def test_every_arm_kinds_step_uses_only_ops_deterministic_on_cuda(tiny_seed, fake_pair):
    from transformers import AutoModelForCausalLM

    trained = [k for k, kind in KINDS.items() if kind.trains]
    assert sorted(trained) == sorted(SETTINGS), "a new arm kind: give it settings here so its step is checked"
    corpus, plan = case("unequal")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # as configure_numerics sets it: an op torch refuses raises here
    try:
        for name in trained:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32)
            spec = TrainSpec(kind=name, plan=plan[:UPDATES.get(name, 1)], lr=1e-3, settings=SETTINGS[name],
                             world_size=KINDS[name].min_ranks)
            tr = Trainer(model, corpus, spec, torch.device("cpu"), pad_id=2)
            with Ops() as ops:
                recs = [tr.step() for _ in range(spec.updates)]
            assert ops.flagged == [], (name, ops.flagged)
            # the trace saw the whole step: forward, backward, the optimizer, and the kind's reduction
            assert {"mm", "embedding_dense_backward", "nll_loss_forward", "addcdiv_",
                    "_scaled_dot_product_flash_attention_for_cpu_backward"} <= set(ops.seen), (name, sorted(ops.seen))
            if name != "single":
                assert ops.seen["allreduce_"] >= 1, (name, sorted(ops.seen))
            if name == "powersgd":  # the compressed update: P = M Q, batched
                assert ops.seen["bmm"] >= 1, sorted(ops.seen)
            assert all(r["grad_norm"] > 0 for r in recs)
    finally:
        torch.use_deterministic_algorithms(was)


def test_alerts_are_caught_when_used():
    """The recorder itself flags what it must: a floating cumsum and a reduced NLL loss, not their
    allowed forms."""
    x = torch.randn(4, 3)
    with Ops() as ops:
        torch.cumsum(torch.arange(4), 0)
        torch.nn.functional.nll_loss(x.log_softmax(-1), torch.tensor([0, 1, 2, 0]), reduction="none")
    assert ops.flagged == []
    with Ops() as ops:
        torch.cumsum(x, 0)
        torch.nn.functional.nll_loss(x.log_softmax(-1), torch.tensor([0, 1, 2, 0]))
    assert ops.flagged == ["aten.cumsum.default", "aten.nll_loss_forward.default"]


def test_the_option_reaches_the_ranks(tmp_path, tiny_seed):
    """cooperative-learning at smoke, its profile given `deterministic = true`, 16 documents and two updates: the single
    arm and the DDP pair (real rank processes, `python -m training train`) commit a numerical profile that
    says deterministic algorithms were on, with cuBLAS's workspace setting recorded."""
    cfg = resolve("cooperative-learning", "smoke")
    cfg = cfg.model_copy(update={"profile": cfg.profile.model_copy(update={"deterministic": True, "updates": 2, "tasks": 8, "replay": 8})})
    home = tmp_path / "home"
    prepare(cfg, home, tiny_seed)
    assert read_json(home / "prepared.json")["experiment"]["profile"]["deterministic"] is True
    for arm, world in (("clean-single", 1), ("clean-pair", 2)):
        codes = run_ranks([sys.executable, "-m", "training", "train", "--home", str(home), "--arm", arm,
                           "--model-dir", str(tiny_seed)], world)
        assert all(c == 0 for c, _ in codes), [out[-2000:] for _, out in codes]
        profile = read_json(home / "runs" / arm / "numerical-profile.json")
        assert profile["deterministic_algorithms"] is True, (arm, profile)
        # cuBLAS's fixed workspace, set by the rank unless the operator set one (then theirs stands)
        assert profile["env"]["CUBLAS_WORKSPACE_CONFIG"] == os.environ.get("CUBLAS_WORKSPACE_CONFIG",
                                                                          DETERMINISTIC_CUBLAS), profile["env"]
    committed = {e["subject"] for e in CommitmentLog(home).entries() if e["kind"] == "numerical-profile"}
    assert committed == {"runs/clean-single/numerical-profile.json", "runs/clean-pair/numerical-profile.json"}
