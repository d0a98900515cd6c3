"""Adding an evidence store is one class and one registry entry: a toy in-memory store (`mem://NAME`),
registered for the test alone, carries a preservation and its verification end to end, and a
cluster description takes its scheme; a scheme nobody registered is refused, naming those that are."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterator

import pytest
from pydantic import ValidationError

from evidence.stores import STORES, PreservationError, Store, open_store, preserve, read_preserved, verify_index

SPACES: dict[str, dict[str, bytes]] = {}  # mem://NAME → its objects, shared by every store opened on it


class MemStore:
    """A dictionary behind the `Store` protocol: nothing else of the project is told about it."""

    form: ClassVar[str] = "mem://NAME"
    staging_relay: ClassVar[bool] = True  # as if the hosts could reach it: the cluster reads this

    def __init__(self, name: str):
        self.url, self.objects = f"mem://{name}/", SPACES.setdefault(name, {})

    @classmethod
    def from_url(cls, url: str, session: Any = None, **options: Any) -> "MemStore":
        return cls(url.removeprefix("mem://").strip("/"))

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        self.objects[key] = path.read_bytes()

    def put_bytes(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def size(self, key: str) -> int | None:
        return len(self.objects[key]) if key in self.objects else None

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def read_chunks(self, key: str) -> Iterator[bytes]:
        yield self.objects[key]


PROTOCOL = sorted(n for n in (*vars(Store), *Store.__annotations__) if not n.startswith("_"))


def test_the_protocol_names_what_every_registered_store_offers():
    assert PROTOCOL == ["form", "from_url", "list", "put_bytes", "put_file", "read_chunks", "size", "staging_relay",
                        "url"]
    for cls in [*STORES.values(), MemStore]:
        assert [n for n in PROTOCOL if n != "url" and not hasattr(cls, n)] == [], cls


@pytest.fixture
def mem(monkeypatch):
    monkeypatch.setitem(STORES, "mem", MemStore)  # the one registry entry
    SPACES.clear()
    return MemStore


def test_a_registered_store_preserves_and_verifies(mem, tmp_path):
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    (home / "prepared.json").write_text('{"a": 1}')
    (home / "runs" / "result.json").write_text('{"loss": 0.5}')
    store = open_store("mem://evidence")
    assert isinstance(store, MemStore) and all(hasattr(store, n) for n in PROTOCOL)
    rec = preserve(home, "mem://evidence", trial="toy")
    assert rec.store == "mem://evidence/" and rec.files == 2
    assert read_preserved(home).index == rec.index
    assert verify_index("mem://evidence", rec.index, rec.index_sha256).files == 2
    key = next(k for k in SPACES["evidence"] if k.startswith("objects/") and SPACES["evidence"][k] == b'{"a": 1}')
    SPACES["evidence"][key] = b'{"a": 2}'  # same size, other bytes: the read-back finds it, by file name
    with pytest.raises(PreservationError, match="prepared.json: .* reads back as"):
        verify_index("mem://evidence", rec.index, rec.index_sha256)


def _cluster(store: str, **kw: Any):
    from orchestrate.cluster import Cluster

    return Cluster(source="local", store=store, hosts=[
        {"rank": 0, "name": "local-0", "transport": "local", "address": "127.0.0.1",
         "private_address": "127.0.0.1", "root": "/tmp"}], **kw)


def test_a_cluster_takes_a_registered_scheme_and_its_relay_property(mem):
    assert _cluster("mem://evidence").store == "mem://evidence"
    assert _cluster("mem://evidence", staging="relay").relay == "mem://evidence"  # MemStore.staging_relay
    with pytest.raises(ValidationError, match="needs the trial's bucket .*mem://NAME"):
        _cluster("file:///tmp/store", staging="relay")  # FileStore.staging_relay is False


def test_an_unknown_scheme_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(PreservationError, match=r"unknown evidence store 'mem://x' \(known: file://DIR, s3://"):
        open_store("mem://x")
    with pytest.raises(ValidationError, match=r"unknown evidence store 'ftp://x/y' \(known: file://DIR, s3://"):
        _cluster("ftp://x/y")
    with pytest.raises(ValidationError, match="unknown evidence store 's3://'"):
        _cluster("s3://")  # a scheme and nothing after it names no store
    with pytest.raises(ValidationError, match="unknown evidence store 'S3://b/p'"):
        _cluster("S3://b/p")  # a cluster description writes the URL out as the registry spells it


def test_opening_asks_only_for_a_known_scheme(tmp_path):
    """Opening a store takes the short forms it always took (`file:/dir`); a cluster description
    must write the URL out (above)."""
    assert open_store(f"file:{tmp_path}").root == tmp_path
    with pytest.raises(PreservationError, match="an s3 URL names a bucket"):
        open_store("s3://")
