"""What the CLI shows of a trial: the training table, the report's table and gates, a gate's reach."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from orchestrate.cli.console import con
from orchestrate.progress import ConsoleProgress
from training.config import Resolved
from training.results import ArmSummary

if TYPE_CHECKING:
    from evidence.report import Report


class CliView(ConsoleProgress):
    """Progress on the console, and the training and report tables as the trial reaches them."""

    def trained(self, cfg: Resolved, summaries: list[ArmSummary]) -> None:
        show_summaries(cfg, summaries)

    def reported(self, report: Report) -> None:
        show_report(report)


def show_summaries(cfg, summaries: list[ArmSummary]) -> None:
    t = Table(title=f"{cfg.experiment.name}/{cfg.profile_name}: training")
    for col in ("arm", "ranks", "updates", "step s", "loop s", "MB/update", "loss first", "loss last",
                "replicas"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in summaries:
        t.add_row(s.arm, str(s.world_size), str(s.updates), f"{s.step_seconds_median:.3f}",
                  f"{s.training_loop_seconds:.1f}", f"{s.payload_bytes_per_update / 1e6:.2f}",
                  f"{s.loss_first:.4f}", f"{s.loss_last:.4f}",
                  "agree" if s.replicas_agree else "DIFFER")
    con.print(t)
    con.print("step s: median over updates of the slowest rank; MB/update: logical collective payload "
              "per rank; loss: global weighted response loss of the first and last update")


def show_report(rep: Report) -> None:
    """The trial in one table: test accuracy per arm (and what was not run), payload per update, and the
    gates — each one, failed or not evaluated as well as passed."""
    from evidence.report.render import closing, verdict

    for g in rep.gates:
        said = verdict(g)
        if g.failed and g.attainable is not False:  # what it would have taken
            said += f" ({'could pass at this profile: ' if g.attainable else ''}{g.attainability})"
        con.print(f"  gate {g.gate}: " + (f"not evaluated ({g.reason})" if g.not_evaluated
                                          else f"{g.value:.4g} → {said}"),
                  highlight=False)
    t = Table(title=f"{rep.experiment}/{rep.profile}: result (primary {rep.selection['primary']})")
    for col in ("arm", "test exact", "accuracy", "MB/update"):
        t.add_column(col, justify="right")
    for arm, a in rep.accuracy.items():
        mb = rep.arms.get(arm, {}).get("payload_bytes_per_update")
        t.add_row(arm, f"{a['correct']}/{a['cases']}", f"{a['accuracy']:.1%}", "—" if mb is None else f"{mb / 1e6:,.2f}")
    for what, why in rep.not_run.items():
        t.add_row(Text(what), Text(why), "—", "—")
    con.print(t)
    con.print(closing(rep)[0], highlight=False)


def show_attainability(rec: dict) -> None:
    """What each gate of the plan's experiment can reach at its profile (evidence/attainability.py)."""
    from evidence.attainability import UNATTAINABLE


    gates = [g for g in rec["gates"] if not g["gate"].startswith("serving")]
    print(f"{rec['experiment']}: gates at profile {rec['profile']} ({rec['basis']['test_cases']} test cases): "
          f"{sum(g['attainable'] is True for g in gates)} attainable, "
          f"{sum(g['attainable'] is False for g in gates)} {UNATTAINABLE}, "
          f"{sum(g['attainable'] is None for g in gates)} decided by measurement")
    for g in gates:
        print(f"  {g['gate']}: " + (f"{UNATTAINABLE}: " if g["attainable"] is False else "") + g["attainability"])
