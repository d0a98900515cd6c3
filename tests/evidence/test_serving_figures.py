"""The serving sweep's arithmetic, in-process: the workload of each phase and level, the levels a
profile runs, the capacity figures of a run's records, and the memory-bandwidth bound the report
holds them against (evidence/serving.py). The probe against real replicas is
tests/orchestrate/test_serving.py."""

from __future__ import annotations

import pytest

from evidence.serving import (
    LEVELS,
    bounds,
    level_figures,
    levels_of,
    rows_in_flight,
    sharing,
    sweep,
    workload,
)


def test_each_phase_and_level_has_its_own_request_ids():
    dev = ["dev-00002", "dev-00000", "dev-00001"]
    assert workload(dev, "single", 4, 16) == [
        {"request_id": "single-c16-000", "task_id": "dev-00000"}, {"request_id": "single-c16-001", "task_id": "dev-00001"},
        {"request_id": "single-c16-002", "task_id": "dev-00002"}, {"request_id": "single-c16-003", "task_id": "dev-00000"}]
    assert [r["request_id"] for r in workload(dev, "failure", 2)] == ["failure-000", "failure-001"]  # before the sweep
    ids = [r["request_id"] for p in ("single", "replicas", "failure") for c in (1, 4) for r in workload(dev, p, 8, c)]
    assert len(set(ids)) == len(ids) == 48


def test_the_levels_a_profile_runs():
    assert sweep(64) == LEVELS == (1, 4, 16, 64) and sweep(16) == (1, 4, 16) and sweep(8) == (1, 4)
    assert sweep(16, [1, 4]) == (1, 4)
    profile = lambda **kw: {"experiment": {"profile": kw}}  # noqa: E731
    assert levels_of(profile()) == LEVELS and levels_of(profile(serving_requests=16)) == (1, 4, 16)
    assert levels_of(profile(serving_requests=16, serving_concurrency=[2, 8])) == (2, 8)


def _answer(replica: str, tokens: int, cached: bool = False, **clocks: float) -> dict:
    return {"outcome": "ok", "latency_seconds": 0.5, "attempts": [{"status": 200}],
            "response": {"replica": replica, "token_ids": list(range(tokens)), "cached": cached, **clocks}}


def test_capacity_figures_per_replica_and_device():
    records = [_answer("r0", 10, first_token_seconds=0.1, generate_seconds=0.4),
               _answer("r1", 6, first_token_seconds=0.3, queue_seconds=0.05, generate_seconds=0.5),
               _answer("r1", 6, cached=True, first_token_seconds=9.0),  # a retry's cached answer generated nothing
               _answer("r2", 4)]  # a replica from before the engine: no first-token clock
    f = level_figures(records, 2.0, {"r0": "h cpu", "r1": "h cpu", "r2": "g cuda:0"})
    assert f["generated_tokens"] == 20 and f["generated_tokens_per_second"] == 10.0
    assert f["per_replica"] == {"r0": {"generated_tokens": 10, "generated_tokens_per_second": 5.0},
                                "r1": {"generated_tokens": 6, "generated_tokens_per_second": 3.0},
                                "r2": {"generated_tokens": 4, "generated_tokens_per_second": 2.0}}
    assert f["per_device"] == {
        "g cuda:0": {"replicas": ["r2"], "generated_tokens": 4, "shared": False, "generated_tokens_per_second": 2.0},
        "h cpu": {"replicas": ["r0", "r1"], "generated_tokens": 16, "shared": True, "generated_tokens_per_second": 8.0}}
    assert f["time_to_first_token_seconds"] == {"p50": pytest.approx(0.2), "p95": pytest.approx(0.29), "answers": 2}
    assert f["queue_seconds"] == {"p50": 0.05, "p95": 0.05, "answers": 1}
    assert f["completed"] == 4 and f["cached_answers"] == 1 and f["latency_p95_seconds"] == 0.5
    none = level_figures([_answer("r2", 4)], 1.0, {"r2": "g cuda:0"})
    assert none["time_to_first_token_seconds"] == {"p50": None, "p95": None, "answers": 0}


def test_rows_in_flight_split_evenly_over_the_replicas_answering():
    assert rows_in_flight(1, ["a", "b"]) == {"a": 0.5, "b": 0.5}  # each carries it half the time
    assert rows_in_flight(5, ["a", "b"]) == {"a": 2.5, "b": 2.5}
    assert rows_in_flight(16, ["a"]) == {"a": 16}


def _place(replica: str, host: str, device: str, engine: dict | None) -> dict:
    return {"replica": replica, "host": host, "device": device, "engine": engine}


def _fig(per_device: dict[str, float]) -> dict:
    return {"generated_tokens_per_second": sum(per_device.values()),
            "per_device": {k: {"generated_tokens_per_second": v} for k, v in per_device.items()}}


GPU = {"slots": 8, "device": "cuda:0", "weights_bytes": 500_000_000, "bandwidth_bytes_per_s": 3.35e12,
       "measured_copy_bytes_per_s": 2.9e12}
CPU = {"slots": 4, "device": "cpu", "weights_bytes": 100_000_000, "bandwidth_bytes_per_s": None,
       "measured_copy_bytes_per_s": 2e10}


def test_one_replica_is_bounded_by_its_slots_times_bandwidth_over_weights():
    placement = [_place("r0", "h0", "cuda:0", GPU), _place("r1", "h1", "cuda:0", GPU)]
    b = bounds(_fig({"h0 cuda:0": 13_400.0}), placement, 16, ["r0"])  # 16 in flight, 8 slots: 8 rows
    assert b["bound_tokens_per_second"] == 8 * 3.35e12 / 5e8 == 53_600.0
    (dev,) = b["devices"]
    assert dev | {"fraction_of_bound": None} == {
        "device": "h0 cuda:0", "replicas": ["r0"], "shared_with": [], "rows_in_flight": 8,
        "weights_bytes": 500_000_000, "bandwidth_bytes_per_s": 3.35e12, "bandwidth": "device specification",
        "bound_tokens_per_second": 53_600.0, "generated_tokens_per_second": 13_400.0, "fraction_of_bound": None}
    assert dev["fraction_of_bound"] == b["fraction_of_bound"] == 0.25
    two = bounds(_fig({"h0 cuda:0": 10.0, "h1 cuda:0": 10.0}), placement, 1, ["r0", "r1"])  # one row in all
    assert [d["rows_in_flight"] for d in two["devices"]] == [0.5, 0.5] and two["bound_tokens_per_second"] == 6_700.0
    assert [d["fraction_of_bound"] for d in two["devices"]] == [10.0 / 3_350.0] * 2  # no device bounded at zero


def test_replicas_sharing_a_device_share_its_bound_measured_by_copy_where_unspecified():
    placement = [_place("r0", "h", "cpu", CPU), _place("r1", "h", "cpu", CPU)]
    assert sharing(placement) == {"r0": ["r1"], "r1": ["r0"]}
    b = bounds(_fig({"h cpu": 100.0}), placement, 4, ["r0", "r1"])  # 2 + 2 rows over both copies of the weights
    (dev,) = b["devices"]
    assert (dev["rows_in_flight"], dev["weights_bytes"], dev["bandwidth"]) == (4, 200_000_000, "measured copy bandwidth")
    assert dev["bound_tokens_per_second"] == 2e10 * 4 / 2e8 == 400.0 and b["fraction_of_bound"] == 0.25
    alone = bounds(_fig({"h cpu": 100.0}), placement, 4, ["r0"])  # the other stopped: still placed on the device
    assert alone["devices"][0]["shared_with"] == ["r1"] and alone["bound_tokens_per_second"] == 800.0


@pytest.mark.parametrize("engine, why", [(None, "no engine reported"),
                                         (CPU | {"measured_copy_bytes_per_s": None}, "no bandwidth reported")])
def test_a_bound_without_an_engine_or_a_bandwidth_is_not_known(engine, why):
    placement = [_place("r0", "h", "cpu", engine), _place("r1", "g", "cpu", CPU)]
    b = bounds(_fig({"h cpu": 5.0, "g cpu": 5.0}), placement, 4, ["r0", "r1"])
    assert b["bound_tokens_per_second"] is None and b["fraction_of_bound"] is None
    assert [(d["device"], d["bound_tokens_per_second"], d.get("unknown")) for d in b["devices"]] == [
        ("g cpu", 2e10 * 2 / 1e8, None), ("h cpu", None, why)]
