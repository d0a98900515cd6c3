"""The errors a user can cause; the CLIs print their message alone and exit 2."""

from evidence.commitments import CommitmentError
from evidence.receipts import ReceiptError
from training.config import ConfigError
from training.prepare import PrepareError
from training.replay import ReplayFileError
from training.seed import SeedError

USER_ERRORS = (CommitmentError, ConfigError, PrepareError, ReceiptError, ReplayFileError, SeedError)
