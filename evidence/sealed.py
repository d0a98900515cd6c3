"""A record that carries its own digest: the sha256 of its canonical JSON without the `digest` field
(a preservation record, a recovery comparison), so a reader can tell a damaged one from a whole one."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from evidence.canonical import canonical_sha256


class Sealed(BaseModel):
    """Subclasses declare `digest: str` among their fields."""

    digest: str

    @classmethod
    def sealed(cls, **fields: Any) -> Any:
        """The record of `fields`, its digest computed over them."""
        unsealed = cls.model_validate({**fields, "digest": ""})
        return unsealed.model_copy(update={"digest": canonical_sha256(unsealed.body(exclude_digest=True))})

    def body(self, *, exclude_digest: bool = False) -> dict[str, Any]:
        """The JSON object written (without `digest`: what the digest is computed over)."""
        return self.model_dump(mode="json", exclude={"digest"} if exclude_digest else None)
