"""What a store must offer: the `Store` protocol, which every store module implements and the
registry (`evidence.stores.registry`) names by scheme.

Every call the project makes on a store is named here — preservation (`put_file`, `size`,
`read_chunks`), its index (`put_bytes`, `read_chunks`), anchors and teardown (`list`), staging's relay
(`size`, `put_file`, `read_chunks`) — so a new store is checked against the whole list, not against
whichever path a test happens to walk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterator, Protocol

from evidence.errors import UserError

CHUNK = 1 << 20


class PreservationError(UserError, RuntimeError):
    """An object or index that does not read back as written, or a store that cannot be used."""


class Store(Protocol):
    """A flat key → bytes space under one URL. Keys are '/'-separated relative paths; the store's
    `url` followed by a key names the object in every message."""

    url: str
    form: ClassVar[str]
    """How its URL is written (`s3://BUCKET/PREFIX`): what an error about an unknown scheme lists."""
    staging_relay: ClassVar[bool]
    """Whether the hosts can fetch from it by themselves (with their own credentials, in region),
    so that staging may relay through it instead of sending every artifact over SSH to each host."""

    @classmethod
    def from_url(cls, url: str, session: Any = None, **options: Any) -> "Store":
        """The store a URL of this scheme names; refused (PreservationError) when it names none."""
        ...

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        """The file's bytes under `key`, replacing any; `sha256` for stores that check on receipt."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def size(self, key: str) -> int | None:
        """The object's size, or None when the store does not hold it (anything else raises)."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with `prefix`, sorted (objects still being written left out)."""
        ...

    def read_chunks(self, key: str) -> Iterator[bytes]: ...
