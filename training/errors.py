"""The errors a user can cause; the CLIs print their message alone and exit 2 (`USER_ERROR_EXIT`).

A rank that exits 2 refused its own arguments, inputs or environment, which a restart would meet
again, so the supervisor does not restart it. A rank that stops because another failed exits 3
(`PEER_FAILED_EXIT`), since the other's failure may be one a restart mends; one whose GPU is held by
another job exits 75 (`DEVICE_BUSY_EXIT`, sysexits' "try again later"), since that job may end.
An error class says its own status (`exit_code`); the others exit 2.

The training-stage errors are defined here rather than beside the code that raises them, so that
importing this tuple (every CLI does) never imports torch.
"""

from evidence.anchors import AnchorError
from evidence.canonical import EvidenceFileError
from evidence.commitments import CommitmentError
from evidence.covered import CoveredFileError
from evidence.receipts import ReceiptError
from training.config import ConfigError
from training.hold import HeldError
from training.prepare import PrepareError
from training.replay import ReplayFileError
from training.seed import SeedError


class TrainError(RuntimeError):
    """A run that must not start or continue; the message names the thing and the fix."""


USER_ERROR_EXIT = 2
PEER_FAILED_EXIT = 3
DEVICE_BUSY_EXIT = 75


class CheckpointError(TrainError):
    """A checkpoint or manifest that cannot be used; the message names rank and file."""


class PeerFailed(TrainError):
    """Another rank failed at a step every rank must pass; its log names the cause."""

    exit_code = PEER_FAILED_EXIT


class DigestMismatch(RuntimeError):
    """Ranks disagree about something that must be identical; the message names every digest."""


class RuntimeSetupError(RuntimeError):
    """The rank's environment is incomplete or its device is busy."""


class DeviceBusy(RuntimeSetupError):
    """Another training or evaluation job holds the rank's GPU."""

    exit_code = DEVICE_BUSY_EXIT


# EvidenceFileError: a damaged file of evidence (a rank meeting one refuses, and is not restarted)
USER_ERRORS = (AnchorError, CommitmentError, ConfigError, CoveredFileError, DigestMismatch, EvidenceFileError,
               HeldError, PrepareError, ReceiptError, ReplayFileError, RuntimeSetupError, SeedError, TrainError)
