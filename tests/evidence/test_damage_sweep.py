"""The damage sweep: every file of a finished smoke trial's home, and of its preserved copy in the file
store, deleted, cut to half its size, with one byte flipped, and (JSON files) with a byte no UTF-8
text holds — each on an otherwise pristine trial — then whichever of `evidence verify`, `evidence
report`, `orchestrate down` and a resume reads it. Each damage must be refused (exit 2) by at least one of them, naming the damaged file, with no
traceback from any and nothing else in the home changed; or the file is listed below as harmless by
design, with the reason, and the report's verdicts are then shown unchanged.

The counts are printed (`pytest -s`): files x damages tried, refused, harmless by design.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from test_evidence_holes import snapshot, words

HARMLESS = {
    "logs/*": "rank output kept for people; no command reads it as evidence",
    "runs/*/rank-*/heartbeat.json": "a running rank's liveness (status reads it while it runs); not evidence",
    "runs/*/rank-*/checkpoints/*/host.json": "where a checkpoint was written, for people; outside its receipt "
                                             "by design, so an identical replacement host resumes it",
    "*/started.json": "marks an attempt begun; a finished attempt's receipt covers everything it produced",
    "prepare-record.json": "prepare's wall time by phase, for people; not part of the commitment",
    "commitments.jsonl.lock": "an empty lock file",
    "report.json": "the report's output, recomputed from the evidence; nothing reads it",
    "report.md": "the report's output, recomputed from the evidence; nothing reads it",
    "report-*.png": "the report's figures, drawn from its numbers; nothing reads them",
}
DAMAGES = {
    "delete": lambda p: p.unlink(),
    "truncate": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "flip": lambda p: p.write_bytes(_flipped(p.read_bytes())),
    "not-utf8": lambda p: p.write_bytes(_flipped(p.read_bytes(), to=0xFF)),  # JSON files only
}


def _flipped(b: bytes, to: int | None = None) -> bytes:
    """One byte changed, in the middle: its lowest bit flipped, or set to `to`."""
    i = len(b) // 2
    return b[:i] + bytes([b[i] ^ 0x01 if to is None else to]) + b[i + 1:]


def harmless(rel: str) -> str | None:
    return next((why for pat, why in HARMLESS.items() if fnmatch.fnmatch(rel, pat)), None)


def commands(home: Path, out: Path, down: bool) -> dict[str, tuple[int, str, BaseException | None]]:
    """verify, report and (`down`) down as a user types them (in-process, for speed): exit status,
    what was said, and the exception if one escaped the command (a traceback). `down` reads the
    preservation record and the store, never the rest of the home: it is run for those."""
    from evidence.__main__ import app as evidence
    from orchestrate.cli import app as orchestrate

    runs = {"verify": (evidence, ["verify", "--home", str(home)]),
            "report": (evidence, ["report", "--home", str(home), "--output", str(out)]),
            "down": (orchestrate, ["down", "--home", str(home)])}
    got = {}
    for name, (app, args) in runs.items():
        if name == "down" and not down:
            continue
        r = CliRunner().invoke(app, args)
        escaped = None if r.exception is None or isinstance(r.exception, SystemExit) else r.exception
        got[name] = (r.exit_code, words(r.stdout + r.stderr), escaped)
    return got


MANIFEST_ABSENT = ("a manifest that is unreadable or differs from its peers' counts as absent: the group "
                   "resumes from the latest step every rank holds intact, later files set aside")


def resume_check(home: Path, rel: str) -> tuple[int, str, BaseException | None] | None:
    """What a resume does with a damaged checkpoint file or manifest: the step every rank holds an
    identical manifest for is chosen (None: the damaged step is not that one), then that rank's
    state for it is verified and loaded."""
    from training.checkpoint.group import load_rank_state
    from evidence.errors import UserError
    from training.runs import latest_common, local_manifests

    parts = Path(rel).parts  # runs/<arm>/rank-<r>/(checkpoints/step-<n>/<file> | manifests/step-<n>.json)
    rank_dir, rank, step = home.joinpath(*parts[:3]), int(parts[2][5:]), int(Path(parts[4]).stem[5:])
    if parts[3] == "manifests" and latest_common([local_manifests(d) for d in
                                                  sorted(rank_dir.parent.glob("rank-*"))]) != step:
        return None
    try:
        load_rank_state(rank_dir, step, rank)
    except UserError as e:
        return 2, words(str(e)), None
    except Exception as e:  # noqa: BLE001
        return 1, repr(e), e
    return 0, "", None


@pytest.fixture(scope="module")
def sweep_trial(finished_trial, tmp_path_factory):
    """A pristine copy and a working copy of the finished trial (home and store), the working home's
    record pointing at the working store; and the report it gives undamaged."""
    from evidence.canonical import canonical_sha256
    from evidence.report import build_report

    root, trial = tmp_path_factory.mktemp("sweep"), finished_trial.home.name
    for name in ("pristine", "work"):  # each home keeps its trial's name: the anchors are found by it
        shutil.copytree(finished_trial.home, root / name / "trials" / trial)
        shutil.copytree(finished_trial.store, root / name / "store")
        (root / name / "home").symlink_to(root / name / "trials" / trial)
        rec_path = root / name / "home" / "preserved.json"
        rec = json.loads(rec_path.read_text())
        rec["store"] = f"file://{root / 'work' / 'store'}/"
        rec["digest"] = canonical_sha256({k: v for k, v in rec.items() if k != "digest"})
        rec_path.write_text(json.dumps(rec, indent=2))
    return root, build_report(root / "work" / "home")


@pytest.fixture
def figures_drawn_once(monkeypatch):
    """`report` draws its figures from the Report alone (`figures.plots(rep, …)` reads no file), so a
    report whose numbers were drawn before gets the very bytes drawn then: every command still runs
    whole and writes every file, but the sweep's hundreds of unchanged reports (a damaged store object
    leaves the home's numbers as they were) do not each spend 2.5 s in matplotlib."""
    import hashlib

    from evidence.report import render

    real, drawn = render.plots, {}

    def plots(rep, out_dir: Path, stem: str) -> list[str]:
        key = (hashlib.sha256(json.dumps(rep.model_dump(), sort_keys=True, default=str).encode()).hexdigest(), stem)
        if key not in drawn:
            drawn[key] = {n: (out_dir / n).read_bytes() for n in real(rep, out_dir, stem)}
        else:
            for n, data in drawn[key].items():
                (out_dir / n).write_bytes(data)
        return list(drawn[key])

    monkeypatch.setattr(render, "plots", plots)
    return drawn


@pytest.fixture
def commands_built_once(monkeypatch):
    """typer's `CliRunner.invoke(app, …)` builds the app's click command from its functions on every call
    (`typer.testing._get_command(app)`, ~5 ms: each parameter's annotations read again); the sweep's ~2,300
    invocations build each app's once. It is the command `app()` itself would build, unchanged: every
    invocation still parses its arguments and runs the command's function as a user's does."""
    import functools

    import typer.testing

    monkeypatch.setattr(typer.testing, "_get_command", functools.cache(typer.testing._get_command))


def test_damage_sweep(sweep_trial, finished_trial, figures_drawn_once, commands_built_once):
    from evidence.report import build_report

    root, baseline = sweep_trial
    trial = finished_trial.home.name
    work, pristine, out = root / "work", root / "pristine", root / "out" / "r.json"
    (root / "out").mkdir(exist_ok=True)
    index = json.loads((pristine / "store" / json.loads((pristine / "home" / "preserved.json").read_text())["index"])
                       .read_text())["files"]
    paths_of = {}  # store object key → the home paths it holds
    for rel, f in index.items():
        paths_of.setdefault(f"objects/sha256/{f['sha256'][:2]}/{f['sha256']}", []).append(rel)
    targets = [("home", str(p.relative_to(pristine / "home"))) for p in sorted((pristine / "home").rglob("*"))
               if p.is_file()]
    ours = (*paths_of, f"indexes/{trial}/", f"anchors/{trial}/")  # not the earlier experiment's anchors
    targets += [("store", str(p.relative_to(pristine / "store"))) for p in sorted((pristine / "store").rglob("*"))
                if p.is_file() and str(p.relative_to(pristine / "store")).startswith(ours)]
    tally = {"tried": 0, "refused": 0, "harmless": 0}
    harmless_seen: dict[str, int] = {}
    problems: list[str] = []
    for side, rel in targets:
        src, dst = pristine / side / rel, work / side / rel
        for kind, damage in DAMAGES.items():
            if kind != "delete" and src.stat().st_size == 0:
                continue  # nothing to cut or flip
            if kind == "not-utf8" and not rel.endswith((".json", ".jsonl")):
                continue  # a byte no UTF-8 text holds: for the files read as JSON
            tally["tried"] += 1
            before = snapshot(work / "home")
            damage(dst)
            try:
                why = harmless(rel) if side == "home" else None
                resumed = None
                if side == "home" and ("/checkpoints/" in rel or "/manifests/" in rel) and why is None:
                    resumed = resume_check(work / "home", rel)
                    why = MANIFEST_ABSENT if resumed is None else None
                if why is not None:
                    if why != MANIFEST_ABSENT and build_report(work / "home") != baseline:
                        problems.append(f"{side}:{rel} {kind}: listed as harmless, but it changed the report")
                    tally["harmless"] += 1
                    harmless_seen[why] = harmless_seen.get(why, 0) + 1
                    continue
                said = commands(work / "home", out, down=side == "store" or rel == "preserved.json")
                if resumed is not None:
                    said["resume"] = resumed
                names = [rel] + paths_of.get(rel, [])
                crashed = {c: e for c, (_, _, e) in said.items() if e is not None}
                refusals = {c: text for c, (code, text, _) in said.items() if code == 2}
                named = [c for c, text in refusals.items() if any(n in text for n in names)]
                if crashed:
                    problems.append(f"{side}:{rel} {kind}: a traceback from {crashed}")
                elif not named:
                    problems.append(f"{side}:{rel} {kind}: not refused by name "
                                    f"({ {c: (code, text[:160]) for c, (code, text, _) in said.items()} })")
                else:
                    tally["refused"] += 1
                after = {k: v for k, v in snapshot(work / "home").items() if k != rel}
                if after != {k: v for k, v in before.items() if k != rel}:
                    problems.append(f"{side}:{rel} {kind}: something else in the home changed")
            finally:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    print(f"\ndamage sweep: {tally['tried']} damages tried ({len(targets)} files x delete/truncate/flip, and a "
          f"byte that is not UTF-8 in each JSON file; empty files not cut or flipped): {tally['refused']} refused "
          f"by name, {tally['harmless']} harmless by design")
    for why, n in sorted(harmless_seen.items()):
        print(f"  harmless ({n}): {why}")
    print(f"  figures drawn for {len(figures_drawn_once)} distinct report(s)")
    assert not problems, "\n".join(problems[:40]) + f"\n({len(problems)} in all)"
    assert tally["refused"] + tally["harmless"] == tally["tried"]
