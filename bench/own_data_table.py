"""A researcher's own inputs, good and bad, through `validate` and `run` as a user types them: does
`validate` refuse what `run` would, with the same first line, and what does each leave under trials/?

    python bench/own_data_table.py OUT_DIR [ROW ...]

Builds docs/your-own-study.md's study (its 200 cases, its small random Llama, its experiment) in a
fresh folder under OUT_DIR, then for each row writes that row's task file (and experiment), and runs

    orchestrate validate NAME --profile smoke --model-dir my-llama
    orchestrate run NAME --profile smoke --model-dir my-llama --trials trials-ROW

each with its own --trials folder. Prints a Markdown table (row, validate exit and first line, run exit
and first line of its outcome, what trials-ROW holds after) and writes every command's whole output
under OUT_DIR/logs/. A "Traceback" anywhere, or validate and run disagreeing (one exits 0, the other
not), is marked in the table and makes the script exit 1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your-own-study.md"
BIG = "word " * 1_000_000  # 5 MB of prompt, ~1M tokens


def _blocks() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8")
    return {name: body for name, body in re.findall(r"<!-- walk: file (\S+) -->\n```\w*\n(.*?)```", text, re.S)}


def cases() -> list[dict]:
    return [json.loads(line) for line in (STUDY / "cases.jsonl").read_text().splitlines()]


def labelled(rows: list[dict], splits: tuple[int, int, int] = (120, 16, 64)) -> list[dict]:
    tr, dv, _ = splits
    return [{**r, "split": "train" if i < tr else "dev" if i < tr + dv else "test"} for i, r in enumerate(rows)]


def jsonl(rows: list) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def long_in(splits: tuple[str, ...]) -> bytes:
    rows = labelled(cases())
    at = {"train": 5, "dev": 125, "test": 150}
    for s in splits:
        rows[at[s]]["prompt"] = f"{s} {BIG}"
    return jsonl(rows)


def repeated(n: int) -> bytes:
    rows = cases()
    for i in range(1, n + 1):
        rows[i * 2]["prompt"] = rows[0]["prompt"]  # the same prompt again, with another answer
    return jsonl(rows)


def trailing_comma() -> bytes:
    lines = jsonl(cases()).decode().splitlines()
    lines[41] += ","
    return ("\n".join(lines) + "\n").encode()


def missing_answer() -> bytes:
    rows = cases()
    del rows[17]["answer"]
    return jsonl(rows)


def number_among_text() -> bytes:
    rows = cases()
    for r in rows:
        r.pop("family")  # one family: parity answers are text, sums numbers
    rows = [r for r in rows if isinstance(r["answer"], str)] + [r for r in rows if not isinstance(r["answer"], str)][:1]
    rows += [{"prompt": f"Is {i} even or odd? Reply with one word. ({i})", "answer": "even" if i % 2 == 0 else "odd",
              "wrong_answer": "odd" if i % 2 == 0 else "even"} for i in range(1000, 1000 + 99)]
    return jsonl(rows)


def no_dev() -> bytes:
    rows = cases()
    return jsonl([{**r, "split": "train" if i < 136 else "test"} for i, r in enumerate(rows)])


def no_wrong_answers() -> bytes:
    return jsonl([{k: v for k, v in r.items() if k != "wrong_answer"} for r in cases()])


DAMAGED_ARM = '\n[[arms]]\nname = "damaged"\nkind = "single"\ndata = "damaged"\n'
# row: (what it is, the task file's bytes, a change to the experiment's TOML, the name validate and run get)
ROWS: dict[str, tuple[str, Callable[[], bytes], Callable[[str], str], str]] = {
    "valid": ("the page's 200 cases", lambda: (STUDY / "cases.jsonl").read_bytes(), lambda t: t, "NAME"),
    "long-test": ("a 5 MB prompt in the test split", lambda: long_in(("test",)), lambda t: t, "NAME"),
    "long-each": ("a 5 MB prompt in each split", lambda: long_in(("train", "dev", "test")), lambda t: t, "NAME"),
    "damaged-no-wrong": ("a damaged-target arm, no wrong answers", no_wrong_answers,
                         lambda t: t.replace("\n[acceptance]", DAMAGED_ARM + "\n[acceptance]"), "NAME"),
    "no-dev": ("a train/test-only file, profile dev 16", no_dev, lambda t: t, "NAME"),
    "no-dev-0": ("the same file, profile dev = 0", no_dev, lambda t: t.replace("dev = 16", "dev = 0"), "NAME"),
    "repeated-39": ("39 repeated prompts", lambda: repeated(39), lambda t: t, "NAME"),
    "trailing-comma": ("a trailing comma on line 42", trailing_comma, lambda t: t, "NAME"),
    "missing-answer": ("a missing answer (line 18)", missing_answer, lambda t: t, "NAME"),
    "empty": ("an empty file", lambda: b"", lambda t: t, "NAME"),
    "bom": ("a byte-order mark", lambda: b"\xef\xbb\xbf" + (STUDY / "cases.jsonl").read_bytes(), lambda t: t, "NAME"),
    "number-among-text": ("a number answer among text answers", number_among_text, lambda t: t, "NAME"),
    "duplicate": ("one duplicate prompt", lambda: repeated(1), lambda t: t, "NAME"),
    "arm-not-primary": ("EXPERIMENT/ARM, ARM not the primary", lambda: (STUDY / "cases.jsonl").read_bytes(),
                        lambda t: t, "NAME/single"),
    "broken-toml": ("a key misspelt in the TOML", lambda: (STUDY / "cases.jsonl").read_bytes(),
                    lambda t: t.replace("max_context = 320", "max_contxt = 320"), "NAME"),
}
STUDY = Path()


def cli(args: list[str], log: Path) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400", "NO_COLOR": "1"}
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "orchestrate", *args], cwd=STUDY, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    log.write_text(f"$ orchestrate {' '.join(args)}\n{r.stdout}\nexit {r.returncode}\n")
    return r.returncode, r.stdout, time.monotonic() - t


def first(out: str, *, run: bool) -> str:
    """validate: its first line. run: the line of its outcome (an error, a note or warning, or the summary)."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    at = 0
    if run:
        at = next((i for i, ln in enumerate(lines)
                   if re.match(r"(error|refused|Usage|warning|note):|.*: prepared, trained|interrupted", ln)), 0)
    if not lines:
        return ""
    said = lines[at] + (" " + lines[at + 1] if lines[at].endswith(":") and at + 1 < len(lines) else "")
    warned = next((ln for ln in lines if ln.startswith("warning:")), None)
    return said + (f" — then {warned}" if warned and warned != said else "")


def left(trials: Path) -> str:
    if not trials.exists():
        return "nothing (no folder)"
    items = sorted(p.name for p in trials.iterdir())
    if not items:
        return "an empty folder"
    return ", ".join(f"{p}/ ({sum(1 for f in (trials / p).rglob('*') if f.is_file())} files)" if (trials / p).is_dir()
                     else p for p in items)


def short(text: str, n: int = 230) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= n else text[:n - 1] + "…"


def main() -> int:
    global STUDY
    out = Path(sys.argv[1]).resolve()
    wanted = sys.argv[2:] or list(ROWS)
    STUDY = out / "study"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    if not (STUDY / "my-llama").is_dir():  # the page's own files, made as its walk makes them
        (STUDY / "config" / "experiments").mkdir(parents=True, exist_ok=True)
        for name, body in _blocks().items():
            (STUDY / name).parent.mkdir(parents=True, exist_ok=True)
            (STUDY / name).write_text(body)
        for script in ("make_cases.py", "make_model.py"):
            subprocess.run([sys.executable, script], cwd=STUDY, check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    template = (STUDY / "config" / "experiments" / "my-study.toml").read_text()
    (STUDY / "config" / "experiments" / "my-study.toml").unlink()
    print("| input | validate: exit, first line | run: exit, its outcome's first line | left under trials/ |")
    print("|---|---|---|---|")
    bad = 0
    for key in wanted:
        what, data, toml, spec = ROWS[key]
        name = f"own-{key}"
        (STUDY / f"{name}.jsonl").write_bytes(data())
        text = toml(template).replace('name = "my-study"', f'name = "{name}"').replace(
            'task_file = "../../cases.jsonl"', f'task_file = "../../{name}.jsonl"')
        for p in (STUDY / "config" / "experiments").glob("*.toml"):
            p.unlink()  # one experiment at a time: arm names are not shared between rows
        (STUDY / "config" / "experiments" / f"{name}.toml").write_text(text)
        target = spec.replace("NAME", name)
        v, vout, vs = cli(["validate", target, "--profile", "smoke", "--model-dir", "my-llama"], out / "logs" / f"{key}-validate.txt")
        trials = STUDY / f"trials-{key}"
        r, rout, rs = cli(["run", target, "--profile", "smoke", "--model-dir", "my-llama", "--trials", str(trials.name)],
                          out / "logs" / f"{key}-run.txt")
        marks = []
        if "Traceback" in vout + rout:
            marks.append("TRACEBACK")
        if (v == 0) != (r == 0):
            marks.append("DISAGREE")
        bad += bool(marks)
        print(f"| {what} | {v}: {short(first(vout, run=False))} ({vs:.0f} s) | {r}: {short(first(rout, run=True))} "
              f"({rs:.0f} s) | {left(trials)}{' **' + ', '.join(marks) + '**' if marks else ''} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
