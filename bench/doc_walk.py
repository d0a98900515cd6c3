"""docs/your-own-study.md walked once in a fresh folder by the test's own walk (tests/orchestrate/
test_your_own_study.py: `walk`, `reader_env`), printing each shell block's exit status and wall seconds, what
the run said of its gates, and the test answers recomputed from the evidence. For choosing the page's smoke
profile (#34: its `updates`) by what a reader would see, and for the time the page states:

    python bench/doc_walk.py /tmp/walk-N        # a folder that does not exist yet

Importing the test module imports tests/conftest.py, which sets OMP_WAIT_POLICY=PASSIVE for the suite's
processes; a reader's shell has no such setting, so it is taken back out here unless it was set before."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "orchestrate"))
sys.path.insert(0, str(ROOT / "tests"))

_GIVEN = os.environ.get("OMP_WAIT_POLICY")
from test_your_own_study import reader_env, walk  # noqa: E402  (the test's own walk of the page)

if _GIVEN is None:
    os.environ.pop("OMP_WAIT_POLICY", None)


def main() -> None:
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True)
    print(f"OMP_WAIT_POLICY: {os.environ.get('OMP_WAIT_POLICY', 'not set')}")
    t0, cwd = time.perf_counter(), folder
    for body, p, cwd in walk(folder, reader_env()):
        print(f"{time.perf_counter() - t0:6.1f} s  exit {p.returncode}  {body.strip().splitlines()[0]}")
        print("".join(f"         {line}\n" for line in (p.stdout + p.stderr).splitlines() if "gates:" in line), end="")
        if p.returncode != 0:
            raise SystemExit(p.stdout[-3000:] + p.stderr[-3000:])
        t0 = time.perf_counter()
    rep = json.loads((cwd / "recomputed.json").read_text())
    print("test answers:", {arm: f"{a['correct']}/{a['cases']}" for arm, a in rep["accuracy"].items()})


if __name__ == "__main__":
    main()
