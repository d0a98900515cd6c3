"""Shared fixtures: one tiny seed and one prepared smoke home per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_seed(tmp_path_factory) -> Path:
    from training.seed import materialize

    out = tmp_path_factory.mktemp("seeds") / "tiny"
    materialize("tiny", out)
    return out


@pytest.fixture(scope="session")
def smoke_home(tmp_path_factory, tiny_seed) -> Path:
    """cooperative-learning/smoke prepared once; tests that alter it must work on a copy."""
    from training.config import resolve
    from training.prepare import prepare

    home = tmp_path_factory.mktemp("homes") / "coop"
    prepare(resolve("cooperative-learning", "smoke"), home, tiny_seed)
    return home


@pytest.fixture
def home_copy(smoke_home, tmp_path) -> Path:
    dst = tmp_path / "home"
    shutil.copytree(smoke_home, dst)
    return dst


def run_cli(*args: str, stdin: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)
