"""The stores by URL scheme: adding a store is one module implementing `evidence.stores.base.Store`
and one entry in `STORES`. `open_store`, the CLI's help and a cluster description's check
(`orchestrate.cluster`) all read this table, so no other file spells a scheme."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from evidence.stores.base import PreservationError, Store
from evidence.stores.file import FileStore
from evidence.stores.s3 import S3Store

STORES: dict[str, type[Store]] = {
    "file": FileStore,
    "s3": S3Store,
}


def store_class(url: str, *, whole: bool = True) -> type[Store]:
    """The class that serves `url`'s scheme, without opening anything (a cluster description is
    checked with this, on a controller that may lack the store's client library); refused naming the
    known schemes. `whole`: the URL must also be written out, `scheme://` and a location, as a
    cluster description must; opening a store asks only for a known scheme (`file:/dir` opens)."""
    scheme = urlparse(url).scheme
    cls = STORES.get(scheme)
    if whole and not (url.startswith(f"{scheme}://") and url[len(scheme) + 3:]):
        cls = None
    if cls is None:
        raise PreservationError(f"unknown evidence store '{url}' (known: {known_forms()})")
    return cls


def known_forms() -> str:
    """Every registered store's URL form, for messages and help: `file://DIR, s3://BUCKET/PREFIX`."""
    return ", ".join(c.form for c in STORES.values())


def open_store(url: str, session: Any = None, **options: Any) -> Store:
    """The store `url` names; `options` go to its class (an S3 store's `multipart_mb`)."""
    return store_class(url, whole=False).from_url(url, session, **options)
