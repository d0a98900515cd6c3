"""The commitments log anchored in the evidence store (file:// and moto's S3): a log rewritten with
every hash recomputed verifies as a chain, and is refused against its anchors."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from evidence.anchors import AnchorError, anchor_log, check_anchors
from evidence.canonical import canonical_bytes
from evidence.commitments import CommitmentLog, _entry_hash
from evidence.stores import open_store


def make_home(home):
    home.mkdir(parents=True)
    log = CommitmentLog(home)
    (home / "prepared.json").write_text('{"inputs": {}}')
    log.append("prepare", "prepared.json")
    for i in range(3):
        (home / f"profile-{i}.json").write_text(json.dumps({"arm": i}))
        log.append("numerical-profile", f"profile-{i}.json", {"arm": i})
    return log


def rehash_from(log: CommitmentLog, seq: int, edit) -> None:
    """Edit entry `seq` and recompute every hash and link from it on: the chain verifies again."""
    entries = [json.loads(x) for x in log.path.read_text().splitlines()]
    edit(entries[seq])
    for i in range(seq, len(entries)):
        entries[i]["prev"] = entries[i - 1]["hash"] if i else "0" * 64
        entries[i]["hash"] = _entry_hash(entries[i])
    log.path.write_bytes(b"".join(canonical_bytes(e) + b"\n" for e in entries))
    assert len(log.entries()) == len(entries)  # the rewritten chain is internally consistent


@pytest.fixture(params=["file", "s3"])
def store_url(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    aws = request.getfixturevalue("aws")
    aws.client("s3").create_bucket(Bucket="evidence-anchors")
    return "s3://evidence-anchors/trials"


def test_a_fully_rehashed_rewrite_is_refused(tmp_path, store_url):
    home = tmp_path / "trial-a"
    log = make_home(home)
    store = open_store(store_url)
    assert anchor_log(home, store)["added"] == 4
    assert anchor_log(home, store)["added"] == 0  # already there: nothing written twice
    got = check_anchors(log.entries(), store, "trial-a")
    assert (got["anchored"], got["not_anchored"]) == (4, [])

    # entry 2 rewritten, its file changed to match, every later hash recomputed
    (home / "profile-1.json").write_text(json.dumps({"arm": "forged"}))
    from evidence.canonical import file_sha256

    rehash_from(log, 2, lambda e: e.update(sha256=file_sha256(home / "profile-1.json")))
    for e in log.entries():
        log.verify_subject(e)  # every committed file matches the rewritten log
    with pytest.raises(AnchorError, match="commitment 2 .* differs from its anchor .*: the log was rewritten"):
        check_anchors(log.entries(), store, "trial-a")
    with pytest.raises(AnchorError, match="commitment 2 .* differs from its anchor"):
        anchor_log(home, store)  # nor can the rewrite be anchored over the original
    r = run_cli("-m", "evidence", "verify", "--home", str(home), "--store", store_url)
    assert r.returncode == 2 and "commitment 2" in r.stderr and "Traceback" not in r.stderr, r.stderr

    # the first entry rewritten too: the log now starts a namespace the store never saw
    rehash_from(log, 0, lambda e: e.update(at="2026-01-01T00:00:00.000000+00:00"))
    with pytest.raises(AnchorError, match="already holds the anchors of another log"):
        check_anchors(log.entries(), store, "trial-a")


def test_a_cut_log_and_an_unanchored_tail(tmp_path, store_url):
    home = tmp_path / "trial-b"
    log = make_home(home)
    store = open_store(store_url)
    anchor_log(home, store)
    (home / "profile-9.json").write_text("{}")
    log.append("numerical-profile", "profile-9.json")  # made after the last anchoring: shown, not refused
    assert check_anchors(log.entries(), store, "trial-b")["not_anchored"] == [4]
    lines = log.path.read_text().splitlines(keepends=True)
    log.path.write_text("".join(lines[:3]))  # the last anchored entry and the tail cut off
    with pytest.raises(AnchorError, match="commitment 3 .* is anchored .* but the log holds only 3 entries"):
        check_anchors(log.entries(), store, "trial-b")
    with pytest.raises(AnchorError, match="holds no anchors for trial other"):
        check_anchors(log.entries(), store, "other")


def test_a_log_rewritten_from_its_first_entry_cannot_anchor_itself_anew(tmp_path, store_url):
    """A log rewritten from entry 0 names a chain the store never saw; anchoring it (any later stage,
    `orchestrate preserve`) would start a second chain beside the original and pass from then on: it
    is refused, and so is a store that holds two. A new trial under an old name takes another name."""
    store = open_store(store_url)
    log = make_home(tmp_path / "one" / "trial-c")
    anchor_log(log.home, store)
    rehash_from(log, 0, lambda e: e.update(at="2026-01-01T00:00:00.000000+00:00"))
    with pytest.raises(AnchorError, match="already holds the anchors of another log for trial trial-c"):
        anchor_log(log.home, store)
    fresh = make_home(tmp_path / "two" / "trial-c")  # a new trial under the old name
    with pytest.raises(AnchorError, match="give a new trial another name"):
        anchor_log(fresh.home, store)
    assert anchor_log(fresh.home, store, trial="trial-c2")["added"] == 4


def test_a_deleted_or_altered_anchor_is_refused(tmp_path):
    home = tmp_path / "trial-d"
    log = make_home(home)
    store = open_store(f"file://{tmp_path / 'store'}")
    anchor_log(home, store)
    keys = store.list("anchors/trial-d/")
    one = tmp_path / "store" / keys[1]
    body = one.read_bytes()
    one.unlink()
    with pytest.raises(AnchorError, match=f"{keys[1]}: missing"):
        check_anchors(log.entries(), store, "trial-d")
    one.write_bytes(body.replace(b'"kind":"numerical-profile"', b'"kind":"numerical-profilf"'))
    with pytest.raises(AnchorError, match=f"{keys[1]}: damaged, it differs from commitment 1"):
        check_anchors(log.entries(), store, "trial-d")
    one.write_bytes(body)
    (tmp_path / "store" / keys[-1]).unlink()  # the last one gone: it looks like an entry not yet anchored...
    assert check_anchors(log.entries(), store, "trial-d")["not_anchored"] == [3]
    with pytest.raises(AnchorError, match=f"{keys[-1]}: missing"):  # ...unless a preservation counted it
        check_anchors(log.entries(), store, "trial-d", at_least=4)


def test_the_preserved_count_lives_in_the_store(tmp_path):
    """How many anchors a preservation found is read from the store's own indexes: a deleted last
    anchor is refused however the store is named (with or without its final slash), and with the
    home's preservation record gone (the store beside the trials folder is then found by itself)."""
    from evidence.anchors import verify_anchors
    from evidence.stores import preserve

    home = tmp_path / "trials" / "trial-e"
    log = make_home(home)
    url = f"file://{tmp_path / 'trials' / 'store'}"
    store = open_store(url)
    got = anchor_log(home, store)
    preserve(home, url, trial="trial-e", anchors={k: got[k] for k in ("prefix", "count")})
    last = tmp_path / "trials" / "store" / store.list("anchors/trial-e/")[-1]
    last.unlink()
    for given in (url, url + "/", None):
        with pytest.raises(AnchorError, match="missing .* a preservation found 4"):
            verify_anchors(home, log.entries(), given)
    (home / "preserved.json").unlink()
    with pytest.raises(AnchorError, match="missing"):
        verify_anchors(home, log.entries(), None)


def test_a_released_chain_frees_the_name_and_never_anchors_again(tmp_path, store_url):
    """A trial never preserved is let go with a release record beside its anchors (nothing deleted):
    a new log under the same name then anchors and checks, saying that the store holds a released
    chain; the released log can neither anchor again nor check as the trial's (#55)."""
    from evidence.anchors import releasable, release

    store = open_store(store_url)
    old = make_home(tmp_path / "one" / "trial-f")
    got = anchor_log(old.home, store)
    first = old.entries()[0]["hash"]
    anchors = store.list("anchors/trial-f/")
    assert releasable(store, "trial-f") == {first: 4}
    (key,) = release(store, "trial-f", home=str(old.home), files=5, size=123, reason="failed before preservation")
    assert key == f"released/trial-f/{first}.json" and got["prefix"] == f"anchors/trial-f/{first}/"
    doc = json.loads(b"".join(store.read_chunks(key)))
    assert (doc["format"], doc["trial"], doc["prefix"], doc["count"], doc["home"], doc["files"], doc["reason"]) == (
        "commitment-anchors-release-v1", "trial-f", got["prefix"], 4, str(old.home), 5, "failed before preservation")
    assert store.list("anchors/trial-f/") == anchors  # released, not deleted
    assert releasable(store, "trial-f") == {} and release(store, "trial-f", home="x", files=0, size=0, reason="r") == []

    fresh = make_home(tmp_path / "two" / "trial-f")  # a new trial under the old name
    assert anchor_log(fresh.home, store)["added"] == 4
    checked = check_anchors(fresh.entries(), store, "trial-f")
    assert (checked["anchored"], checked["released"]) == (4, 1)
    with pytest.raises(AnchorError, match=f"were released .*{key}.*can never be anchored again"):
        anchor_log(old.home, store)
    with pytest.raises(AnchorError, match="were released"):
        check_anchors(old.entries(), store, "trial-f")
    r = run_cli("-m", "evidence", "verify", "--home", str(fresh.home), "--store", store_url)
    assert r.returncode == 0, r.stderr
    assert "4 of 4 commitments match" in r.stderr and "1 released chain(s) of trial trial-f" in r.stderr, r.stderr


def test_a_release_that_is_not_genuine_is_refused_by_name(tmp_path):
    """A release is refused while a preservation of the trial is in the store; a release record that does
    not parse as one, names a chain the store does not hold (or with another count), or releases a chain
    an index preserved, is refused by name wherever anchors are read — never taken as a release."""
    from evidence.anchors import releasable, release
    from evidence.stores import preserve

    url = f"file://{tmp_path / 'store'}"
    store = open_store(url)
    log = make_home(tmp_path / "trials" / "trial-g")
    got = anchor_log(log.home, store)
    first = log.entries()[0]["hash"]
    fresh = make_home(tmp_path / "again" / "trial-g")
    released = tmp_path / "store" / "released" / "trial-g"
    released.mkdir(parents=True)
    good = dict(format="commitment-anchors-release-v1", trial="trial-g", prefix=got["prefix"], count=4,
                at="2026-12-06T00:00:00+00:00", home="h", files=1, bytes=1, reason="r")
    for body, why in [(b"{not json", "damaged, not valid JSON"),
                      (json.dumps({**good, "count": "4"}).encode(), "damaged, not an anchors release \\(count"),
                      (json.dumps({**good, "extra": 1}).encode(), "damaged, not an anchors release \\(extra"),
                      (json.dumps({**good, "count": 3}).encode(), "damaged, it releases 3 anchor\\(s\\) .* the store holds 4")]:
        (released / f"{first}.json").write_bytes(body)
        for call in (lambda: anchor_log(fresh.home, store), lambda: check_anchors(log.entries(), store, "trial-g"),
                     lambda: releasable(store, "trial-g")):
            with pytest.raises(AnchorError, match=f"released/trial-g/{first}.json: {why}"):
                call()
    (released / f"{first}.json").unlink()
    (released / f"{'a' * 64}.json").write_bytes(json.dumps({**good, "prefix": f"anchors/trial-g/{'a' * 64}/"}).encode())
    with pytest.raises(AnchorError, match="releases 4 anchor\\(s\\) .* the store holds 0"):  # no such chain
        anchor_log(fresh.home, store)
    (released / f"{'a' * 64}.json").unlink()

    preserve(log.home, url, trial="trial-g", anchors={k: got[k] for k in ("prefix", "count")})
    with pytest.raises(AnchorError, match="holds 1 preservation index\\(es\\) of trial trial-g .* never released"):
        release(store, "trial-g", home="h", files=0, size=0, reason="r")
    (released / f"{first}.json").write_bytes(json.dumps(good).encode())  # planted beside the preservation
    with pytest.raises(AnchorError, match="not a genuine release: .*indexes/trial-g/.* preserved that chain"):
        anchor_log(fresh.home, store)
    r = run_cli("-m", "evidence", "verify", "--home", str(log.home))
    assert r.returncode == 2 and "not a genuine release" in r.stderr and "Traceback" not in r.stderr, r.stderr
