"""The strict answer checker lives in `evidence.checker`: the report re-checks every raw answer, and
`evidence` imports nothing of ours. This name is kept for the host-side stages."""

from evidence.checker import *  # noqa: F401,F403
from evidence.checker import check_answer, parse_strict  # noqa: F401
