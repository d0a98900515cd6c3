"""Which worker built which shared fixture, and how long each worker was busy (#34: a module or session
fixture is built once per xdist worker that reaches it, unless `built_once`; was any built twice?).

    PYTHONPATH=bench FIXLOG_DIR=/tmp/fixlog python -m pytest -p xdist_fixtures -n 3 --dist loadgroup tests
    python bench/xdist_fixtures.py /tmp/fixlog

As a pytest plugin it appends, per worker (FIXLOG_DIR/<worker>.jsonl), every set-up of a fixture wider than
one test (name, where it is defined, scope, wall seconds) and every test's start, wall seconds and CPU
seconds (the worker's own and its waited-for children's: processes under the namespace hosts' sshd are not
its children, `process_census.py` counts those). Run as a script it prints the fixtures whose set-ups took
over 2 s in all, each worker's test count, busy seconds and when its last test ended, and the tests that
cost the most CPU. A fixture listed with two workers was set up by both: built twice, unless it is
`built_once` (tests/conftest.py), where a worker's set-up is its wait for the one that builds (it then reads
that copy), as `tiny_seed`'s second worker shows.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest


def _write(rec: dict) -> None:
    d = Path(os.environ.get("FIXLOG_DIR", "/tmp/fixlog"))
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    t0 = time.time()
    yield
    if fixturedef.scope != "function":
        _write({"kind": "fixture", "name": fixturedef.argname, "where": fixturedef.baseid,
                "scope": fixturedef.scope, "t0": t0, "s": time.time() - t0})


def _cpu() -> tuple[float, float]:
    """CPU seconds of this worker (all its threads) and of the children it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, (self0, kids0) = time.time(), _cpu()
    yield
    self1, kids1 = _cpu()
    _write({"kind": "test", "id": item.nodeid, "t0": t0, "s": time.time() - t0,
            "cpu_self": self1 - self0, "cpu_children": kids1 - kids0})


def summary(d: Path) -> str:
    recs = [dict(json.loads(line), w=f.stem) for f in sorted(d.glob("*.jsonl")) for line in f.open()]
    built = collections.defaultdict(list)
    for r in recs:
        if r["kind"] == "fixture":
            built[(r["name"], r.get("where", "?"), r["scope"])].append((r["w"], round(r["s"], 1)))
    out = ["fixture (where it is defined, scope): [(worker, seconds), …] — over 2 s in all"]
    for (name, where, scope), v in sorted(built.items(), key=lambda kv: -sum(s for _, s in kv[1])):
        if sum(s for _, s in v) > 2:
            out.append(f"  {name} ({where or 'tests'}, {scope}): {v}")
    t0 = min(r["t0"] for r in recs)
    for w in sorted({r["w"] for r in recs}):
        tests = [r for r in recs if r["w"] == w and r["kind"] == "test"]
        out.append(f"{w}: {len(tests)} tests, busy {sum(r['s'] for r in tests):.0f} s, "
                   f"last ended at {max(r['t0'] + r['s'] for r in tests) - t0:.0f} s")
    tests = [r for r in recs if r["kind"] == "test" and "cpu_self" in r]
    if tests:
        out.append("CPU seconds by test (the worker's own, set-ups of the fixtures it reached included; the "
                   "children it waited for) — the 40 highest:")
        for r in sorted(tests, key=lambda r: -(r["cpu_self"] + r["cpu_children"]))[:40]:
            out.append(f"  {r['cpu_self'] + r['cpu_children']:7.1f} = {r['cpu_self']:6.1f} + "
                       f"{r['cpu_children']:6.1f}  {r['s']:6.1f} s wall  {r['id']}")
        out.append(f"  all tests: {sum(r['cpu_self'] for r in tests):.1f} own + "
                   f"{sum(r['cpu_children'] for r in tests):.1f} children")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
