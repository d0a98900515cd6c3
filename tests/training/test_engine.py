"""The engine's properties (tests/training/engine_cases.py), run where they hold on a CPU: a process of
its own with ATen's default CPU kernels, as `training serve` runs a replica — and why that is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.engine import ROW_INVARIANT_CPU_KERNELS, Engine, EngineError, cpu_kernels

HERE = Path(__file__).resolve().parent


def test_the_engine_properties_hold_with_the_replicas_cpu_kernels(tiny_seed):
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", TRIAL_TEST_TINY_SEED=str(tiny_seed), PYTHONUNBUFFERED="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                        str(HERE / "engine_cases.py")], cwd=HERE.parents[1], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


@pytest.mark.skipif(cpu_kernels() == ROW_INVARIANT_CPU_KERNELS, reason="this process already runs the default kernels")
def test_vectorized_cpu_kernels_make_a_rows_result_depend_on_its_slot_so_the_engine_refuses_them():
    """Why the replica sets ATEN_CPU_CAPABILITY=default: silu (SLEEF's exp in vector lanes, libm's in the
    scalar tail) gives one row different bits in the last slot than in the first."""
    torch.manual_seed(0)
    x = torch.randn(4096)
    in_lanes = torch.nn.functional.silu(x)  # a multiple of the vector width: every element in a lane
    alone = torch.cat([torch.nn.functional.silu(x[i:i + 1]) for i in range(len(x))])  # each in the scalar tail
    assert not torch.equal(in_lanes, alone)
    from tiny_architectures import build

    with pytest.raises(EngineError, match="ATEN_CPU_CAPABILITY=default"):
        Engine(build("llama"), slots=2, max_len=32, eos=set(), device=torch.device("cpu"))
