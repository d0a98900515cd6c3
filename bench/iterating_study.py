"""A researcher iterating on docs/your-own-study.md's study, command by command as a user types them:
changing the task file under a used name, removing, stopping a run with Ctrl-C and running it again,
answers that are JSON objects, and a home prepared by the code before #67 (b53b2ff) read by today's.

    .venv/bin/python bench/iterating_study.py OUT_DIR [--old /tmp/oldtree] [--only A,B,C,D,E]

OUT_DIR must be new (or empty). The page's own files (its `<!-- walk: file … -->` blocks: make_cases.py,
make_model.py, config/experiments/my-study.toml) are written to OUT_DIR/base and run there once (200
cases, the small random Llama `my-llama`); each sequence then copies that folder into OUT_DIR/<letter>
and works there alone:

  A  stranded name: run (preserved) → append one case to cases.jsonl → validate → run (refused) → the
     command the refusal names, parsed from its backquotes and run as it is; then validate again, in the
     default folder (what it names now) and in the folder it named.
  B  the same after `orchestrate remove --home trials/my-study-smoke` (the page's order): run → remove →
     append a case → validate → run (refused) → the command it names.
  C  Ctrl-C: the page's smoke profile sets no checkpoint_every (64 updates: a group checkpoint every 16 by
     default). `orchestrate run` is started in its own session; once runs/ddp-pair/rank-0/heartbeat.json
     says update ≥ 20, SIGINT goes to that one process (by its pid, as a terminal's Ctrl-C reaches the
     CLI; the ranks are its children and are stopped by it). Its last lines are printed, the same command
     is run again ("resumed from step N" found in its output and in the home's logs/), then the same study
     uninterrupted in --trials trials-clean; each trained arm's runs/<arm>/rank-0/result.json
     digests.final_parameters is compared (equal / DIFFERENT), and sequence A's home (same study, same
     seed files, never interrupted) is printed beside them when A ran.
  D  object answers: a second experiment `orders` (the page's arms and profile shape) on orders.jsonl,
     200 cases whose answers are {"total": int, "unit": str}, each with an `id`, splits unlabelled:
     validate (its tasks/cases/checks lines, per-family fields and "trained as" lines), run, report.md's
     "## Why answers failed", report.json's "failures", and `python -m training check --case <id>` of a
     test case with answers on stdin.
  E  a home prepared before #67: a 240-case file that labels its splits (train 140, dev 24, test 76,
     interleaved; the profile takes 120/16/64, so the old rule, the first cases of each split in file
     order, and the new draw by seed pick different cases) is run by the old checkout (PYTHONPATH=OLD)
     into trials-old; then with this checkout: `python -m evidence verify`, `python -m evidence report`
     compared with the home's report.json (the differing keys named), `orchestrate validate … --trials
     trials-old` (its "home" and "cases:" lines) and `orchestrate run … --trials trials-old` again.

Every command is printed as `$ command  [folder]`, then `→ exit N (seconds): OUTCOME`, where OUTCOME is one
line of its output: the first line starting "error:", "refused:", "Usage:" or "kept" (a command that did
not do its work says why there first); else "removed …"/"discarded …" (remove); else "interrupted"/
"terminated" (a stopped run); else, for `run`, the "gates:" line (the study's verdict; its "prepared,
trained, …" line follows it); else the first line (validate's "valid"), or for `evidence verify` its last
line (the anchors' verdict). "warning:" lines follow it. Then what is on disk: each trials folder's
top-level entries (hidden lock files `.NAME.lock` included), its store's indexes/, anchors/ and released/
(per trial: how many files), and .seeds/. Every command's whole output is in OUT_DIR/logs/NN-….txt.

Sequences B, C and D run with --no-serve (the serving probe is not what they look at, and it costs ~10 s
a run); A and E run the page's command as it is. About 10 runs of the study: ~10–15 minutes on 2 cores.
The script exits 1 if a Traceback appears in any output or a sequence's expectation (named in the
transcript with "UNEXPECTED") does not hold; a different digest is reported, not an exit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your-own-study.md"
STUDY = ["my-study", "--profile", "smoke", "--model-dir", "my-llama"]
NEW_CASES = ['{"prompt": "What is 1 + 1? Reply with the number only.", "answer": 2}',
             '{"prompt": "What is 2 + 3? Reply with the number only.", "answer": 5}']

OUT = Path()
N = 0
BAD: list[str] = []


def blocks() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- walk: file (\S+) -->\n```\w*\n(.*?)```", text, re.S))


def env_for(code: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(code), COLUMNS="400", NO_COLOR="1", PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("TRIAL_CONFIG_DIR", None)
    return env


def shown(argv: list[str], code: Path) -> str:
    """The command as a user types it: `orchestrate …` for `python -m orchestrate …` of this checkout."""
    if argv[:2] == ["-m", "orchestrate"] and code == ROOT:
        return shlex.join(["orchestrate", *argv[2:]])
    prefix = "" if code == ROOT else f"PYTHONPATH={code} "
    return prefix + shlex.join(["python", *argv])


def log_name(label: str) -> Path:
    global N
    N += 1
    return OUT / "logs" / f"{N:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', label).strip('-')[:80]}.txt"


def outcome(out: str, argv: list[str]) -> tuple[str, list[str]]:
    """The one line that says what the command did (see the module's docstring), and its warnings."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    warnings = [ln for ln in lines if ln.startswith("warning:")]
    if not lines:
        return "(no output)", warnings
    for starts in (("error:", "refused:", "Usage:", "kept "), ("removed ", "discarded "),
                   ("interrupted", "terminated")):
        hit = next((ln for ln in lines if ln.startswith(starts)), None)
        if hit:
            return hit, warnings
    if "run" in argv[:3]:
        gates = next((ln for ln in lines if ln.startswith("gates:")), None)
        done = next((ln for ln in lines if ": prepared, trained," in ln), None)
        if gates:
            return gates + (f"\n      {done}" if done else ""), warnings
    if "verify" in argv[:4]:
        return lines[-1], warnings
    return lines[0], warnings


def cmd(folder: Path, argv: list[str], *, code: Path = ROOT, label: str = "", stdin: str | None = None,
        pick: Optional[str] = None) -> tuple[int, str]:
    """Run `python ARGV` in `folder`, print it, its exit and outcome, then what is on disk."""
    t = time.monotonic()
    p = subprocess.run([sys.executable, *argv], cwd=folder, env=env_for(code), input=stdin if stdin is not None else "",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    s = time.monotonic() - t
    line = shown(argv, code)
    log = log_name(f"{folder.name}-{label or ' '.join(argv[1:4])}")
    log.write_text(f"$ {line}\n# in {folder}" + (f"\n# stdin: {stdin!r}" if stdin is not None else "")
                   + f"\n{p.stdout}\nexit {p.returncode} ({s:.1f} s)\n")
    print(f"\n$ {line}" + (f"   <<< {stdin.strip()!r}" if stdin else "") + f"   [{folder.name}/]")
    said, warnings = outcome(p.stdout, argv)
    if pick is not None:
        said = pick
    print(f"  → exit {p.returncode} ({s:.0f} s): {said}")
    for w in warnings:
        print(f"      {w}")
    if "Traceback" in p.stdout:
        BAD.append(f"Traceback in {log.name}")
        print(f"  UNEXPECTED: a Traceback (see logs/{log.name})")
    print(f"  (full output: logs/{log.name})")
    disk(folder)
    return p.returncode, p.stdout


def count(d: Path) -> int:
    return sum(1 for f in d.rglob("*") if f.is_file())


def disk(folder: Path) -> None:
    """Each trials folder's top level, its store's indexes/ anchors/ released/, and .seeds/."""
    trials = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("trials"))
    if not trials:
        print("  disk: no trials folder")
    for t in trials:
        entries = sorted(t.iterdir(), key=lambda p: p.name)
        print(f"  disk: {t.name}/: " + (", ".join(p.name + ("/" if p.is_dir() else "") for p in entries) or "empty"))
        store = t / "store"
        if store.is_dir():
            parts = []
            for sub in ("indexes", "anchors", "released"):
                d = store / sub
                if not d.is_dir():
                    parts.append(f"{sub}/ none")
                    continue
                kids = sorted(d.iterdir())
                parts.append(f"{sub}/ " + (", ".join(f"{k.name} ({count(k)} file{'s' if count(k) != 1 else ''}"
                                                      + (f" in {sum(1 for c in k.iterdir() if c.is_dir())} chain(s)"
                                                         if sub == "anchors" else "") + ")" for k in kids)
                                           or "empty"))
            print(f"        {t.name}/store: " + "; ".join(parts))
    seeds = folder / ".seeds"
    print("        .seeds/: " + (", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in seeds.iterdir()))
                                 if seeds.is_dir() else "none"))


def named_command(out: str) -> Optional[list[str]]:
    """The `orchestrate …` command a refusal names (the first in backquotes), as argv for `python -m`."""
    for quoted in re.findall(r"`([^`]+)`", out):
        if quoted.startswith("orchestrate ") and "…" not in quoted and "URL" not in quoted:
            return ["-m", "orchestrate", *shlex.split(quoted)[1:]]
    return None


def expect(ok: bool, what: str) -> None:
    if not ok:
        BAD.append(what)
        print(f"  UNEXPECTED: {what}")


def append_case(folder: Path, line: str) -> None:
    with open(folder / "cases.jsonl", "a") as f:
        f.write(line + "\n")
    n = len((folder / "cases.jsonl").read_text().splitlines())
    print(f"\n# cases.jsonl changed: appended {line}  ({n} lines now)   [{folder.name}/]")


def study_copy(base: Path, name: str) -> Path:
    folder = OUT / name
    shutil.copytree(base, folder)
    return folder


def header(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", flush=True)


def digest(home: Path, arm: str) -> str:
    try:
        return json.loads((home / "runs" / arm / "rank-0" / "result.json").read_text())["digests"]["final_parameters"]
    except (OSError, KeyError, ValueError) as e:
        return f"(none: {type(e).__name__})"


# --- A -------------------------------------------------------------------------------------------------

def seq_a(base: Path) -> Path:
    header("A. A stranded name: a preserved home, then a changed cases.jsonl under the same name")
    a = study_copy(base, "a")
    rc, _ = cmd(a, ["-m", "orchestrate", "run", *STUDY], label="run")
    expect(rc == 0 and (a / "trials" / "my-study-smoke" / "preserved.json").is_file(), "A: the first run preserved its home")
    print(f"  preserved.json in trials/my-study-smoke: {(a / 'trials' / 'my-study-smoke' / 'preserved.json').is_file()}")
    append_case(a, NEW_CASES[0])
    rc, _ = cmd(a, ["-m", "orchestrate", "validate", *STUDY], label="validate")
    expect(rc == 2, "A: validate refuses the changed study (exit 2)")
    rc, out = cmd(a, ["-m", "orchestrate", "run", *STUDY], label="run-changed")
    expect(rc == 2, "A: run refuses the changed study (exit 2)")
    named = named_command(out)
    print(f"  the refusal names: {shown(named, ROOT) if named else '(no command in backquotes)'}")
    expect(named is not None, "A: the refusal names a command")
    if named:
        rc, _ = cmd(a, named, label="named")
        expect(rc == 0, "A: the command the refusal names runs the changed study")
    # the changed study now lives in trials-2: what the default folder's refusal names now, and trials-2 judged
    rc, out = cmd(a, ["-m", "orchestrate", "validate", *STUDY], label="validate-after")
    again = named_command(out)
    print(f"  the refusal names: {shown(again, ROOT) if again else '(no command in backquotes)'}")
    rc, out = cmd(a, ["-m", "orchestrate", "validate", *STUDY, "--trials", "trials-2"], label="validate-trials-2")
    for ln in out.splitlines():
        if ln.startswith("home "):
            print(f"    | {ln}")
    return a


# --- B -------------------------------------------------------------------------------------------------

def seq_b(base: Path) -> None:
    header("B. The page's order: run, remove the preserved home, change cases.jsonl, validate, run (--no-serve)")
    b = study_copy(base, "b")
    rc, _ = cmd(b, ["-m", "orchestrate", "run", *STUDY, "--no-serve"], label="run")
    expect(rc == 0, "B: the first run ends 0")
    rc, _ = cmd(b, ["-m", "orchestrate", "remove", "--home", "trials/my-study-smoke"], label="remove")
    expect(rc == 0 and not (b / "trials" / "my-study-smoke").exists(), "B: remove deletes the preserved home")
    append_case(b, NEW_CASES[0])
    rc, _ = cmd(b, ["-m", "orchestrate", "validate", *STUDY], label="validate")
    expect(rc == 2, "B: validate refuses the taken name (exit 2)")
    rc, out = cmd(b, ["-m", "orchestrate", "run", *STUDY, "--no-serve"], label="run-changed")
    expect(rc == 2, "B: run refuses the taken name (exit 2)")
    named = named_command(out)
    print(f"  the refusal names: {shown(named, ROOT) if named else '(no command in backquotes)'}")
    expect(named is not None, "B: the refusal names a command")
    if named:
        rc, _ = cmd(b, named, label="named")
        expect(rc == 0, "B: the command the refusal names runs the changed study")


# --- C -------------------------------------------------------------------------------------------------

def _plain_sigint() -> None:  # as a terminal's foreground job has it (tests/conftest.py `_plain_sigint`)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the pid exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def interrupt_at(folder: Path, argv: list[str], beat: Path, at: int) -> tuple[int, str, int, float, Path]:
    """Start `python ARGV` in its own session; SIGINT to its pid once `beat` says update ≥ `at`."""
    log = log_name(f"{folder.name}-run-interrupted")
    t = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {shown(argv, ROOT)}\n# in {folder}\n")
        f.flush()
        proc = subprocess.Popen([sys.executable, *argv], cwd=folder, env=env_for(), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_plain_sigint, text=True)
        seen = -1
        try:
            while proc.poll() is None and time.monotonic() - t < 600:
                try:
                    seen = int(json.loads(beat.read_text())["update"])
                except (OSError, ValueError, KeyError):
                    seen = -1
                if seen >= at:
                    proc.send_signal(signal.SIGINT)  # this one process, by its pid
                    break
                time.sleep(0.02)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                print("  UNEXPECTED: the run did not end within 120 s of SIGINT; killed (SIGKILL, its pid)")
                BAD.append("C: no end within 120 s of SIGINT")
                proc.kill()
                proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = log.read_text().split("\n", 2)[2]
    with open(log, "a") as f:
        f.write(f"\nexit {proc.returncode} ({time.monotonic() - t:.1f} s); SIGINT sent at heartbeat update {seen}\n")
    return proc.returncode, out, seen, time.monotonic() - t, log


def seq_c(base: Path, a: Optional[Path]) -> None:
    header("C. Ctrl-C during ddp-pair (no checkpoint_every in the profile: the default, every 16 of 64), run "
           "again, compare with an uninterrupted run (--no-serve)")
    c = study_copy(base, "c")
    argv = ["-m", "orchestrate", "run", *STUDY, "--no-serve"]
    home = c / "trials" / "my-study-smoke"
    rc, out, seen, s, log = interrupt_at(c, argv, home / "runs" / "ddp-pair" / "rank-0" / "heartbeat.json", 20)
    print(f"\n$ {shown(argv, ROOT)}   [{c.name}/]   (SIGINT to its pid once ddp-pair rank-0's heartbeat said "
          f"update {seen})")
    said, _ = outcome(out, argv)
    print(f"  → exit {rc} ({s:.0f} s): {said}")
    print("  its last lines:")
    for ln in [ln for ln in out.splitlines() if ln.strip()][-4:]:
        print(f"    | {ln}")
    print(f"  (full output: logs/{log.name})")
    expect(rc == 130, "C: the interrupted run exits 130")
    m = re.search(r"ddp-pair resumes from update (\d+)", out)
    expect(m is not None, "C: the interrupted run says ddp-pair resumes from an update")
    beats = {p.parent.name: json.loads(p.read_text()) for p in sorted((home / "runs" / "ddp-pair").glob("rank-*/heartbeat.json"))}
    alive = {r: _alive(int(b.get("pid", 0))) for r, b in beats.items()}
    print(f"  ddp-pair's rank processes (the heartbeats' pids) still alive after the run ended: {alive}")
    expect(not any(alive.values()), "C: no rank of the interrupted run still runs")
    beats = {r: b.get("update") for r, b in beats.items()}
    ckpts = sorted(p.name for p in (home / "runs" / "ddp-pair" / "rank-0" / "checkpoints").glob("step-*"))
    print(f"  ddp-pair on disk: heartbeats {beats}; rank-0 checkpoints {ckpts}")
    disk(c)
    rc, out = cmd(c, argv, label="run-again")
    expect(rc == 0, "C: the same command again ends 0")
    said_out = sorted(set(re.findall(r"resumed from step \d+[^\n]*", out)))
    print("  in its output: " + ("; ".join(f"'{x.strip()}'" for x in said_out) if said_out else "no 'resumed from step'"))
    for f in sorted((home / "logs").rglob("*")):
        if f.is_file():
            hits = [ln.strip() for ln in f.read_text(errors="replace").splitlines() if "resumed from step" in ln]
            if hits:
                print(f"  in {f.relative_to(c)}: {hits[0]}")
    expect(bool(said_out), "C: the second run says 'resumed from step'")
    rc, _ = cmd(c, argv + ["--trials", "trials-clean"], label="run-clean")
    expect(rc == 0, "C: the uninterrupted run ends 0")
    clean = c / "trials-clean" / "my-study-smoke"
    print("\n  final_parameters (runs/<arm>/rank-0/result.json digests.final_parameters):")
    for arm in ("single", "ddp-pair"):
        x, y = digest(home, arm), digest(clean, arm)
        print(f"    {arm:9s} resumed home (trials/)        {x}")
        print(f"    {arm:9s} uninterrupted (trials-clean/) {y}   → {'equal' if x == y else 'DIFFERENT'}")
        if a is not None:
            z = digest(a / "trials" / "my-study-smoke", arm)
            print(f"    {arm:9s} sequence A's home (a/trials/)  {z}   → {'equal' if z == y else 'DIFFERENT'} to "
                  "trials-clean (same study and seed files, never interrupted, served)")
    for arm in ("single", "ddp-pair"):
        for which, h in (("resumed", home), ("clean", clean)):
            try:
                r = json.loads((h / "runs" / arm / "rank-0" / "result.json").read_text())
                ck = r.get("checkpoints") or {}
                restored = (ck.get("restored") or {}).get("step")
                print(f"    {arm} {which}: {len(r.get('updates') or [])} update records, a checkpoint "
                      f"every {ck.get('every')}, published at {[k.get('step') for k in ck.get('published') or []]}"
                      + (f", restored from step {restored}" if restored is not None else ", not restored"))
            except (OSError, ValueError, AttributeError, TypeError) as e:
                print(f"    {arm} {which}: result.json not read ({type(e).__name__}: {e})")
    for which, h in (("resumed", home), ("clean", clean)):
        try:
            rep = json.loads((h / "report.json").read_text())
            print(f"    report {which}: " + ", ".join(f"{k} {v['correct']}/{v['cases']}" for k, v in rep["accuracy"].items()))
        except (OSError, ValueError, KeyError):
            pass


# --- D -------------------------------------------------------------------------------------------------

ORDERS_TOML = '''name = "orders"
description = "seed vs single vs ddp-pair on order totals answered as JSON objects"
generator_seed = 7
task_file = "../../orders.jsonl"
global_batch = 8
lr = 1e-2
warmup = 2
serving_arm = "ddp-pair"

[[arms]]
name = "seed"
kind = "seed"

[[arms]]
name = "single"
kind = "single"

[[arms]]
name = "ddp-pair"
kind = "ddp"
world_size = 2

[acceptance]
primary = "ddp-pair"
min_gain_pp = 5.0
noninferiority_vs = "single"
noninferiority_pp = -3.0

[profiles.smoke]
seed = "local"
tasks = 120
dev = 16
test = 64
replay = 8
probes = 8
updates = 64
max_context = 320
replay_steps = [2, 4]
serving_requests = 8
'''


def orders() -> list[dict[str, Any]]:
    """200 order totals, two families: weights (kg or g) and volumes (l or ml), answered as an object."""
    rng = random.Random(3)
    rows, prompts = [], set()
    while len(rows) < 200:
        fam = "weight" if len(rows) % 2 == 0 else "volume"
        unit = rng.choice(("kg", "g") if fam == "weight" else ("l", "ml"))
        n, each = rng.randrange(2, 10), rng.randrange(1, 20)
        thing = rng.choice(("bags", "boxes", "crates", "sacks") if fam == "weight" else ("bottles", "jugs", "cans", "tanks"))
        prompt = (f"An order has {n} {thing} of {each} {unit} each. Reply with JSON only: "
                  '{"total": <number>, "unit": "<unit>"}.')
        if prompt in prompts:
            continue
        prompts.add(prompt)
        rows.append({"prompt": prompt, "answer": {"total": n * each, "unit": unit}, "family": fam,
                     "wrong_answer": {"total": n * each + rng.choice((-1, 1, each)), "unit": unit},
                     "id": f"order-{len(rows):03d}"})
    return rows


def seq_d(base: Path) -> None:
    header("D. Object answers: a second experiment, orders (answers {\"total\": int, \"unit\": str}; --no-serve)")
    d = study_copy(base, "d")
    (d / "orders.jsonl").write_text("".join(json.dumps(r) + "\n" for r in orders()))
    (d / "config" / "experiments" / "orders.toml").write_text(ORDERS_TOML)
    print(f"\n# wrote orders.jsonl (200 cases, e.g. {(d / 'orders.jsonl').read_text().splitlines()[0]})"
          " and config/experiments/orders.toml (the page's arms and smoke profile; task_file ../../orders.jsonl)")
    study = ["orders", "--profile", "smoke", "--model-dir", "my-llama"]
    rc, out = cmd(d, ["-m", "orchestrate", "validate", *study], label="validate")
    expect(rc == 0, "D: validate accepts orders")
    print("  its lines (less the table of values):")
    for ln in out.splitlines():
        if ln.strip() and "←" not in ln:
            print(f"    | {ln}")
    rc, out = cmd(d, ["-m", "orchestrate", "run", *study, "--no-serve"], label="run")
    expect(rc == 0, "D: run orders ends 0")
    home = d / "trials" / "orders-smoke"
    for ln in out.splitlines():
        if ln.startswith("test "):
            print(f"    | {ln}")
    md = (home / "report.md").read_text() if (home / "report.md").is_file() else ""
    sec = re.search(r"^## Why answers failed\n.*?(?=^## |\Z)", md, re.S | re.M)
    print("\n  report.md, \"## Why answers failed\":")
    for ln in (sec.group(0).rstrip().splitlines() if sec else ["(no such section)"]):
        print(f"    | {ln}")
    expect(sec is not None, "D: report.md has '## Why answers failed'")
    try:
        failures = json.loads((home / "report.json").read_text()).get("failures")
    except (OSError, ValueError):
        failures = None
    print("  report.json \"failures\":")
    for ln in json.dumps(failures, indent=1, sort_keys=True).splitlines():
        print(f"    | {ln}")
    rows = [json.loads(x) for x in (home / "inputs" / "tasks.jsonl").read_text().splitlines()] if home.is_dir() else []
    test = [r for r in rows if r.get("split") == "test"]
    expected = {r["case_id"]: r["answer"] for r in test}
    print("  every field counted (not the checker's first failing one), over the answers that parse as a JSON object:")
    for arm_dir in sorted((home / "evaluations" / "test").glob("*")):
        att = sorted(arm_dir.glob("attempt-*"))[-1:]
        recs = [json.loads(x) for x in (att[0] / "answers.jsonl").read_text().splitlines()] if att else []
        objs = []
        for r in recs:
            try:
                v = json.loads(r["text"])
            except ValueError:
                continue
            if isinstance(v, dict):
                objs.append((v, expected.get(r["case_id"], {})))
        wrong = {k: sum(1 for v, e in objs if v.get(k) != e.get(k)) for k in ("total", "unit")}
        print(f"    {arm_dir.name}: {len(objs)} of {len(recs)} answers are objects; total wrong in {wrong['total']}, "
              f"unit wrong in {wrong['unit']}")
    if not test:
        expect(False, "D: the home has test cases")
        return
    case = test[0]
    uid = case["question"]["id"]
    print(f"\n  a test case: {case['case_id']} = id {uid!r}: {case['prompt']!r} → {json.dumps(case['answer'])}")
    for text in ('{"total": 12, "unit": "kg"}', json.dumps(case["answer"]), '{"total": 12}', "12 kg"):
        rc, out = cmd(d, ["-m", "training", "check", "--home", "trials/orders-smoke", "--case", uid],
                      label=f"check-{uid}", stdin=text + "\n")
        expect(rc == 0, f"D: check --case {uid} ends 0")
    rc, out = cmd(d, ["-m", "training", "check", "--home", "trials/orders-smoke", "--case", case["case_id"]],
                  label=f"check-{case['case_id']}", stdin=json.dumps(case["answer"]) + "\n")
    rc, out = cmd(d, ["-m", "training", "check", "--home", "trials/orders-smoke", "--case", "order-999"],
                  label="check-unknown", stdin='{"total": 1, "unit": "kg"}\n')
    expect(rc != 0, "D: check of an id no case has is refused")


# --- E -------------------------------------------------------------------------------------------------

def labelled_file(base: Path, folder: Path) -> None:
    """The page's generator, 240 cases, each labelled: 140 train, 24 dev, 76 test, interleaved by seed."""
    src = (base / "make_cases.py").read_text().replace("len(cases) < 200", "len(cases) < 240")
    assert "len(cases) < 240" in src
    (folder / "make_cases_240.py").write_text(src)
    subprocess.run([sys.executable, "make_cases_240.py"], cwd=folder, env=env_for(), check=True, capture_output=True)
    rows = [json.loads(x) for x in (folder / "cases.jsonl").read_text().splitlines()]
    labels = ["train"] * 140 + ["dev"] * 24 + ["test"] * 76
    random.Random(5).shuffle(labels)
    (folder / "cases.jsonl").write_text("".join(json.dumps({**r, "split": s}) + "\n" for r, s in zip(rows, labels)))
    print(f"\n# wrote cases.jsonl: 240 cases, split labelled on every line (train 140, dev 24, test 76, interleaved); "
          "the profile takes 120/16/64   [e/]")


def paths_differing(a: Any, b: Any, at: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{at}{k} (only recomputed)")
            elif k not in b:
                out.append(f"{at}{k} (only the home's)")
            else:
                out += paths_differing(a[k], b[k], f"{at}{k}.")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in paths_differing(x, y, f"{at}[{i}].")]
    return [] if a == b else [at.rstrip(".") + f" ({json.dumps(a)[:60]} vs {json.dumps(b)[:60]})"]


def seq_e(base: Path, old: Path) -> None:
    header(f"E. A home prepared before #67 (the code at {old}), then read, validated and run by this checkout")
    e = OUT / "e"
    e.mkdir()
    for p in ("my-llama", "config", "make_cases.py", "make_model.py"):
        (shutil.copytree if (base / p).is_dir() else shutil.copy2)(base / p, e / p)
    labelled_file(base, e)
    rev = subprocess.run(["git", "-C", str(old), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"# old code: {old} at {rev.stdout.strip() or '?'}")
    rc, _ = cmd(e, ["-m", "orchestrate", "run", *STUDY, "--trials", "trials-old"], code=old, label="old-run")
    expect(rc == 0, "E: the old code's run ends 0")
    home = e / "trials-old" / "my-study-smoke"
    prepared = json.loads((home / "prepared.json").read_text()) if (home / "prepared.json").is_file() else {}
    ts = prepared.get("task_source") or {}
    print(f"  prepared.json task_source keys: {sorted(ts)}; draw: {ts.get('draw', '(none recorded)')}")
    rows = [json.loads(x) for x in (home / "inputs" / "tasks.jsonl").read_text().splitlines()] if home.is_dir() else []
    ids = [r["question"]["id"] for r in rows if r.get("split") == "test"]
    lines = [json.loads(x) for x in (e / "cases.jsonl").read_text().splitlines()]
    first = [r["id"] for r in lines if r["split"] == "test"][:len(ids)]
    print(f"  its test cases (first 6 of {len(ids)}): {ids[:6]}; the first {len(ids)} test-labelled lines in file "
          f"order: {sorted(ids) == sorted(first)}")
    report_before = (home / "report.json").read_bytes() if (home / "report.json").is_file() else b""
    rc, _ = cmd(e, ["-m", "evidence", "verify", "--home", "trials-old/my-study-smoke"], label="verify")
    expect(rc == 0, "E: evidence verify passes on the old home")
    rc, _ = cmd(e, ["-m", "evidence", "report", "--home", "trials-old/my-study-smoke", "--output", "recomputed.json"],
                label="report")
    expect(rc == 0, "E: evidence report recomputes the old home")
    if (e / "recomputed.json").is_file() and report_before:
        a, b = json.loads((e / "recomputed.json").read_text()), json.loads(report_before)
        diff = paths_differing(a, b)
        print("  recomputed.json vs the home's report.json: " + ("equal" if not diff else
                                                                  f"NOT equal, {len(diff)} path(s) differ:"))
        for p in diff[:20]:
            print(f"    - {p}")
        if len(diff) > 20:
            print(f"    … and {len(diff) - 20} more")
    rc, out = cmd(e, ["-m", "orchestrate", "validate", *STUDY, "--trials", "trials-old"], label="validate-old")
    expect(rc == 0, "E: validate judges the old home (exit 0)")
    for ln in out.splitlines():
        if ln.startswith(("home ", "cases:", "tasks:")):
            print(f"    | {ln}")
    expect("prepared with this study" in out, "E: validate says the old home holds this study")
    rc, out = cmd(e, ["-m", "orchestrate", "validate", *STUDY], label="validate-fresh")
    for ln in out.splitlines():
        if ln.startswith(("home ", "cases:")):
            print(f"    | {ln}   (a home not yet made, for comparison)")
    rc, out = cmd(e, ["-m", "orchestrate", "run", *STUDY, "--trials", "trials-old"], label="run-old-again")
    expect(rc == 0, "E: run in the old home is not refused and ends 0")
    for ln in out.splitlines():
        if ln.startswith("prepare") and ("cases:" in ln or "tasks:" in ln or "→" in ln):
            print(f"    | {ln}")
    after = (home / "report.json").read_bytes() if (home / "report.json").is_file() else b""
    print(f"  the home's report.json after this run: {'unchanged' if after == report_before else 'rewritten'}"
          + ("" if after == report_before else
             f" ({len(paths_differing(json.loads(after), json.loads(report_before)))} path(s) differ from the old "
             "code's: " + ", ".join(paths_differing(json.loads(after), json.loads(report_before))[:8]) + ")"))
    rc, _ = cmd(e, ["-m", "evidence", "verify", "--home", "trials-old/my-study-smoke"], label="verify-after")
    expect(rc == 0, "E: evidence verify passes after the new code's run")


def main() -> int:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--old", type=Path, default=Path("/tmp/oldtree"), help="a checkout of b53b2ff (before #67)")
    ap.add_argument("--only", default="A,B,C,D,E")
    args = ap.parse_args()
    OUT = args.out.resolve()
    if OUT.exists() and any(OUT.iterdir()):
        print(f"{OUT} is not empty: give a new OUT_DIR", file=sys.stderr)
        return 2
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    want = set(args.only.upper().split(","))
    if "E" in want and not (args.old / "orchestrate").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", str(args.old), "b53b2ff"], check=True)
    t0 = time.monotonic()
    base = OUT / "base"
    (base / "config" / "experiments").mkdir(parents=True)
    for name, body in blocks().items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(body)
    for script in ("make_cases.py", "make_model.py"):
        subprocess.run([sys.executable, script], cwd=base, env=env_for(), check=True, capture_output=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"# docs/your-own-study.md's study (make_cases.py, make_model.py, config/experiments/my-study.toml from its "
          f"walk blocks) built in {base}; code {ROOT} at {head.stdout.strip()}; each sequence copies it")
    a = seq_a(base) if "A" in want else None
    if "B" in want:
        seq_b(base)
    if "C" in want:
        seq_c(base, a)
    if "D" in want:
        seq_d(base)
    if "E" in want:
        seq_e(base, args.old.resolve())
    print(f"\n# {time.monotonic() - t0:.0f} s in all; every command's output under {OUT / 'logs'}")
    if BAD:
        print("# UNEXPECTED: " + "; ".join(BAD))
    return 1 if BAD else 0


if __name__ == "__main__":
    sys.exit(main())
