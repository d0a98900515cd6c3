"""Evidence stores: the protocol a store implements (`base`), one module per store (`file`, `s3`),
the registry of schemes (`registry`), preservation through any of them (`preserve`), and what it
writes and returns (`records`).

Adding a store: a module with a class that implements `base.Store`, and its entry in
`registry.STORES`. Everything else — preservation, anchors, staging's relay, teardown's check, a
cluster description's `store` — reaches stores through `open_store` and `store_class`."""

from evidence.stores.base import CHUNK, PreservationError, Store
from evidence.stores.file import FileStore
from evidence.stores.preserve import (HOST_PAYLOAD, PRESERVED, object_key, parse_index, preserve, preserve_part,
                                      read_preserved, remote_payloads, staging_key, verify_index)
from evidence.stores.records import Anchors, HostPayloadsLeft, Index, IndexEntry, Preserved, Verified
from evidence.stores.registry import STORES, known_forms, open_store, store_class
from evidence.stores.s3 import S3Store

__all__ = ["CHUNK", "HOST_PAYLOAD", "PRESERVED", "STORES", "Anchors", "FileStore", "HostPayloadsLeft", "Index",
           "IndexEntry", "PreservationError", "Preserved", "S3Store", "Store", "Verified", "known_forms", "object_key",
           "open_store", "parse_index", "preserve", "preserve_part", "read_preserved", "remote_payloads",
           "staging_key", "store_class", "verify_index"]
