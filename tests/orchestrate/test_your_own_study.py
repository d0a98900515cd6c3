"""docs/your-own-study.md, run as a reader runs it: every block of the page, in order, in a fresh
folder — the files it shows written as shown, the shell blocks run by bash with the project's
`python` and `orchestrate` first on PATH — then what the page says it ends with, checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conftest import ROOT

DOC = ROOT / "docs" / "your-own-study.md"
STEP = re.compile(r"<!-- walk: (bash|file (\S+)) -->\n```[a-z]*\n(.*?)```", re.S)


def walk_steps(text: str) -> list[tuple[str, str | None, str]]:
    """(kind, the file's path or None, the block's text) for every marked block, in page order."""
    return [("file" if path else "bash", path or None, body) for _, path, body in STEP.findall(text)]


def reader_env() -> dict[str, str]:
    """A reader's shell after `. .venv/bin/activate`: the project's `python` and `orchestrate` first on PATH,
    no test-only config folder."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONUNBUFFERED="1")
    env.pop("TRIAL_CONFIG_DIR", None)
    return env


def walk(folder: Path, env: dict[str, str]) -> Iterator[tuple[str, subprocess.CompletedProcess, Path]]:
    """The page in `folder`, block by block: files written as shown; each shell block run by bash, yielded
    with its completed process and the folder it ended in (a block's `cd` carries over to the next, as in a
    reader's shell). The test stops at the first block that fails; bench/doc_walk.py times each."""
    cwd, where = folder, folder / ".cwd"
    for kind, path, body in walk_steps(DOC.read_text(encoding="utf-8")):
        if kind == "file":
            (cwd / path).parent.mkdir(parents=True, exist_ok=True)
            (cwd / path).write_text(body, encoding="utf-8")
            continue
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{body}\npwd > {where}"], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=900)
        if p.returncode == 0:
            cwd = Path(where.read_text().strip())
        yield body, p, cwd


def test_the_page_marks_every_block_it_shows():
    """A block without a walk marker would be shown to readers and never run here."""
    text = DOC.read_text(encoding="utf-8")
    assert len(walk_steps(text)) == text.count("```") // 2


def test_the_walk_from_an_empty_folder_to_a_preserved_report(tmp_path):
    cwd, said = tmp_path, []
    for body, p, cwd in walk(tmp_path, reader_env()):
        said.append(p.stdout + p.stderr)
        assert p.returncode == 0, f"{body}\nexit {p.returncode}:\n{p.stdout}\n{p.stderr}"
    out = "\n".join(said)
    study = tmp_path / "my-study"
    assert cwd == study
    # the task file read as prepare reads it, and committed
    assert "200 cases" in out and "train 120, dev 16, test 64; 0 not used; 200 with a wrong answer" in out
    assert "tasks: cases.jsonl" in out and "30 damaged targets from its wrong answers" in out
    assert "← default; not used: the cases come from task_file" in out  # validate: what the file leaves unread
    assert "checks: sum: number ×100; parity: text ×100" in out  # how each family's answers are checked
    assert re.search(r"lengths: every case fits max_context 320 .*; the longest \d+ tokens — tokenizer: my-qwen2", out)
    # the refusal a reader meets: both slips of the file in one pass, in the page's words, and nothing kept
    assert re.search(r"error: task file \S+/my-study/cases.jsonl: 2 problems; fix every one, then validate again:\n"
                     r"  line 201: not JSON \(Extra data, column 42\)\n  line 202: the prompt of line 1 again", out), out
    assert "refused: exit 2" in out
    # the user's directory imported as a seed, with a receipt and its parameter count
    (seed,) = [d for d in (study / ".seeds").iterdir() if d.is_dir()]
    receipt = json.loads((seed / "receipt.json").read_text())
    assert seed.name.startswith("local-") and receipt["meta"]["kind"] == "local" and receipt["parameters"] > 0
    # exact-match accuracy on the file's 64 test cases, as the run printed it, recomputed from the evidence
    rep = json.loads((study / "recomputed.json").read_text())
    assert set(rep["accuracy"]) == {"seed", "single", "ddp-pair"}
    for arm, a in rep["accuracy"].items():
        assert a["cases"] == 64 and f"test {arm}: {a['correct']}/64 exact" in out
    # preserved, then removed from this machine: the store keeps it
    assert not (study / "trials" / "my-study-smoke").exists()
    assert list((study / "trials" / "store" / "indexes" / "my-study-smoke").glob("*.json"))
    # a changed study under the name the store keeps: refused before anything is written, naming the folder that
    # works, which validates
    assert re.search(r"error: trial name my-study-smoke is taken in file://\S+/my-study/trials/store/: a trial of that "
                     r"name was preserved there .* `orchestrate run my-study --profile smoke --model-dir my-qwen2 "
                     r"--trials trials-2`", out), out
    assert "home trials-2/my-study-smoke: to be made; " in out
    # the second study, in the folder named: the changed file's cases, its own store, the first kept in its own
    second = study / "trials-2" / "my-study-smoke"
    ts = json.loads((second / "prepared.json").read_text())["task_source"]
    assert ts["cases"] == 201 and ts["unused"] == 1 and ts["draw"]["rule"] == "shuffled"
    assert "cases: test, dev, then train from one shuffle of the file's 201 by generator seed 7" in out
    assert list((study / "trials-2" / "store" / "indexes" / "my-study-smoke").glob("*.json"))
    assert len(list((study / "trials" / "store" / "indexes" / "my-study-smoke").glob("*.json"))) == 1
    # validate showed what an answer must be and one answer as it is trained; the user's id is in every answer
    assert re.search(r"  sum: number ×100 \(told from the answer\)\n", out) and re.search(r"  parity: trained as \(line 2, id \"case-1\"\): (even|odd)\n", out), out
    answers = [json.loads(line) for line in
               (second / "evaluations" / "test" / "single" / "attempt-1" / "answers.jsonl").read_text().splitlines()]
    assert all(a["id"].startswith("case-") for a in answers[:-1] if "id" in a) and sum("id" in a for a in answers) >= 63
    check = json.loads(out.split('{"case": ', 1)[1].split("\n", 1)[0].join(['{"case": ', '']))
    assert check["id"] == "case-4" and check["correct"] is False and check["reason"] == "wrong_value"
