"""The report's "## Serving" section: the first committed probe in its own numbers — a probe from
before the sweep as it was always shown, a sweep per phase and concurrency level with its figures
against the memory-bandwidth bound of the devices that answered (evidence/serving.py `bounds`)."""

from __future__ import annotations

from typing import Any


def serving_markdown(sv: dict[str, Any] | None, attempts: list[str], shared: str | None = None) -> list[str]:
    if sv is None or "levels" not in sv:
        return _one_level(sv, attempts, shared)
    return _sweep(sv, attempts, shared)


def _cell(x: float | None, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def _bytes(x: float | None, per: str = "") -> str:
    if x is None:
        return "—"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= size:
            return f"{x / size:.2f} {unit}{per}"
    return f"{x:.0f} B{per}"


def _engine(e: dict[str, Any] | None) -> str:
    if not e:
        return "no engine reported (its bound is not known)"
    bw = e.get("bandwidth_bytes_per_s")
    copy = e.get("measured_copy_bytes_per_s")
    return (f"engine of {e.get('slots')} slot(s) on {e.get('device_name') or e.get('device')}, weights "
            f"{_bytes(e.get('weights_bytes'))}, bandwidth {_bytes(bw, '/s') if bw else 'not specified'}"
            + (f", measured copy {_bytes(copy, '/s')}" if copy else "")
            + (f", {e['threads']} thread(s)" if e.get("threads") else ""))


def _bound_cell(dev: dict[str, Any]) -> tuple[str, str, str]:
    """The bound, the share of it reached, and where the bandwidth came from — or why not known."""
    if not dev["bound_tokens_per_second"]:  # none reported, or (an earlier probe's) none in flight
        return "not known", "—", dev.get("unknown", "no row in flight")
    got = dev["generated_tokens_per_second"]
    return (f"{dev['bound_tokens_per_second']:,.0f}", "—" if got is None else f"{100 * got / dev['bound_tokens_per_second']:.1f} %",
            f"{dev['bandwidth']} {_bytes(dev['bandwidth_bytes_per_s'], '/s')}, {dev['rows_in_flight']:g} row(s) in flight")


def _sweep(sv: dict[str, Any], attempts: list[str], shared: str | None) -> list[str]:
    levels = ", ".join(map(str, sv["levels"]))
    out = ["## Serving", "",
           f"{sv['attempt']} ({len(attempts)} probe attempt(s)); {sv['replicas']} replicas; stopped for the failure "
           f"phase: {(sv.get('stopped') or {}).get('replica')}; every phase at {levels} request(s) in flight, "
           f"{sv['requests']} requests each.", ""]
    for p in sv["placement"]:
        out.append(f"- {p['replica']}: {p['host'] or 'host not known'}, {p['device'] or 'device not known'}"
                   + (f", sharing it with {', '.join(p['shares_device_with'])} (their scaling is not a device's)"
                      if p["shares_device_with"] else "") + f"; {_engine(p['engine'])}")
    out += ["", "Time to first token and queue wait are the replica's own clocks (from accepting the request); "
            "— where its answers did not carry them.", "",
            "| phase | in flight | answered | failed | retries | wall s | req/s | p50 s | p95 s | first token p50 s "
            "| first token p95 s | generated tok/s | per replica tok/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, f in sv["phases"].items():
        phase, level = key.rsplit("-c", 1)
        ttft = f["time_to_first_token_seconds"]
        per = ", ".join(f"{r} {_cell(x['generated_tokens_per_second'], ',.0f')}" for r, x in f["per_replica"].items())
        out.append(f"| {phase} | {level} | {f['completed']}/{f['requests']} | {f['failed']} | {f['retries']} "
                   f"| {f['wall_seconds']:.2f} | {_cell(f['throughput_rps'])} | {_cell(f['latency_seconds']['p50'])} "
                   f"| {_cell(f['latency_p95_seconds'])} | {_cell(ttft['p50'])} | {_cell(ttft['p95'])} "
                   f"| {_cell(f['generated_tokens_per_second'], ',.1f')} | {per or '—'} |")
    out += ["", "Against the memory-bandwidth bound: a decode step reads a replica's weights once and yields one token "
            "per row in flight, so a device of bandwidth B carrying rows r over weights w yields at most B × r / w "
            "tokens/s (the level's requests split evenly over the replicas answering, at most each engine's slots); "
            "replicas sharing a device share its bound.", "",
            "| phase | in flight | device | replicas | generated tok/s | bound tok/s | of bound | bandwidth |",
            "|---|---|---|---|---|---|---|---|"]
    for key, f in sv["phases"].items():
        phase, level = key.rsplit("-c", 1)
        for dev in f["bound"]["devices"]:
            bound, pct, source = _bound_cell(dev)
            reps = ", ".join(dev["replicas"]) + (" (sharing the device: its bound, shared)" if len(dev["replicas"]) > 1
                                                 else "")
            if dev["shared_with"]:
                reps += f"; also placed on it, not answering here: {', '.join(dev['shared_with'])}"
            out.append(f"| {phase} | {level} | {dev['device']} | {reps} | "
                       f"{_cell(dev['generated_tokens_per_second'], ',.1f')} | {bound} | {pct} | {source} |")
    out.append("")
    for c, between in sv["by_level"].items():
        if "throughput_ratio_replicas_vs_single" in between:
            out.append(f"- {c} in flight: throughput, {sv['replicas']} replicas / 1 replica: "
                       f"{between['throughput_ratio_replicas_vs_single']:.3f}"
                       + (f" (the replicas shared {shared.split(' shared ')[1]}: not a measure of scaling)" if shared else ""))
        if "failover" in between:
            fo = between["failover"]
            out.append(f"- {c} in flight: failover: {fo['extra_retries']} extra retries, p50 latency "
                       f"{fo['extra_latency_p50_seconds']:+.3f} s, p90 {fo['extra_latency_p90_seconds']:+.3f} s, "
                       f"wall × {fo['wall_ratio_failure_vs_replicas']:.3f}")
    out.append(f"- tokens: {sv['tasks_answered']} tasks, {len(sv['tasks_with_differing_tokens'])} with differing "
               f"tokens across phases, replicas and levels; model identities: {len(sv['model_identities'])} "
               f"(selected: {sv['model_matches_selection']})")
    return out + [""]


def _one_level(sv: dict[str, Any] | None, attempts: list[str], shared: str | None = None) -> list[str]:
    if sv is None:
        return ["## Serving", "", "No committed serving probe." + (f" Started: {', '.join(attempts)}." if attempts else ""), ""]
    out = ["## Serving", "",
           f"{sv['attempt']} ({len(attempts)} probe attempt(s)); {sv['replicas']} replicas; stopped for the failure "
           f"phase: {(sv.get('stopped') or {}).get('replica')}.", "",
           "| phase | answered | failed | retries | wall s | req/s | p50 s | p90 s | p95 s | p99 s | generated tok/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, f in sv["phases"].items():
        lat = f["latency_seconds"]
        cell = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
        out.append(f"| {p} | {f['completed']}/{f['requests']} | {f['failed']} | {f['retries']} | {f['wall_seconds']:.2f} "
                   f"| {cell(f['throughput_rps'])} | {cell(lat['p50'])} | {cell(lat['p90'])} "
                   f"| {cell(f.get('latency_p95_seconds'))} | {cell(lat['p99'])} "
                   f"| {cell(f.get('generated_tokens_per_second'))} |")
    out.append("")
    if "throughput_ratio_replicas_vs_single" in sv:
        out.append(f"- throughput, {sv['replicas']} replicas / 1 replica: {sv['throughput_ratio_replicas_vs_single']:.3f}"
                   + (f" (the replicas shared {shared.split(' shared ')[1]}: not a measure of scaling)" if shared else ""))
    if "failover" in sv:
        fo = sv["failover"]
        out.append(f"- failover: {fo['extra_retries']} extra retries, p50 latency {fo['extra_latency_p50_seconds']:+.3f} s, "
                   f"p90 {fo['extra_latency_p90_seconds']:+.3f} s, wall × {fo['wall_ratio_failure_vs_replicas']:.3f}")
    out.append(f"- tokens: {sv['tasks_answered']} tasks, {len(sv['tasks_with_differing_tokens'])} with differing "
               f"tokens; model identities: {len(sv['model_identities'])} (selected: {sv['model_matches_selection']})")
    return out + [""]
