"""Small checks shared by every pydantic description of a trial (stack config, stack outputs,
cluster, requests): one wording for a validation failure, one rule for rank numbering."""

from __future__ import annotations

from typing import Any, Iterable


def explain(error: Any, whole: str = "input") -> str:
    """A pydantic ValidationError as one line: 'field.path: message; …' (`whole` names the root)."""
    return "; ".join(f"{'.'.join(map(str, x['loc'])) or whole}: {x['msg']}" for x in error.errors())


def require_ranks(ranks: Iterable[int]) -> None:
    """Hosts are ranks 0..N−1, each exactly once (raises ValueError, inside a pydantic validator)."""
    got = sorted(ranks)
    if got != list(range(len(got))):
        raise ValueError(f"host ranks must be 0..{len(got) - 1} once each, got {got}")
