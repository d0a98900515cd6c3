"""Serving: real replica processes on loopback with the tiny seed, the three-phase probe at every
concurrency level of the smoke profile's sweep (a real server process killed for the last phase), bad
input, and what the report recomputes from it — a probe from before the sweep included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from evidence.canonical import read_json, write_json_atomic
from evidence.receipts import make_receipt
from evidence.report.serving import serving_markdown
from evidence.serving import (
    PHASES,
    ServingEvidenceError,
    check_probe,
    committed_levels,
    gates,
    level_figures,
    levels_of,
    phase_figures,
    requests_of,
)
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
    prepared = read_json(home / "prepared.json")
    n, levels = requests_of(prepared), levels_of(prepared)  # the committed smoke profile's workload and sweep
    d = home / "serving" / "attempt-1"
    plan = read_json(d / "plan.json")
    assert n == 16 and levels == (1, 4) and plan["requests"] == n and plan["levels"] == [1, 4]
    assert "concurrency" not in plan and res["levels"] == [1, 4]
    assert list(ph) == [f"{p}-c{c}" for p in PHASES for c in levels]  # every phase at every level, ascending
    assert all(ph[k]["completed"] == n for k in ph)
    for c in levels:
        single, many, fail = (read_json(d / f"{p}-c{c}.json") for p in PHASES)
        assert [r["request_id"] for r in single["requests"]] == [f"single-c{c}-{i:03d}" for i in range(n)]
        assert single["concurrency"] == many["concurrency"] == fail["concurrency"] == c
        assert not any(r["response"]["cached"] for x in (single, many, fail) for r in x["requests"])
        assert ph[f"single-c{c}"]["per_endpoint_answers"] == {"replica-0": n}
        assert ph[f"replicas-c{c}"]["per_endpoint_answers"] == {"replica-0": n // 2, "replica-1": n // 2}
        assert ph[f"single-c{c}"]["retries"] == ph[f"replicas-c{c}"]["retries"] == 0
        # the killed replica really was a process that died of SIGKILL (once, before the first level), and
        # every request first routed to it failed at the connection and was answered by the survivor
        retried = [r for r in fail["requests"] if len(r["attempts"]) > 1]
        assert len(retried) == n // 2 == ph[f"failure-c{c}"]["retries"]
        for r in retried:
            assert r["attempts"][0]["endpoint"] == "replica-1" and r["attempts"][0]["status"] is None
            assert r["attempts"][1] | {"seconds": 0, "started_seconds": 0} == {
                "endpoint": "replica-0", "status": 200, "seconds": 0, "started_seconds": 0}
        assert ph[f"failure-c{c}"]["per_endpoint_answers"] == {"replica-0": n}
        assert ph[f"failure-c{c}"]["per_replica"].keys() == {"replica-0"}
    assert plan["stopped"]["replica"] == "replica-1" and plan["stopped"]["exit_status"] == -9
    # both replicas on this machine's CPU: recorded as sharing it, and their tokens summed per device
    assert [(p["replica"], p["device"], p["shares_device_with"]) for p in plan["placement"]] == [
        ("replica-0", "cpu", ["replica-1"]), ("replica-1", "cpu", ["replica-0"])]
    assert all(p["engine"] is None or p["engine"]["slots"] >= 1 for p in plan["placement"])
    dev = ph["replicas-c4"]["per_device"]
    assert len(dev) == 1 and [(v["replicas"], v["shared"]) for v in dev.values()] == [(["replica-0", "replica-1"], True)]
    assert sum(v["generated_tokens"] for v in dev.values()) == ph["replicas-c4"]["generated_tokens"] > 0
    assert res["tasks_answered"] == 16 and res["tasks_with_differing_tokens"] == []
    assert len(res["model_identities"]) == 1 and res["by_level"]["4"]["throughput_ratio_replicas_vs_single"] > 0


def test_report_recomputes_the_probe(probed, tmp_path):
    home, res = probed
    r = run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = read_json(tmp_path / "r.json")
    assert {k: {x: y for x, y in v.items() if x != "bound"} for k, v in rep["serving"]["phases"].items()} == \
        {k: {x: y for x, y in v.items() if x != "bound"} for k, v in res["phases"].items()}
    assert rep["serving"]["phases"]["replicas-c4"]["bound"] == res["phases"]["replicas-c4"]["bound"]
    serving = [g for g in rep["gates"] if g["gate"].startswith("serving")]
    assert [g["passed"] for g in serving] == [True, True, True]
    assert serving[0]["gate"] == "serving: all 16 requests answered in every phase at every concurrency level " \
                                 "(1, 4 in flight; ≤ 4 attempts)"
    md = (tmp_path / "r.md").read_text()
    assert "## Serving" in md and (tmp_path / "r-serving.png").is_file()
    assert "| replicas | 4 | 16/16 |" in md and "Against the memory-bandwidth bound" in md
    assert "replica-0: " in md and "sharing it with replica-1 (their scaling is not a device's)" in md


def _as_before_the_sweep(d: Path) -> None:
    """Rewrite a sweep's attempt as a probe before the sweep wrote it: each phase once at 4 in flight
    (the c=4 run, its request IDs `<phase>-NNN`), plan.json with one integer concurrency."""
    for p in PHASES:
        data = read_json(d / f"{p}-c4.json")
        for r in data["requests"]:
            r["request_id"] = r["request_id"].replace(f"{p}-c4-", f"{p}-")
            r.get("response", {})["request_id"] = r["request_id"]
        data["figures"] = phase_figures(data["requests"], data["wall_seconds"])
        write_json_atomic(d / f"{p}.json", data)
        for c in (1, 4):
            (d / f"{p}-c{c}.json").unlink()
    plan = read_json(d / "plan.json")
    for k in ("levels", "placement", "warmup"):
        plan.pop(k)
    write_json_atomic(d / "plan.json", plan | {"concurrency": 4})


def test_a_probe_from_before_the_sweep_verifies_as_before(probed, tmp_path):
    """A home committed before the sweep: its one-level probe verifies and is shown as it always was;
    in a home whose profile sets serving_concurrency it is refused (that probe ignored the sweep)."""
    entry, ctx = _tampered(probed, tmp_path, _as_before_the_sweep)
    comp = check_probe(ctx["home"], entry, ctx["dev"], ctx["model"], requests=ctx["requests"])
    assert list(comp["phases"]) == list(PHASES) and "levels" not in comp and "placement" not in comp
    assert comp["throughput_ratio_replicas_vs_single"] > 0 and comp["failover"]["extra_retries"] == 8
    assert [(g["gate"], g["passed"]) for g in gates(comp)] == [
        ("serving: all 16 requests answered in every phase (≤ 4 attempts)", True),
        ("serving: identical greedy tokens per task across phases and replicas", True),
        ("serving: one model identity, the selected serving model", True)]
    md = serving_markdown(comp, ["attempt-1"])
    assert "| phase | answered | failed | retries | wall s | req/s | p50 s | p90 s | p95 s | p99 s | generated tok/s |" \
        in md and any(line.startswith("| failure | 16/16 | 0 | 8 |") for line in md)
    with pytest.raises(ServingEvidenceError, match=r"ran one concurrency level \(4\), as probes before the sweep "
                                                   r"did; the committed profile sets serving_concurrency = \[1, 4\]"):
        check_probe(ctx["home"], entry, ctx["dev"], ctx["model"], requests=ctx["requests"],
                    levels=committed_levels(read_json(ctx["home"] / "prepared.json")))


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
                   "requests": requests_of(read_json(home / "prepared.json")),
                   "levels": committed_levels(read_json(home / "prepared.json"))}


def _edit_json(path: Path, fn) -> None:
    data = read_json(path)
    fn(data)
    write_json_atomic(path, data)


@pytest.mark.parametrize("what, edit, match", [
    ("figures", lambda d: _edit_json(d / "replicas-c4.json", lambda x: x["figures"].update(throughput_rps=99.0)),
     "stored figures differ"),
    # a capacity figure the records do not give: a device's tokens
    ("tokens", lambda d: _edit_json(d / "replicas-c1.json", lambda x: [
        v.update(generated_tokens_per_second=1e6) for v in x["figures"]["per_device"].values()]),
     "replicas-c1.json: stored figures differ"),
    ("workload", lambda d: _edit_json(d / "single-c4.json", lambda x: x["requests"].reverse()),
     "fixed 16-request workload"),
    # one level's requests carrying another's IDs (a retry cache could answer them)
    ("ids", lambda d: _edit_json(d / "single-c1.json", lambda x: [
        r.update(request_id=r["request_id"].replace("-c1-", "-c4-")) for r in x["requests"]]),
     "single-c1.json: not the fixed 16-request workload"),
    # a level the committed profile does not have, or one of its levels left out
    ("levels", lambda d: _edit_json(d / "plan.json", lambda x: x.update(levels=[1, 4, 16])),
     r"concurrency levels \[1, 4, 16\]; the committed profile fixes \[1, 4\]"),
    ("level missing", lambda d: (d / "failure-c4.json").unlink(), "failure-c4.json: missing"),
    ("level", lambda d: _edit_json(d / "replicas-c4.json", lambda x: x.update(concurrency=16)),
     "replicas at concurrency 16 over 2 endpoints; the run fixes replicas at 4"),
    ("both formats", lambda d: _edit_json(d / "plan.json", lambda x: x.update(concurrency=4)),
     "beside one concurrency 4"),
    ("sharing", lambda d: _edit_json(d / "plan.json", lambda x: x["placement"][0].update(shares_device_with=[])),
     r"replica-0 is recorded sharing its device with \[\]; its placement says \['replica-1'\]"),
    ("placement", lambda d: _edit_json(d / "plan.json", lambda x: x["placement"].pop()),
     "its placement does not name the replicas it advertised"),
    # a probe that ran another workload than the committed profile's (the studies' 64 at smoke)
    ("requests", lambda d: _edit_json(d / "plan.json", lambda x: x.update(requests=64)),
     "64 requests with up to 4 attempts; the committed profile fixes 16"),
    ("outcome", lambda d: _edit_json(d / "failure-c1.json",
                                     lambda x: x["requests"][1]["attempts"][-1].update(status=503)),
     "disagrees with its attempts"),
    ("nothing stopped", lambda d: _edit_json(d / "plan.json", lambda x: x.update(stopped=None)),
     "stopped no advertised replica"),
    ("attempts", lambda d: _edit_json(d / "failure-c4.json",
                                      lambda x: x["requests"][1]["attempts"].extend([{"status": None}] * 4)),
     "attempts; the bound is 4"),
])
def test_report_refuses_inconsistent_probe(probed, tmp_path, what, edit, match):
    entry, ctx = _tampered(probed, tmp_path, edit)
    with pytest.raises(ServingEvidenceError, match=match):
        check_probe(ctx["home"], entry, ctx["dev"], ctx["model"], requests=ctx["requests"], levels=ctx["levels"])


def test_serving_gates_fail_on_differing_tokens_or_models(probed, tmp_path):
    def edit(d):
        devices = {p["replica"]: f"{p['host']} {p['device']}" for p in read_json(d / "plan.json")["placement"]}

        def change(x):
            x["requests"][5]["response"]["token_ids"][0] += 1
            x["requests"][9]["response"]["model"]["parameters_sha256"] = "0" * 64
            x["figures"] = level_figures(x["requests"], x["wall_seconds"], devices)
        _edit_json(d / "replicas-c4.json", change)  # at one level only: the gates pool every level

    entry, ctx = _tampered(probed, tmp_path, edit)
    comp = check_probe(ctx["home"], entry, ctx["dev"], ctx["model"], requests=ctx["requests"], levels=ctx["levels"])
    assert comp["tasks_with_differing_tokens"] == ["dev-00005"]
    assert [g["passed"] for g in gates(comp)] == [True, False, False]
    assert [g["passed"] for g in gates(None)] == [False]  # no probe: the serving condition fails


def test_placement_records_each_replicas_engine_and_who_shares_its_device():
    """GET /health once per replica: an `engine` is recorded as the replica says it, a replica without
    one (or one that does not answer) as None; replicas on one host's device are marked as sharing it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from conftest import free_port
    from orchestrate.serving import engines, placement_of

    engine = {"slots": 16, "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "weights_bytes": 538_000_000,
              "bandwidth_bytes_per_s": 3.35e12, "measured_copy_bytes_per_s": None, "threads": None}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"status": "ok", **({"engine": engine} if self.server.server_port == port_a else {})})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Health) for _ in range(2)]
    port_a = servers[0].server_port
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        eps = [Endpoint(f"r{k}", f"http://127.0.0.1:{srv.server_port}") for k, srv in enumerate(servers)]
        eps.append(Endpoint("r2", f"http://127.0.0.1:{free_port()}"))  # nothing listens
        got = engines(eps, Timeouts(connect_s=1.0))
    finally:
        for srv in servers:
            srv.shutdown()
    assert got == {"r0": engine, "r1": None, "r2": None}
    where = {"r0": {"host": "h", "device": "cuda:0"}, "r1": {"host": "h", "device": "cuda:0"},
             "r2": {"host": "g", "device": "cuda:0"}}
    assert placement_of(eps, where, got) == [
        {"replica": "r0", "host": "h", "device": "cuda:0", "engine": engine, "shares_device_with": ["r1"]},
        {"replica": "r1", "host": "h", "device": "cuda:0", "engine": None, "shares_device_with": ["r0"]},
        {"replica": "r2", "host": "g", "device": "cuda:0", "engine": None, "shares_device_with": []}]
    assert placement_of(eps[:1], {}, got)[0] | {"engine": None} == {  # a backend that does not say where
        "replica": "r0", "host": None, "device": None, "engine": None, "shares_device_with": []}


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



def test_an_answer_the_engine_failed_is_retried_on_the_next_replica():
    """A replica whose engine failed a request answers 500 (training/serve.py); the probe retries it on the
    next endpoint and records both attempts. Two real HTTP servers on loopback: one failing, one answering."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    def server(status: int) -> ThreadingHTTPServer:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 — the http.server hook
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = (json.dumps({"error": "generation failed", "detail": "RuntimeError: CUDA out of memory"})
                        if status == 500 else json.dumps({**req, "token_ids": [1, 2], "replica": "ok", "cached": False}))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *a):
                pass

        s = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=s.serve_forever, daemon=True).start()
        return s

    bad, good = server(500), server(200)
    try:
        eps = [Endpoint("failing", f"http://127.0.0.1:{bad.server_port}"),
               Endpoint("ok", f"http://127.0.0.1:{good.server_port}")]
        res = run_phase([{"request_id": "r-0", "task_id": "dev-00000"}, {"request_id": "r-1", "task_id": "dev-00001"}],
                        eps, concurrency=2, timeouts=Timeouts(backoff_s=0.0))
    finally:
        bad.shutdown(), good.shutdown()
        bad.server_close(), good.server_close()
    first, second = res["requests"]
    assert [a["status"] for a in first["attempts"]] == [500, 200] and first["outcome"] == "ok"
    assert "CUDA out of memory" in first["attempts"][0]["error"]
    assert [a["endpoint"] for a in first["attempts"]] == ["failing", "ok"]
    assert [a["status"] for a in second["attempts"]] == [200] and res["figures"]["retries"] == 1
