"""The packages' import graph points one way: evidence ← training ← orchestrate, evidence ← infra,
and infra reads one torch-free corner of training: the arm kinds' registry (`training.arms`).

A host runs `training` (and `evidence`) without `orchestrate` or `infra` installed; a reader checks
evidence with `evidence` alone; the plan reads the same arm kinds the trainer runs, on a controller
that never imports torch for it. An import that reaches back up the graph would work on the
controller and fail on a host, so every import in every module is read here, including those inside
functions (the lazy ones are where such a reach usually hides). And tests/ mirrors the packages, so a
new test has one home.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("evidence", "training", "infra", "orchestrate")
ALLOWED = {  # package → ours it may import (besides itself): a package, or one module path and below
    "evidence": set(),
    "training": {"evidence"},
    # the arms' kinds, and the experiment files the stack reads its arms from (both torch-free)
    "infra": {"evidence", "training.arms", "training.config"},
    "orchestrate": {"evidence", "training", "infra"},
}


def permitted(name: str, ok: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in ok)


def reaches(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """Every import of one of our packages that its importer may not make, as 'file:line → package'."""
    bad = []
    for pkg, ok in allowed.items():
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in OURS and top != pkg and not permitted(name, ok):
                        bad.append(f"{path.relative_to(root)}:{node.lineno} → {name}")
    return bad


def test_no_package_reaches_back_up_the_import_graph():
    assert reaches(ROOT, ALLOWED) == []


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path):
    """The check can fail: a training module importing the CLI inside a function is named."""
    for pkg in OURS:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "training" / "serve.py").write_text(
        "import json\n\ndef start():\n    from orchestrate.cli import app\n    return app\n")
    (tmp_path / "evidence" / "report.py").write_text("import training.train as t\n")
    (tmp_path / "infra" / "plan.py").write_text("from training.arms import KINDS\nfrom training.trainer import Trainer\n")
    assert reaches(tmp_path, ALLOWED) == ["evidence/report.py:1 → training.train", "training/serve.py:4 → orchestrate.cli",
                                          "infra/plan.py:2 → training.trainer"]


def test_the_arm_registry_and_the_plan_import_no_torch():
    """infra reads `training.arms` on a controller: importing it (and the plan) must not pull torch."""
    import subprocess
    import sys

    code = ("import sys, infra.plan, training.arms; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_what_the_controller_reads_of_training_imports_no_torch():
    """orchestrate reads run and checkpoint paths (`training.runs`, also over SSH with `python -c`) and
    `training.train.resolved_from_prepared`; neither may pull torch onto the controller."""
    import subprocess
    import sys

    code = ("import sys, training.runs, training.train, training.checkpoint; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


PROJECT_WIDE = {"test_layout.py", "test_markers.py"}  # they test the tree itself, not one package


def misplaced_tests(tests: Path) -> list[str]:
    """Test files not under tests/<package>/ for one of our packages (the project-wide ones aside), so
    that a new test of `orchestrate` has one obvious home: tests/orchestrate/."""
    bad = [p.name for p in tests.glob("test_*.py") if p.name not in PROJECT_WIDE]
    for d in sorted(p for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if d.name not in OURS:
            bad += [f"{d.name}/{p.name}" for p in d.rglob("test_*.py")]
    return bad


def test_tests_mirror_the_packages(tmp_path):
    assert misplaced_tests(ROOT / "tests") == []
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "test_ok.py").write_text("")
    (tmp_path / "test_stray.py").write_text("")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "test_elsewhere.py").write_text("")
    assert sorted(misplaced_tests(tmp_path)) == ["helpers/test_elsewhere.py", "test_stray.py"]
