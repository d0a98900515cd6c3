"""Serving: real replica processes on loopback with the tiny seed, the three-phase probe (a real
server process killed for the last phase), bad input, and what the report recomputes from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from evidence.canonical import read_json, write_json_atomic
from evidence.receipts import make_receipt
from evidence.serving import PHASES, ServingEvidenceError, check_probe, gates, phase_figures, requests_of
from orchestrate.backends.local import LocalReplicas, local_probe
from orchestrate.serving import Endpoint, ProbeError, Timeouts, run_phase


@pytest.fixture(scope="session")
def selected(tmp_path_factory, trained) -> Path:
    home = tmp_path_factory.mktemp("serving") / "home"
    shutil.copytree(trained, home)
    r = run_cli("-m", "training", "select", "--home", str(home))
    assert r.returncode == 0, r.stderr
    return home


@pytest.fixture(scope="session")
def probed(tmp_path_factory, selected) -> tuple[Path, dict]:
    """One full probe: 2 replicas of clean-pair, 1 → 2 → 2 with replica-1 killed."""
    home = tmp_path_factory.mktemp("serving") / "probed"
    shutil.copytree(selected, home)
    lines: list[str] = []
    res = local_probe(home, "clean-pair", 2, threads=1, say=lines.append)
    return home, res


@pytest.fixture(scope="module")
def replica(selected, tmp_path_factory):
    """One replica for the request tests (each start is a process importing torch and loading the model:
    about 5 s): they only send requests, with request ids no other of them sends, and none stops it."""
    with LocalReplicas(selected, 1, tmp_path_factory.mktemp("replica") / "logs") as reps:
        yield reps.endpoints[0].url, reps


def post(url: str, **kw) -> httpx.Response:
    return httpx.post(f"{url}/v1/answer", timeout=120, trust_env=False, **kw)


def test_replica_answers_committed_dev_tasks_only(replica, selected):
    url, _ = replica
    sel = read_json(selected / "selection.json")
    health = httpx.get(f"{url}/health", trust_env=False).json()
    assert health["model"]["receipt_digest"] == sel["candidates"]["clean-pair"] and health["tasks"] == 16

    a = post(url, json={"request_id": "r-1", "task_id": "dev-00000"})
    assert a.status_code == 200, a.text
    body = a.json()
    assert body["request_id"] == "r-1" and body["task_id"] == "dev-00000" and not body["cached"]
    assert body["token_ids"] and all(isinstance(t, int) for t in body["token_ids"])
    assert body["model"]["parameters_sha256"] == read_json(
        selected / "runs" / "clean-pair" / "model" / "receipt.json")["meta"]["parameters_sha256"]

    again = post(url, json={"request_id": "r-1", "task_id": "dev-00000"}).json()  # a retry: idempotent
    assert again["cached"] and again["token_ids"] == body["token_ids"]
    fresh = post(url, json={"request_id": "r-2", "task_id": "dev-00000"}).json()  # generated again
    assert not fresh["cached"] and fresh["token_ids"] == body["token_ids"]

    reused = post(url, json={"request_id": "r-1", "task_id": "dev-00001"})
    assert reused.status_code == 409 and "dev-00000" in reused.json()["detail"]
    for task in ("test-00000", "train-00000", "nope"):  # committed, but not development tasks
        r = post(url, json={"request_id": "x", "task_id": task})
        assert r.status_code == 404 and task in r.json()["detail"]


@pytest.mark.parametrize("content, status, words", [
    (b'{"request_id": "a"', 400, "Invalid JSON"),
    (b'{"request_id": "a", "task_id": 3}', 400, "task_id"),
    (b'{"request_id": "a", "task_id": "dev-00000", "prompt": "hi"}', 400, "prompt"),
    (b'{"request_id": "a b/c", "task_id": "dev-00000"}', 400, "request_id"),
    (b'[]', 400, "body"),
    (json.dumps({"request_id": "a", "task_id": "dev-00000", "pad": "x" * 5000}).encode(), 413, "4096"),
])
def test_replica_refuses_bad_bodies(replica, content, status, words):
    url, _ = replica
    r = post(url, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status and words in r.json()["detail"], r.text


def test_replica_counts_a_chunked_body(replica):
    url, _ = replica

    def chunks():  # no Content-Length: the limit must hold while the body arrives
        for _ in range(10):
            yield b"x" * 1000

    r = post(url, content=chunks())
    assert r.status_code == 413


def test_replica_refuses_a_model_failing_its_receipt(selected, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(selected, home)
    f = home / "runs" / "clean-pair" / "model" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    ready = tmp_path / "ready.json"
    r = run_cli("-m", "training", "serve", "--home", str(home), "--ready-file", str(ready))
    assert r.returncode == 2 and "model.safetensors" in r.stderr, r.stderr
    assert not ready.exists()  # it never listened
    with pytest.raises(ProbeError, match="exited 2 before listening"):
        with LocalReplicas(home, 1, tmp_path / "logs"):
            pass


def test_replica_refuses_an_unservable_arm(selected):
    r = run_cli("-m", "training", "serve", "--home", str(selected), "--arm", "damaged-single")
    assert r.returncode == 2 and "not servable" in r.stderr


def test_probe_three_phases(probed):
    home, res = probed
    ph = res["phases"]
    n = requests_of(read_json(home / "prepared.json"))  # the committed smoke profile's workload
    assert n == 16 and read_json(home / "serving" / "attempt-1" / "plan.json")["requests"] == n
    assert [ph[p]["completed"] for p in PHASES] == [n, n, n]
    assert ph["single"]["per_endpoint_answers"] == {"replica-0": n}
    assert ph["replicas"]["per_endpoint_answers"] == {"replica-0": n // 2, "replica-1": n // 2}
    assert ph["single"]["retries"] == ph["replicas"]["retries"] == 0
    # the killed replica really was a process that died of SIGKILL, and every request first routed
    # to it failed at the connection and was answered by the survivor on the next attempt
    plan = read_json(home / "serving" / "attempt-1" / "plan.json")
    assert plan["stopped"]["replica"] == "replica-1" and plan["stopped"]["exit_status"] == -9
    fail = read_json(home / "serving" / "attempt-1" / "failure.json")
    retried = [r for r in fail["requests"] if len(r["attempts"]) > 1]
    assert len(retried) == n // 2 == ph["failure"]["retries"]
    for r in retried:
        assert r["attempts"][0]["endpoint"] == "replica-1" and r["attempts"][0]["status"] is None
        assert r["attempts"][1] | {"seconds": 0, "started_seconds": 0} == {
            "endpoint": "replica-0", "status": 200, "seconds": 0, "started_seconds": 0}
    assert ph["failure"]["per_endpoint_answers"] == {"replica-0": n}
    assert res["tasks_answered"] == 16 and res["tasks_with_differing_tokens"] == []
    assert len(res["model_identities"]) == 1 and res["throughput_ratio_replicas_vs_single"] > 0


def test_report_recomputes_the_probe(probed, tmp_path):
    home, res = probed
    r = run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = read_json(tmp_path / "r.json")
    assert rep["serving"]["phases"] == res["phases"]
    assert [g["passed"] for g in rep["gates"] if g["gate"].startswith("serving")] == [True, True, True]
    assert "## Serving" in (tmp_path / "r.md").read_text() and (tmp_path / "r-serving.png").is_file()


def test_second_probe_needs_a_reason(probed):
    home, _ = probed
    with pytest.raises(ProbeError, match="--retry"):
        local_probe(home, "clean-pair", 2)


def _tampered(probed, tmp_path, edit) -> tuple[Path, dict]:
    """A copy whose probe files were edited and re-receipted, with an entry naming the new receipt:
    what a buggy probe could have committed. The figures and gates must come from the records."""
    home = tmp_path / "home"
    shutil.copytree(probed[0], home)
    d = home / "serving" / "attempt-1"
    edit(d)
    receipt = make_receipt(d, meta={}, exclude=["started.json"])
    write_json_atomic(d / "receipt.json", receipt)
    entry = {"subject": "serving/attempt-1/receipt.json", "data": {"receipt_digest": receipt["digest"]}}
    sel = read_json(home / "selection.json")
    dev = sorted(f"dev-{i:05d}" for i in range(16))
    return entry, {"home": home, "dev": dev, "model": {"arm": "clean-pair",
                                                       "receipt_digest": sel["candidates"]["clean-pair"]},
                   "requests": requests_of(read_json(home / "prepared.json"))}


def _edit_json(path: Path, fn) -> None:
    data = read_json(path)
    fn(data)
    write_json_atomic(path, data)


@pytest.mark.parametrize("what, edit, match", [
    ("figures", lambda d: _edit_json(d / "replicas.json", lambda x: x["figures"].update(throughput_rps=99.0)),
     "stored figures differ"),
    ("workload", lambda d: _edit_json(d / "single.json", lambda x: x["requests"].reverse()),
     "fixed 16-request workload"),
    # a probe that ran another workload than the committed profile's (the studies' 64 at smoke)
    ("requests", lambda d: _edit_json(d / "plan.json", lambda x: x.update(requests=64)),
     "64 requests with up to 4 attempts; the committed profile fixes 16"),
    ("outcome", lambda d: _edit_json(d / "failure.json",
                                     lambda x: x["requests"][1]["attempts"][-1].update(status=503)),
     "disagrees with its attempts"),
    ("nothing stopped", lambda d: _edit_json(d / "plan.json", lambda x: x.update(stopped=None)),
     "stopped no advertised replica"),
    ("attempts", lambda d: _edit_json(d / "failure.json",
                                      lambda x: x["requests"][1]["attempts"].extend([{"status": None}] * 4)),
     "attempts; the bound is 4"),
])
def test_report_refuses_inconsistent_probe(probed, tmp_path, what, edit, match):
    entry, ctx = _tampered(probed, tmp_path, edit)
    with pytest.raises(ServingEvidenceError, match=match):
        check_probe(ctx["home"], entry, ctx["dev"], ctx["model"], requests=ctx["requests"])


def test_serving_gates_fail_on_differing_tokens_or_models(probed, tmp_path):
    def edit(d):
        def change(x):
            x["requests"][5]["response"]["token_ids"][0] += 1
            x["requests"][9]["response"]["model"]["parameters_sha256"] = "0" * 64
            x["figures"] = phase_figures(x["requests"], x["wall_seconds"])
        _edit_json(d / "replicas.json", change)

    entry, ctx = _tampered(probed, tmp_path, edit)
    comp = check_probe(ctx["home"], entry, ctx["dev"], ctx["model"], requests=ctx["requests"])
    assert comp["tasks_with_differing_tokens"] == ["dev-00005"]
    assert [g["passed"] for g in gates(comp)] == [True, False, False]
    assert [g["passed"] for g in gates(None)] == [False]  # no probe: the serving condition fails


def test_probe_with_every_endpoint_down_ends_with_failure_records(tmp_path):
    from conftest import free_port

    eps = [Endpoint(f"down-{k}", f"http://127.0.0.1:{free_port()}") for k in range(2)]
    reqs = [{"request_id": f"q-{i}", "task_id": "dev-00000"} for i in range(64)]
    out = run_phase(reqs, eps, timeouts=Timeouts(connect_s=1.0, answer_s=2.0, backoff_s=0.001))
    f = out["figures"]
    assert f["completed"] == 0 and f["failed"] == 64 and f["attempts"] == 256 and f["retries"] == 192
    assert all(a["status"] is None and "ConnectError" in a["error"]
               for r in out["requests"] for a in r["attempts"])
    assert f["latency_seconds"]["p50"] is None and f["throughput_rps"] == 0

