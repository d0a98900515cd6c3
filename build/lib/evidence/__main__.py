"""`python -m evidence`: verify a trial home's commitments; recompute its report."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from evidence.commitments import CommitmentError, CommitmentLog

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Evidence tools.")


@app.command()
def verify(home: Path = typer.Option(..., help="trial home holding commitments.jsonl")) -> None:
    """Check the hash chain and every committed file; print one JSON line per entry."""
    log = CommitmentLog(home)
    try:
        entries = log.entries()
        if not entries:
            raise CommitmentError(f"no commitments in {log.path}")
        for e in entries:
            log.verify_subject(e)
            print(json.dumps({"seq": e["seq"], "kind": e["kind"], "subject": e["subject"],
                              "sha256": e["sha256"], "ok": True}))
    except CommitmentError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


@app.command()
def report(home: Path = typer.Option(..., help="the trial home"),
           output: Path = typer.Option(..., help="report JSON to write (Markdown beside it, .md)")) -> None:
    """Recompute the report from raw evidence; stop on any inconsistency, changing nothing."""
    from evidence.receipts import ReceiptError
    from evidence.report import EvidenceError, write_report

    try:
        rep = write_report(home, output)
    except (EvidenceError, CommitmentError, ReceiptError, FileNotFoundError) as e:
        typer.echo(f"error: evidence is inconsistent, no report written: {e}", err=True)
        raise typer.Exit(2)
    print(json.dumps({"report": str(output), "markdown": str(output.with_suffix(".md")),
                      "failed_gates": rep["failed_gates"]}))


@app.command()
def canonical(path: Path) -> None:
    """Print the canonical sha256 of a JSON file (what receipts and commitments hash)."""
    from evidence.canonical import canonical_sha256, read_json

    print(canonical_sha256(read_json(path)))


if __name__ == "__main__":
    app()
