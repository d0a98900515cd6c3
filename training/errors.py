"""The training stage's refusals, and the exit status of each kind of rank failure.

A rank that exits 2 (`USER_ERROR_EXIT`, evidence/errors.py) refused its own arguments, inputs or
environment, which a restart would meet again, so the supervisor does not restart it. A rank that
stops because another failed exits 3 (`PEER_FAILED_EXIT`), since the other's failure may be one a
restart mends; one whose GPU is held by another job exits 75 (`DEVICE_BUSY_EXIT`, sysexits' "try
again later"), since that job may end. Every class here is a `UserError`, which says its own status
(`exit_code`).

They are defined here rather than beside the code that raises them, so that catching them (every
CLI does) never imports torch.
"""

from evidence.errors import UserError

PEER_FAILED_EXIT = 3
DEVICE_BUSY_EXIT = 75


class TrainError(UserError, RuntimeError):
    """A run that must not start or continue; the message names the thing and the fix."""


class CheckpointError(TrainError):
    """A checkpoint or manifest that cannot be used; the message names rank and file."""


class PeerFailed(TrainError):
    """Another rank failed at a step every rank must pass; its log names the cause."""

    exit_code = PEER_FAILED_EXIT


class DigestMismatch(UserError, RuntimeError):
    """Ranks disagree about something that must be identical; the message names every digest."""


class RuntimeSetupError(UserError, RuntimeError):
    """The rank's environment is incomplete or its device is busy."""


class DeviceBusy(RuntimeSetupError):
    """Another training or evaluation job holds the rank's GPU."""

    exit_code = DEVICE_BUSY_EXIT
