"""The errors a user can cause; the CLIs print their message alone and exit 2.

The training-stage errors are defined here rather than beside the code that raises them, so that
importing this tuple (every CLI does) never imports torch.
"""

from evidence.commitments import CommitmentError
from evidence.receipts import ReceiptError
from training.config import ConfigError
from training.prepare import PrepareError
from training.replay import ReplayFileError
from training.seed import SeedError


class TrainError(RuntimeError):
    """A run that must not start or continue; the message names the thing and the fix."""


class DigestMismatch(RuntimeError):
    """Ranks disagree about something that must be identical; the message names every digest."""


class RuntimeSetupError(RuntimeError):
    """The rank's environment is incomplete or its device is busy."""


USER_ERRORS = (CommitmentError, ConfigError, DigestMismatch, PrepareError, ReceiptError, ReplayFileError,
               RuntimeSetupError, SeedError, TrainError)
