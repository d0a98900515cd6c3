"""The replica with its batching engine, as the probe meets it: a real `training serve` process on
loopback answering many requests at once with the tokens it gives one at a time; a request ID repeated
while its answer is still being generated waits for that answer; a replica whose engine cannot start
says so and never listens."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from orchestrate.backends.local import LocalReplicas
from training import serve as serve_module
from training.engine import EngineError
from training.prepare import load_cases


@pytest.fixture(scope="module")
def selected(tmp_path_factory, trained) -> Path:
    home = tmp_path_factory.mktemp("batching") / "home"
    shutil.copytree(trained, home)
    r = run_cli("-m", "training", "select", "--home", str(home))
    assert r.returncode == 0, r.stderr
    return home


async def ask(url: str, reqs: list[dict[str, str]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120, trust_env=False) as c:
        return await asyncio.gather(*(c.post(f"{url}/v1/answer", json=r) for r in reqs))


def test_many_at_once_answer_what_one_at_a_time_does(selected, tmp_path):
    dev = sorted(cid for cid, c in load_cases(selected).items() if c["split"] == "dev")
    with LocalReplicas(selected, 1, tmp_path / "logs") as reps:
        url = reps.endpoints[0].url
        health = httpx.get(f"{url}/health", trust_env=False).json()
        engine = health["engine"]
        assert engine["slots"] == 4 and engine["device"] == "cpu" and engine["weights_bytes"] > 0
        alone = {}
        for k, t in enumerate(dev):
            r = httpx.post(f"{url}/v1/answer", json={"request_id": f"alone-{k}", "task_id": t}, timeout=120,
                           trust_env=False)
            assert r.status_code == 200 and r.json()["cached"] is False
            alone[t] = r.json()["token_ids"]
        burst = [{"request_id": f"burst-{k}", "task_id": dev[k % len(dev)]} for k in range(3 * len(dev))]
        got = asyncio.run(ask(url, burst))  # more than the engine's slots: some wait, some join mid-decode
        assert all(r.status_code == 200 for r in got)
        assert {r.json()["task_id"]: r.json()["token_ids"] for r in got} == alone
        assert all(r.json()["token_ids"] == alone[r.json()["task_id"]] for r in got)
        assert max(r.json()["queue_seconds"] for r in got) > 0  # the burst did queue behind full slots
        assert all(0 <= r.json()["first_token_seconds"] <= r.json()["generate_seconds"] for r in got)

        # the two at once first, then the other task under their ID: sent in one gather, the server could take
        # the other task first (the connections race), and then the two were its conflict (a flaky 409, 409)
        twice = asyncio.run(ask(url, [{"request_id": "dup", "task_id": dev[0]}] * 2))
        assert [r.status_code for r in twice] == [200, 200]
        assert sorted(r.json()["cached"] for r in twice) == [False, True]  # one generation, shared
        other = asyncio.run(ask(url, [{"request_id": "dup", "task_id": dev[1]}]))
        assert other[0].status_code == 409  # the ID is taken by another task


def test_a_replica_whose_engine_cannot_start_never_listens(selected, monkeypatch):
    """The engine's own refusals (a cache that does not fit the device, a CUDA graph that cannot be
    captured) reach the user as the replica's, before `serve` is ever called."""
    def refuse(*a, **k):
        raise EngineError("the key/value cache of 64 slots × 900 positions needs 9.9 GiB; cuda:0 has 2.0 GiB free")

    monkeypatch.setattr("training.engine.Engine.__init__", refuse)
    with pytest.raises(serve_module.ServeError, match="the serving engine could not start on cpu: the key/value"):
        serve_module.load_replica(selected, name="replica-0")


@pytest.fixture
def in_process(monkeypatch):
    """A replica in the test's process, whose CPU kernels are the vectorized ones the engine refuses
    (`training serve` starts with the default ones): these tests look at failures, not at a row's bits."""
    monkeypatch.setattr("training.engine.cpu_kernels", lambda: "DEFAULT")


def test_a_stopped_engine_fails_a_request_and_its_repeats_instead_of_hanging(selected, in_process):
    rep = serve_module.load_replica(selected, name="replica-0")
    rep.close()
    req = serve_module.AnswerRequest(request_id="after-stop", task_id=sorted(rep.tasks)[0])
    for _ in range(2):  # the repeat finds no answer in flight left behind by the first
        with pytest.raises(EngineError, match="stopped"):
            rep.answer(req)


def test_a_request_the_engine_failed_is_not_remembered_and_its_retry_is_answered(selected, monkeypatch, in_process):
    """What the probe's retry rests on: a failed generation leaves no answer and no request in flight
    under its ID, so the same request ID sent again (to this replica or another) is generated afresh."""
    rep = serve_module.load_replica(selected, name="replica-0")
    try:
        real, calls = rep.engine._decode, {"n": 0}

        def once() -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("CUDA out of memory")
            real()

        monkeypatch.setattr(rep.engine, "_decode", once)
        req = serve_module.AnswerRequest(request_id="retried", task_id=sorted(rep.tasks)[0])
        with pytest.raises(RuntimeError, match="out of memory"):
            rep.answer(req)
        status, body = rep.answer(req)
        assert status == 200 and body["cached"] is False and body["token_ids"]
    finally:
        rep.close()
