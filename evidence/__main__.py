"""`python -m evidence`: verify a trial home's commitments; recompute its report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from evidence.anchors import AnchorError, verify_anchors
from evidence.canonical import EvidenceFileError, canonical_sha256, read_json
from evidence.commitments import CommitmentError, CommitmentLog
from evidence.covered import CoveredFileError
from evidence.receipts import ReceiptError
from evidence.stores import PreservationError, preserve_part

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Evidence tools.")


STORE_HELP = ("evidence store holding the log's anchors (default: the one preserved.json names, else "
              "<home's parent>/store if it holds the trial's anchors; without one, only the hash chain is checked)")
TRIAL_HELP = "the trial's name in the store (default: the one its preservation recorded, else the home's folder name)"


def _anchors(home: Path, entries: list, store: str | None, trial: str | None) -> dict | None:
    """Check the anchors and say on stderr what was checked."""
    a = verify_anchors(home, entries, store, trial)
    if a is None:
        typer.echo("anchors: no store known (--store): only the hash chain was checked", err=True)
    else:
        typer.echo(f"anchors: {a['anchored']} of {a['entries']} commitments match their anchors in {a['store']}"
                   + (f"; not anchored yet: {a['not_anchored']}" if a["not_anchored"] else ""), err=True)
        if a["released"]:  # the name was used before: visible, and no longer this trial's
            typer.echo(f"anchors: the store also holds {a['released']} released chain(s) of trial {a['trial']} "
                       f"(homes discarded unpreserved; {a['store']}released/{a['trial']}/): not this log's", err=True)
    return a


@app.command()
def verify(home: Path = typer.Option(..., help="trial home holding commitments.jsonl"),
           store: Optional[str] = typer.Option(None, help=STORE_HELP),
           trial: Optional[str] = typer.Option(None, help=TRIAL_HELP)) -> None:
    """Check the hash chain, every committed file and the store's anchors; one JSON line per entry."""
    log = CommitmentLog(home)
    try:
        entries = log.entries()
        if not entries:
            raise CommitmentError(f"no commitments in {log.path}")
        for e in entries:
            log.verify_subject(e)
            print(json.dumps({"seq": e["seq"], "kind": e["kind"], "subject": e["subject"],
                              "sha256": e["sha256"], "ok": True}))
        _anchors(home, entries, store, trial)
    except (CommitmentError, AnchorError, EvidenceFileError, PreservationError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


@app.command()
def report(home: Path = typer.Option(..., help="the trial home"),
           output: Path = typer.Option(..., help="report JSON to write (Markdown beside it, .md)"),
           store: Optional[str] = typer.Option(None, help=STORE_HELP),
           trial: Optional[str] = typer.Option(None, help=TRIAL_HELP)) -> None:
    """Recompute the report from raw evidence; stop on any inconsistency, changing nothing."""
    # start-up: evidence.report (pydantic) ~0.15 s, paid only by this command, not by --help or the others
    from evidence.report import EvidenceError, write_report

    try:
        rep = write_report(home, output, store=store, trial=trial)
    except CoveredFileError as e:
        typer.echo(f"error: refused, no report written: {e}", err=True)
        raise typer.Exit(2)
    except (EvidenceError, CommitmentError, ReceiptError, EvidenceFileError, FileNotFoundError) as e:
        typer.echo(f"error: evidence is inconsistent, no report written: {e}", err=True)
        raise typer.Exit(2)
    print(json.dumps({"report": str(output), "markdown": str(output.with_suffix(".md")),
                      "failed_gates": rep.failed_gates}))


@app.command("recovery-report")
def recovery_report(out: Path = typer.Option(..., help="the recovery trial's folder (`orchestrate recovery-trial "
                                             "--out`), holding recovery-comparison.json")) -> None:
    """Recompute the recovery trial's report (recovery-report.json, .md) from recovery-comparison.json, its
    digest checked; write it where absent, and exit 2, writing nothing, where what is on disk differs."""
    from evidence.report.recovery import REPORT, write_recovery_report, summary_line  # pydantic: this command's only

    try:
        v, written = write_recovery_report(out)
    except (EvidenceFileError, CoveredFileError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(f"{v.arm}: {summary_line(v)}", err=True)
    print(json.dumps({"report": str(out / REPORT), "markdown": str((out / REPORT).with_suffix(".md")),
                      "written": [str(p) for p in written], "verdict": v.verdict, "conclusion": v.conclusion}))


@app.command("preserve-part")
def preserve_part_cmd(home: Path = typer.Option(..., help="this host's copy of the trial home"),
                      store: str = typer.Option(..., help="the trial's evidence store")) -> None:
    """On an SSH host: preserve the checkpoint payloads that stay here, from here (uploaded, read back
    and hashed in region); print {path: {sha256, size}} as JSON for the controller's index."""
    try:
        print(json.dumps(preserve_part(home, store), sort_keys=True))
    except (PreservationError, EvidenceFileError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


@app.command()
def canonical(path: Path) -> None:
    """Print the canonical sha256 of a JSON file (what receipts and commitments hash)."""
    try:
        print(canonical_sha256(read_json(path, kind=None)))
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


if __name__ == "__main__":
    app()
