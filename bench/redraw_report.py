"""Redraw a stored report.json with the current figures and gate labels (issue #36), where its home
is gone (bench/results keeps reports, not homes):

    python bench/redraw_report.py REPORT.json OUT_DIR [--stem NAME]

A report written before attainability was recorded lacks what the new figures draw: the acceptance
rules, each gate's attainability and the updates after which a periodic arm synchronized. They are
filled in from the experiment's config at the report's profile (`config/experiments/*.toml`, the
same rules prepared.json commits), the analysis from evidence/attainability.py, the sync points from
the schedule the arm runs by (evidence.schedule); every measured figure is the report's own. The
cluster's cores are unknown here, so the timing gates are worded without them. Not evidence: a home's
`python -m evidence report` recomputes all of this from what it committed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evidence import schedule
from evidence.attainability import analyse, by_gate, labelled
from evidence.report.compute import Report
from evidence.report.render import markdown
from evidence.report.figures import plots
from training.config import resolve


def redraw(old: dict, out: Path, stem: str) -> list[str]:
    cfg = resolve(old["experiment"], old["profile"])
    reach = analyse(cfg.as_dict(), None)
    gates = [labelled(g, by_gate(reach)) for g in old["gates"]]
    arms = {}
    for name, a in old["arms"].items():
        arm = cfg.arm(name)
        h = (cfg.profile.sync_every or arm.sync_every) if arm.sync_every else None
        n = len(a["loss_per_update"])
        arms[name] = {**a, "sync_every": h, "compressed_updates": a.get("compressed_updates", []),
                      "outer_steps": a.get("outer_steps") or ([u + 1 for u in range(n) if schedule.due_after(u, n, h)]
                                                              if h else [])}
    rep = Report.model_validate({
        **old, "arms": arms, "gates": gates, "rules": cfg.experiment.acceptance.model_dump(),
        "unattainable_failed_gates": [g["gate"] for g in gates if g["passed"] is False and g["attainable"] is False],
        "not_comparable_gates": old.get("not_comparable_gates", []), "shared": old.get("shared", {}),
        "attainability": {"source": f"redrawn by bench/redraw_report.py from config/experiments at {old['profile']}",
                          "basis": reach["basis"], "gates": {g["gate"]: g["figures"] for g in reach["gates"]}}})
    out.mkdir(parents=True, exist_ok=True)
    names = plots(rep, out, stem)
    (out / f"{stem}.md").write_text(markdown(rep), encoding="utf-8")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--stem", default="report")
    a = ap.parse_args()
    for n in redraw(json.loads(a.report.read_text()), a.out, a.stem):
        print(a.out / n)


if __name__ == "__main__":
    main()
