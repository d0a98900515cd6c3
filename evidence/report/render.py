"""The report's last step: a computed `Report` drawn as Markdown and PNG figures and written beside
report.json — unless any file would replace evidence (`evidence.covered`). Drawn from the report's
own numbers; nothing else is read.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from evidence.attainability import UNATTAINABLE
from evidence.canonical import json_bytes, write_bytes_atomic
from evidence.covered import guard_writes
from evidence.placement import SERVING_PROBE
from evidence.report.compute import Report
from evidence.report.figures import plots
from evidence.report.gate import Gate
from evidence.report.serving import serving_markdown


def markdown(rep: Report) -> str:
    lines = [f"# {rep.experiment} ({rep.profile}) — trial report", "",
             f"Selection (committed at log entry {rep.selection_committed_at_seq}, fixed by the rules): "
             f"primary **{rep.selection['primary']}**, serving {rep.selection['serving']}.", "",
             _anchors_line(rep.anchors), "",
             "## Gates", "",
             "Each verdict beside what the gate could reach at this profile (evidence/attainability.py): a gate "
             "no outcome at this scale could pass is marked unattainable — still failed, never hidden.", "",
             "| gate | value | result | what this profile can detect |", "|---|---|---|---|"]
    for g in rep.gates:
        lines.append(f"| {g.gate} | {_value(g)} | {verdict(g, md=True)} | "
                     f"{'—' if g.unattainable_failure else g.attainability} |")
    lines += ["", *closing(rep, md=True), "", f"Attainability: {rep.attainability['source']}."]
    if rep.shared:
        lines += ["", "## GPUs shared on purpose", "", "Placed so at the operator's request (`--share-gpus`, committed in "
                  "placement.json): the learning results stand, the seconds are not those of a GPU per process, so "
                  "the gates that compare them are shown not comparable, with their figures.", ""]
        lines += [f"- {what}: {how}" for what, how in rep.shared.items()]
    if rep.not_run:
        lines += ["", "## Not run", "", "Decided from the cluster before anything trained (placement.json, committed): "
                  "never launched, never a candidate, never scored; the gates that need them are not evaluated.", ""]
        lines += [f"- {what}: {why}" for what, why in rep.not_run.items()]
    lines += ["", "## Test accuracy", "", "| arm | correct / cases | accuracy | attempts |", "|---|---|---|---|"]
    for arm, a in rep.accuracy.items():
        lines.append(f"| {arm} | {a['correct']} / {a['cases']} | {a['accuracy']:.3f} | {a['attempts']} |")
    if rep.cases:
        lines += ["", f"Test cases from {rep.cases['file']} (sha256 {rep.cases['sha256'][:12]}…): "
                      f"{rep.cases['said'].removeprefix('cases: ')}."]
    lines += failures_markdown(rep.failures, rep.accuracy)
    lines += ["", "## Paired comparisons", "",
              "| comparison | Δ accuracy | one-sided lower | McNemar p | Δ retention loss upper |", "|---|---|---|---|---|"]
    for k, c in rep.comparisons.items():
        ret = c.get("retention_loss_change", {}).get("upper")
        lines.append(f"| {k} | {c['accuracy_change']['mean_difference']:+.4f} | {c['accuracy_change']['lower']:+.4f} "
                     f"| {c['mcnemar_greater']['p_value']:.4g} | {'' if ret is None else f'{ret:+.4f}'} |")
    lines += ["", "## Training and costs (kept apart)", "",
              "| arm | ranks | loss first → last | payload B/update | active s | checkpoint s | startup s "
              "| whole-process s | device-seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, a in rep.arms.items():
        c = a["costs"]
        lines.append(f"| {arm} | {a['world_size']} | {a['loss_per_update'][0]:.4f} → {a['loss_per_update'][-1]:.4f} "
                     f"| {a['payload_bytes_per_update']:,.0f} | {c['active_training_seconds']:.2f} "
                     f"| {c['checkpoint_seconds']:.2f} | {c['startup_seconds']:.2f} | {c['whole_process_seconds']:.2f} "
                     f"| {c['allocated_device_seconds']:.2f} |")
    lines += ["", "Dollars: not applicable on the embedded local cluster (no price).", ""]
    lines += serving_markdown(rep.serving, rep.serving_attempts, rep.shared.get(SERVING_PROBE))
    lines += recovery_markdown(rep.recovery_comparisons)
    lines += grace_markdown(rep.graces)
    return "\n".join(lines)


FIELDS_SHOWN = 6  # keys named per reason on a line; the rest are counted


def failures_markdown(failures: dict[str, dict[str, Any]], accuracy: dict[str, dict[str, Any]]) -> list[str]:
    """The "## Why answers failed" section: per arm, its wrong test answers by the checker's reason, most first,
    and for a reason that names a key the keys it names (`wrong_value 12 (total 8, unit 4)`). None for a report
    without a breakdown (its arms scored before one was kept)."""
    if not failures:
        return []
    lines = ["", "## Why answers failed", "",
             "The checker's reason for each wrong test answer (evidence/checker.py) and, where it names one, the "
             "field (or the key the answer wrote) — an object answer's first failing field; then, for object "
             "answers, every field wrong; every answer is in "
             "`evaluations/test/<arm>/attempt-<n>/answers.jsonl`.",
             ""]
    for arm in [*(a for a in accuracy if a in failures), *(a for a in failures if a not in accuracy)]:
        f, cases = failures[arm], accuracy.get(arm, {}).get("cases")  # in the accuracy table's order, from JSON too
        head = f"- {arm}: {f['wrong']}" + (f" of {cases}" if cases is not None else "") + " wrong"
        parts = []
        for kind, n in _most_first(f["reasons"]):
            keys = _most_first(f["fields"].get(kind, {}))
            named = [f"{_shown_key(k)} {m}" for k, m in keys[:FIELDS_SHOWN]]
            if len(keys) > FIELDS_SHOWN:
                named.append(f"{len(keys) - FIELDS_SHOWN} more keys {sum(m for _, m in keys[FIELDS_SHOWN:])}")
            whole = n - sum(m for _, m in keys)
            if keys and whole:
                named.append(f"no field {whole}")
            parts.append(f"{kind} {n}" + (f" ({', '.join(named)})" if named else ""))
        every = _most_first(f.get("wrong_fields", {}))
        lines.append(head + (f" — {', '.join(parts)}" if parts else "")
                     + (f"; fields wrong, each answer under every field it gets wrong: "
                        f"{', '.join(f'{_shown_key(k)} {m}' for k, m in every)}" if every else ""))
    return lines


def _most_first(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _shown_key(key: str) -> str:
    """A key as a line shows it: as written when short and plain, else as JSON, cut short."""
    if key and len(key) <= 24 and key.isprintable() and not any(c in key for c in ",()`|"):
        return key
    return json.dumps(key[:21] + ("…" if len(key) > 21 else ""), ensure_ascii=False)


def grace_markdown(graces: list[dict[str, Any]]) -> list[str]:
    """The "## After the deadline" section: each grace granted to preserve the trial, what it cost, and that the
    cloud ended it (the deadline stop's sweep and each host's own check honour it only until its end)."""
    if not graces:
        return []
    lines = ["", "## After the deadline", "",
             "| granted | from | until | minutes | hosts | USD | why |", "|---|---|---|---|---|---|---|"]
    for g in graces:
        lines.append(f"| {g['granted_at']} | {g['start']} | {g['end']} | {g['minutes']:g} | {len(g['hosts'])} "
                     f"| {g['usd']:.2f} | {g['reason']} |")
    total = sum(g["usd"] for g in graces)
    lines += ["", f"{len(graces)} grace(s), ${total:.2f} in all ({graces[0]['price_source']}); the deadline was "
                  f"{graces[0]['deadline']}. Each ended in the cloud at its end (the deadline stop's sweep and every "
                  "host's own check honour a grace only until then, at most the stack's cap), whatever the controller "
                  "did.", ""]
    return lines


def recovery_markdown(comparisons: list[dict[str, Any]]) -> list[str]:
    """The "## Recovery" section: each recovery comparison under the home in the words of its own report
    (evidence/report/recovery.py), so the trial report and recovery-report.md never say it differently."""
    if not comparisons:
        return []
    return ["## Recovery", "", "Each recovery trial's comparison found under the home, its digest checked "
            "(`python -m evidence recovery-report --out <its folder>` renders one whole).", "",
            *[f"- {r['file']}: {r['summary']}" for r in comparisons], ""]


def _value(g: Gate) -> str:
    return "—" if g.value is None else f"{g.value:.4g}"


def verdict(g: Gate, md: bool = False) -> str:
    """A gate's result in words, as the console and report.md say it: passed, failed — with "(unattainable
    at this profile: why)" when no outcome at this scale could pass it — not evaluated or not comparable."""
    failed = "**FAILED**" if md else "FAILED"
    cannot = f"{UNATTAINABLE}: {g.attainability}"
    if g.comparable is False:
        return f"{g.reason}" + (f"; {cannot}" if g.attainable is False else "")
    if g.passed is None:
        return f"not evaluated: {g.reason}"
    if g.passed:
        return "passed"
    return f"{failed} ({cannot})" if g.attainable is False else failed


def closing(rep: Report, md: bool = False) -> list[str]:
    """The gates in one line (the console's closing line; report.md's summary): the passed count, then
    the failures that could have passed at this profile apart from those that could not, then what was
    not evaluated or not comparable."""
    failed, cannot = rep.failed_gates, rep.unattainable_failed_gates
    unevaluated, incomparable = rep.not_evaluated_gates, rep.not_comparable_gates
    could = [g for g in failed if g not in cannot]
    n = len(rep.gates)
    head = f"gates: {n - len(failed) - len(unevaluated) - len(incomparable)} of {n} passed"
    parts = ([f"failed: {'; '.join(could)}"] if could else []) + \
        ([f"failed, {UNATTAINABLE} (could not have passed): {'; '.join(cannot)}"] if cannot else []) + \
        ([f"not evaluated: {'; '.join(unevaluated)}"] if unevaluated else []) + \
        ([f"not comparable (GPUs shared on purpose): {'; '.join(incomparable)}"] if incomparable else [])
    if not md:
        return ["; ".join([head, *parts])]
    return [f"**{head[0].upper()}{head[1:]}.**", *[f"- {p[0].upper()}{p[1:]}" for p in parts]]


def _anchors_line(a: dict[str, Any] | None) -> str:
    if a is None:
        return "Commitments log: hash chain checked; no evidence store was known, so its anchors were not."
    return (f"Commitments log: {a['anchored']} of {a['entries']} entries match their anchors in {a['store']}"
            + (f"; entries {a['not_anchored']} were not anchored." if a["not_anchored"] else "."))


def write(rep: Report, output: Path) -> None:
    """Render every file the report makes, then write them — unless any would replace a file of
    evidence (`evidence.covered`): then nothing is written."""
    with tempfile.TemporaryDirectory() as tmp:
        figures = plots(rep, Path(tmp), output.stem)
        writes = {output.parent / n: (Path(tmp) / n).read_bytes() for n in figures}
    md = markdown(rep) + "\n## Figures\n\n" + "".join(f"![{n}]({n})\n\n" for n in figures)
    writes = {output: json_bytes(rep.model_dump(mode="json")), **writes, output.with_suffix(".md"): md.encode("utf-8")}
    for path, data in guard_writes(writes).items():
        write_bytes_atomic(path, data)
