"""docs/your-own-study.md walked once in a fresh folder, as tests/orchestrate/test_your_own_study.py walks it
(the same blocks, in order, bash with the project's `python` first on PATH), printing each shell block's
exit status and wall seconds, what the run said of its gates, and the test answers recomputed from the
evidence. For choosing the page's smoke profile (#34: its `updates`) by what a reader would see:

    python bench/doc_walk.py /tmp/walk-N        # a folder that does not exist yet
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "orchestrate"))
sys.path.insert(0, str(ROOT / "tests"))

from test_your_own_study import DOC, walk_steps  # noqa: E402  (the test's own reading of the page)


def main() -> None:
    tmp = Path(sys.argv[1])
    tmp.mkdir(parents=True)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONUNBUFFERED="1")
    env.pop("TRIAL_CONFIG_DIR", None)
    cwd, where = tmp, tmp / ".cwd"
    for kind, path, body in walk_steps(DOC.read_text(encoding="utf-8")):
        if kind == "file":
            (cwd / path).parent.mkdir(parents=True, exist_ok=True)
            (cwd / path).write_text(body, encoding="utf-8")
            continue
        t0 = time.perf_counter()
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{body}\npwd > {where}"], cwd=cwd, env=env,
                           capture_output=True, text=True)
        print(f"{time.perf_counter() - t0:6.1f} s  exit {p.returncode}  {body.strip().splitlines()[0]}")
        print("".join(f"         {line}\n" for line in (p.stdout + p.stderr).splitlines() if "gates:" in line), end="")
        if p.returncode != 0:
            raise SystemExit(p.stdout[-3000:] + p.stderr[-3000:])
        cwd = Path(where.read_text().strip())
    rep = json.loads((cwd / "recomputed.json").read_text())
    print("test answers:", {arm: f"{a['correct']}/{a['cases']}" for arm, a in rep["accuracy"].items()})


if __name__ == "__main__":
    main()
