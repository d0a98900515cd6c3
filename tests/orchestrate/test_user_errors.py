"""Every refusal the CLIs print alone and exit 2 for is one type, `evidence.errors.UserError`, declared
where every package may import it: a CLI catches that type, so a refusal missing from it would end as
a traceback instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from evidence.anchors import AnchorError
from evidence.canonical import EvidenceFileError
from evidence.commitments import CommitmentError
from evidence.covered import CoveredFileError
from evidence.errors import USER_ERROR_EXIT, UserError
from evidence.receipts import ReceiptError
from evidence.report import EvidenceError
from evidence.stores import PreservationError
from infra.keys import SSHKeyError
from orchestrate.cloud import HostKeysMissing
from orchestrate.cluster import ClusterError
from orchestrate.remote import StagingError
from orchestrate.serving import ProbeError
from orchestrate.stages.plan import PlanError
from orchestrate.transport import TransportError
from orchestrate.wheelhouse import WheelhouseError
from training.config import ConfigError
from training.errors import (DEVICE_BUSY_EXIT, PEER_FAILED_EXIT, CheckpointError, DeviceBusy, DigestMismatch,
                             PeerFailed, RuntimeSetupError, TrainError)
from training.hold import HeldError
from training.prepare import PrepareError
from training.replay import ReplayFileError
from training.seed import SeedError
from training.sources import TaskFileError

ROOT = Path(__file__).resolve().parents[2]

# each class a CLI mapped to exit 2 before UserError, with the base that code may still catch it by
EXIT_2 = {
    AnchorError: RuntimeError, CommitmentError: RuntimeError, ConfigError: ValueError,
    CoveredFileError: RuntimeError, DigestMismatch: RuntimeError, EvidenceFileError: ValueError,
    HeldError: RuntimeError, PrepareError: RuntimeError, ReceiptError: RuntimeError,
    ReplayFileError: ValueError, RuntimeSetupError: RuntimeError, SeedError: RuntimeError,
    TrainError: RuntimeError, CheckpointError: RuntimeError, ProbeError: RuntimeError,
    ClusterError: ValueError, StagingError: RuntimeError, TransportError: RuntimeError, PlanError: ValueError,
    HostKeysMissing: RuntimeError, PreservationError: RuntimeError, EvidenceError: RuntimeError,
    TaskFileError: ValueError, WheelhouseError: ValueError, SSHKeyError: ValueError,
}


@pytest.mark.parametrize("cls", EXIT_2, ids=lambda c: c.__name__)
def test_every_refusal_a_cli_exits_2_for_is_a_user_error(cls):
    assert issubclass(cls, UserError) and issubclass(cls, EXIT_2[cls])
    assert cls("x").exit_code == USER_ERROR_EXIT == 2


def test_a_refusal_a_restart_may_mend_keeps_its_own_status():
    assert PeerFailed("x").exit_code == PEER_FAILED_EXIT == 3
    assert DeviceBusy("x").exit_code == DEVICE_BUSY_EXIT == 75
    assert issubclass(PeerFailed, UserError) and issubclass(DeviceBusy, UserError)


def test_the_user_error_module_imports_nothing_of_ours():
    """evidence/errors.py is the floor every package stands on: importing it must pull in no other module
    of ours (nor close an import circle)."""
    tree = ast.parse((ROOT / "evidence" / "errors.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += ["." * n.level + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    ours = ("evidence", "training", "infra", "orchestrate")
    assert [m for m in imported if m.startswith(".") or m.split(".")[0] in ours] == []
