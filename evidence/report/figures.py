"""The report's PNG figures, each drawn with what its gates use, so a reader can judge a verdict from
the picture: the paired intervals and the thresholds of the accuracy gates, the loss with the points
where ranks synchronized, the bytes and seconds against the ratios their gates allow. Drawn from the
report's own numbers; nothing else is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evidence.report.compute import Report
from evidence.report.gate import Gate

PASS, FAIL, CANNOT, UNDECIDED = "#2e7d32", "#c62828", "#ef6c00", "#757575"  # CANNOT: failed, unattainable
STYLES = ("-", "--", "-.", ":")


def _gate(rep: Report, prefix: str) -> Gate | None:
    return next((g for g in rep.gates if g.gate.startswith(prefix)), None)


def _colour(g: Gate | None) -> str:
    if g is None or g.passed is None:
        return UNDECIDED
    return PASS if g.passed else CANNOT if g.attainable is False else FAIL


def _said(g: Gate | None) -> str:
    """A gate's verdict in a few words for a figure's title."""
    if g is None:
        return "not evaluated"
    if g.comparable is False:
        return "not comparable (GPUs shared)"
    if g.passed is None:
        return "not evaluated"
    if g.passed:
        return "passed"
    return "FAILED, unattainable at this profile" if g.attainable is False else "FAILED"


def plots(rep: Report, out_dir: Path, stem: str) -> list[str]:
    """loss, bytes, accuracy, costs (and serving, when probed): `<stem>-<name>.png` in `out_dir`."""
    # start-up: matplotlib ~0.7 s, paid only where figures are drawn, not by every command that imports the report
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}-{name}.png", dpi=110, bbox_inches="tight")  # legends outside kept
        plt.close(fig)
        names.append(f"{stem}-{name}.png")

    save(_loss(plt, rep), "loss")
    save(_bytes(plt, rep), "bytes")
    if rep.accuracy:
        save(_accuracy(plt, rep), "accuracy")
    save(_costs(plt, rep), "costs")
    if rep.serving:
        save(_serving(plt, rep.serving), "serving")
    return names


def _loss(plt: Any, rep: Report) -> Any:
    """Each trained arm's global loss per update (line styles differ: arms that compute the same loss,
    single and DDP, overlap), with the updates after which a periodic arm's ranks synchronized
    (DiLoCo's outer steps) as dots and faint lines, and where PowerSGD's compression began."""
    fig, ax = plt.subplots(figsize=(10, 3.8))
    for i, (arm, a) in enumerate(rep.arms.items()):
        xs = list(range(1, len(a["loss_per_update"]) + 1))
        line, = ax.plot(xs, a["loss_per_update"], STYLES[i % len(STYLES)], label=arm,
                        linewidth=max(1.2, 3.2 - 0.8 * i), alpha=0.85)  # earlier arms wider: seen beneath
        outer = a.get("outer_steps") or []
        if outer:
            ax.plot(outer, [a["loss_per_update"][u - 1] for u in outer], "o", color=line.get_color(), markersize=6,
                    label=f"{arm}: outer step (H = {a.get('sync_every')}, {len(outer)} in {len(xs)} updates)")
            for u in outer:
                ax.axvline(u, color=line.get_color(), alpha=0.18, linewidth=3)
        compressed = a.get("compressed_updates") or []
        if compressed:
            ax.axvline(compressed[0] - 0.5, color=line.get_color(), linestyle=":", linewidth=1.2,
                       label=f"{arm}: compressed from update {compressed[0]}")
    ax.set_xlabel("update")
    ax.set_ylabel("global weighted response loss")
    synced = any(a.get("outer_steps") for a in rep.arms.values())
    ax.set_title("training loss" + ("; dots: the updates after which the ranks synchronized" if synced else " per update"),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _bytes(plt: Any, rep: Report) -> Any:
    """Payload per update per rank, with the bytes gate drawn over the primary's bar: its bar must
    end below the line (the gate's ratio × the control's payload)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    arms = list(rep.arms)
    mb = [rep.arms[a]["payload_bytes_per_update"] / 1e6 for a in arms]
    bars = ax.bar(arms, mb, color="#90a4ae")
    ax.bar_label(bars, labels=[f"{x:,.2f}" for x in mb], fontsize=8)
    rules, primary, g = rep.rules, rep.selection["primary"], _gate(rep, "bytes")
    title = "logical payload handed to collectives, per update and rank"
    control = rules.get("max_bytes_ratio_vs")
    if control in rep.arms and primary in rep.arms:
        limit = rules["max_bytes_ratio"] * rep.arms[control]["payload_bytes_per_update"] / 1e6
        i = arms.index(primary)
        bars[i].set_color(_colour(g))
        ax.hlines(limit, i - 0.45, i + 0.45, colors="black", linestyles="--",
                  label=f"gate: {primary} ≤ {rules['max_bytes_ratio']} × {control} = {limit:,.2f} MB")
        ratio = rep.arms[primary]["payload_bytes_per_update"] / rep.arms[control]["payload_bytes_per_update"]
        title = f"{primary} / {control} = {ratio:.4g} (gate ≤ {rules['max_bytes_ratio']}): {_said(g)}"
        ax.legend(fontsize=8, loc="upper left")
    ax.set_ylabel("MB / update / rank")
    ax.set_title(title if any(mb) else "no arm handed payload to collectives", fontsize=9)
    ax.margins(y=0.15)
    ax.set_ylim(0, None if any(mb) else 1)
    return fig


def _accuracy(plt: Any, rep: Report) -> Any:
    """Left: test exact accuracy per arm, with the accuracy the primary would need to pass the gain
    gate and the least that McNemar's gate can accept at this many cases. Right: every paired
    comparison the gates use — the mean difference in pp, its one-sided lower and upper bounds (the
    paired t bounds the gates take, at the rules' confidence) — with each gate's threshold drawn on
    the row it judges."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.35]})
    rules, base, primary = rep.rules, rep.selection["baseline"], rep.selection["primary"]
    arms = list(rep.accuracy)
    accs = [rep.accuracy[a]["accuracy"] * 100 for a in arms]
    gain, mc = _gate(rep, "gain"), _gate(rep, "McNemar")
    bars = left.bar(arms, accs, color=["#90a4ae" if a != primary else _colour(gain) for a in arms])
    left.bar_label(bars, labels=[f"{rep.accuracy[a]['correct']}/{rep.accuracy[a]['cases']}" for a in arms], fontsize=8)
    tops = [*accs]
    least = (rep.attainability["gates"].get(mc.gate, {}) if mc else {}).get("smallest_passing_gain_pp")
    if base in rep.accuracy and primary in arms:
        i, b = arms.index(primary), rep.accuracy[base]["accuracy"] * 100
        left.hlines(b + rules["min_gain_pp"], i - 0.45, i + 0.45, colors="black", linestyles="--",
                    label=f"gain gate: {base} + {rules['min_gain_pp']:g} pp")
        tops.append(b + rules["min_gain_pp"])
        if least is not None:
            left.hlines(b + least, i - 0.45, i + 0.45, colors="black", linestyles=":",
                        label=f"McNemar p ≤ {rules['p_max']}: needs ≥ {base} + {least:.3g} pp")
            tops.append(b + least)
        left.legend(fontsize=7, loc="upper left")
    left.set_ylim(0, min(100.0, max(tops) * 1.5 + 5))
    left.set_ylabel("test exact accuracy, %")
    left.set_title("accuracy (label: correct / cases)", fontsize=9)
    left.tick_params(axis="x", labelsize=8)

    rows = list(rep.comparisons.items())
    ni_vs = rules.get("noninferiority_vs")
    ni = _gate(rep, "noninferiority")
    conf = rules.get("confidence", 0.99)
    for y, (name, c) in enumerate(rows):
        a = c["accuracy_change"]
        mean, lo, hi = a["mean_difference"] * 100, a["lower"] * 100, a["upper"] * 100
        judged = name == f"{primary} vs {base}" and gain or (name == f"{primary} vs {ni_vs}" and ni) or None
        colour = _colour(judged) if judged else "#455a64"
        right.hlines(y, lo, hi, colors=colour, linewidth=2.5)
        right.plot([mean], [y], "o", color=colour)
        right.annotate(f"p = {c['mcnemar_greater']['p_value']:.3g}", (hi, y), xytext=(6, 4), textcoords="offset points",
                       fontsize=7)
        if name == f"{primary} vs {base}":
            right.vlines(rules["min_gain_pp"], y - 0.35, y + 0.35, colors="black", linestyles="--",
                         label=f"gain gate: mean ≥ {rules['min_gain_pp']:g} pp")
            if least is not None:
                right.vlines(least, y - 0.35, y + 0.35, colors="black", linestyles=":",
                             label=f"McNemar p ≤ {rules['p_max']}: least mean that can pass, {least:.3g} pp")
        if ni_vs and name == f"{primary} vs {ni_vs}":
            right.vlines(rules["noninferiority_pp"], y - 0.35, y + 0.35, colors="black", linestyles="-.",
                         label=f"noninferiority gate: lower bound ≥ {rules['noninferiority_pp']:g} pp")
    right.axvline(0, color="#bdbdbd", linewidth=1)
    right.set_yticks(range(len(rows)), [n for n, _ in rows], fontsize=8)
    right.invert_yaxis()
    right.set_xlabel(f"Δ test exact accuracy, pp: dot the mean, line its one-sided {conf:.0%} bounds")
    right.set_title(f"paired differences; gain gate {_said(gain)}, McNemar gate {_said(mc)}"
                    + (f", noninferiority {_said(ni)}" if ni else ""), fontsize=9)
    if rows:  # below the axes: no row is hidden beneath it
        right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    right.margins(x=0.15, y=0.2)
    return fig


def _costs(plt: Any, rep: Report) -> Any:
    """Left: seconds per arm, kept apart. Right (when the rules have timing gates): each timing gate as
    the ratio it judges — the measured value as a bar, the gate's threshold as a line, coloured by the
    verdict (grey: not comparable, or not evaluated)."""
    timing = [g for g in rep.gates if g.gate.startswith(("active time", "active speedup", "whole speedup"))]
    fig, axes = plt.subplots(1, 2 if timing else 1, figsize=(11, 3.8) if timing else (8, 3.8),
                             gridspec_kw={"width_ratios": [1.5, 1]} if timing else None)
    ax = axes[0] if timing else axes
    arms = list(rep.arms)
    keys = ("active_training_seconds", "checkpoint_seconds", "startup_seconds", "whole_process_seconds")
    width = 0.2
    for k_i, k in enumerate(keys):
        ax.bar([i + k_i * width for i in range(len(arms))], [rep.arms[a]["costs"][k] for a in arms],
               width, label=k.replace("_seconds", "").replace("_", " "))
    ax.set_xticks([i + 1.5 * width for i in range(len(arms))], arms)
    ax.set_ylabel("seconds")
    ax.set_title("seconds per arm, kept apart", fontsize=9)
    ax.legend(fontsize=7)
    if timing:
        right = axes[1]
        top = 0.0
        for y, g in enumerate(timing):
            limit = rep.rules["min_speedup"] if "speedup" in g.gate else rep.rules["max_active_ratio"]
            top = max(top, limit, g.value or 0)
            if g.value is not None:
                right.barh(y, g.value, color=_colour(g), height=0.4)
            right.vlines(limit, y - 0.22, y + 0.3, colors="black", linestyles="--")
            shown = "—" if g.value is None else f"{g.value:.3g}"
            right.annotate(f"{g.gate}: {shown} → {_said(g)}", (0, y - 0.25), xytext=(0, 2),
                           textcoords="offset points", fontsize=7, va="bottom")
        right.set_yticks([])
        right.set_xlim(0, top * 1.35)
        right.set_ylim(len(timing) - 0.4, -0.8)
        right.set_xlabel("measured ratio (bar) against the gate's threshold (dashed)")
        right.set_title("timing gates", fontsize=9)
    return fig


def _serving(plt: Any, sv: dict[str, Any]) -> Any:
    ph = sv["phases"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7, 3))
    a1.bar(list(ph), [f["throughput_rps"] or 0 for f in ph.values()])
    a1.set_ylabel("answered requests / s")
    for q in ("p50", "p90", "p99"):
        a2.plot(list(ph), [f["latency_seconds"][q] or 0 for f in ph.values()], marker="o", label=q)
    a2.set_ylabel("latency s (retries included)")
    a2.legend(fontsize=7)
    if len(ph) > 3:  # a sweep: a run per phase and concurrency level (`single-c16`)
        for a in (a1, a2):
            a.tick_params(axis="x", labelrotation=60, labelsize=7)
        fig.tight_layout()
    return fig
