"""The one type of error a user can cause: its CLIs print its message alone and exit 2.

A refusal (a damaged file of evidence, a config that does not resolve, a home another run holds, a
host that cannot be reached) is `UserError`, whichever package refuses, so that every command line
catches one type, and a new refusal is caught everywhere by being declared one. It lives here
because `evidence/` is the ground floor every package may import (training, infra and orchestrate
alike), and this module imports nothing of ours, so that declaring a refusal never drags in the
code of another.

A rank that exits `USER_ERROR_EXIT` (2) refused its own arguments, inputs or environment, which a
restart would meet again, so the supervisor does not restart it; a class whose refusal a restart
may mend says its own status (training/errors.py: `PeerFailed`, `DeviceBusy`), which `python -m
training` exits with; the controller's `orchestrate` exits 2 for every refusal it meets itself.
"""

USER_ERROR_EXIT = 2


class UserError(Exception):
    """An error the user can cause: the CLIs print its message alone and exit 2; a rank (`python -m
    training`) exits with its `exit_code` (2 unless a subclass says otherwise)."""

    exit_code: int = USER_ERROR_EXIT
