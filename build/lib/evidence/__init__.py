"""Evidence: canonical receipts, the commitments log, stores, statistics and the report.

This package imports nothing else of ours, so every other package (including `training/`, which is
installed on GPU hosts) may depend on it.
"""

from evidence.canonical import canonical_bytes, canonical_sha256, file_sha256, write_json_atomic
from evidence.commitments import CommitmentError, CommitmentLog
from evidence.receipts import ReceiptError, make_receipt, verify_receipt

__all__ = [
    "CommitmentError",
    "CommitmentLog",
    "ReceiptError",
    "canonical_bytes",
    "canonical_sha256",
    "file_sha256",
    "make_receipt",
    "verify_receipt",
    "write_json_atomic",
]
