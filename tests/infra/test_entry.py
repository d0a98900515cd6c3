"""The program starts as Pulumi's engine starts it (#31): from inside infra/ (`main: infra/`), through
`runpy.run_path(".")` (tests/pulumi_engine.py), for `up`, `preview` and `destroy --run-program`. No module
of infra/ may share its name with anything importable, since the engine puts infra/ first on the path;
the harness itself is shown to fail on the program as it was at d154da8, where infra/evidence.py hid the
`evidence` package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pulumi_engine import EXEC, STACK_TYPE, pulumi_run, teardown_env
from test_infra import CALLS, answers, live, stack_of

ROOT = Path(__file__).resolve().parents[2]
BEFORE_31 = "d154da8"  # the program the issue reproduced the ImportError on
OURS = ("evidence", "infra", "orchestrate", "training")


def importable_names() -> set[str]:
    """Every top-level name the program's interpreter can import without infra/ on its path: the
    standard library, the virtualenv's distributions, and our own packages (which the project's
    editable install finds through a meta-path finder that `pkgutil` does not list)."""
    code = ("import json, pkgutil, sys; print(json.dumps(sorted({m.name for m in pkgutil.iter_modules()} | "
            "set(sys.stdlib_module_names) | set(sys.builtin_module_names))))")
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd="/", capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout)) | set(OURS)


def test_no_module_of_infra_shadows_an_importable_name():
    names = importable_names()
    assert {"evidence", "json", "pulumi", "pulumi_aws", "pydantic", "yaml", "boto3"} <= names  # the check can see a clash
    modules = sorted(p.stem for p in (ROOT / "infra").glob("*.py") if not p.stem.startswith("__"))
    assert "bucket" in modules and "evidence" not in modules
    assert [m for m in modules if m in names] == []
    assert not [p for p in (ROOT / "infra").iterdir() if p.is_dir() and p.name != "__pycache__"]  # no sub-packages to check


@pytest.mark.parametrize("operation, env", [("up", {}), ("preview", {}), ("destroy", teardown_env())])
def test_the_program_runs_as_the_engine_starts_it(operation, env):
    """The issue's reproduction — `cd infra && python -c "import runpy; runpy.run_path('.', run_name='__main__')"`
    — with the engine's arguments, config and monitor: every resource registered, for each operation."""
    d = pulumi_run(operation, stack_of(live()), answers=answers(), calls=CALLS, env=env)
    assert d.returncode == 0, d.errors + d.stderr[-3000:]
    assert d.record["sys_path"][0] == str(EXEC.parent)  # the exec's directory, as the real script's; run_path adds "."
    assert len([r for r in d.resources if r.custom]) == 51 and d.resources[0].typ == STACK_TYPE
    assert d.modules["top-level from the program directory"] == []
    assert {n: Path(d.modules[n]).resolve() for n in ("infra", "evidence", "training")} == \
        {n: ROOT / n / "__init__.py" for n in ("infra", "evidence", "training")}  # the packages, not a shadow


@pytest.fixture(scope="module")
def before_31(tmp_path_factory) -> Path:
    """The project tree at d154da8 (what the program imports: the Pulumi project and its packages)."""
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE_31}^{{commit}}"],
                      capture_output=True).returncode != 0:
        pytest.skip(f"commit {BEFORE_31} is not in this checkout's history")
    out = tmp_path_factory.mktemp("d154da8")
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE_31, "Pulumi.yaml", "infra", "evidence", "training",
                          "config"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out


def test_the_harness_fails_on_the_program_before_31(before_31):
    """The same harness, on the tree at d154da8 installed as the virtualenv would have it: the engine's
    start puts that tree's infra/ first on the path, its infra/evidence.py hides the `evidence` package,
    and the program dies on the import the issue reports, having registered nothing but the stack."""
    assert (before_31 / "infra" / "evidence.py").exists()
    d = pulumi_run("up", stack_of(live()), root=before_31, site=before_31, answers=answers(), calls=CALLS)
    assert d.returncode == 32, d.errors
    assert "ImportError: cannot import name 'TrialConfig' from partially initialized module 'infra.plan'" in d.errors
    assert f"{before_31}/infra/evidence.py" in d.errors  # the shadow, not the package
    assert [r.typ for r in d.resources] == [STACK_TYPE]


def test_the_program_imports_its_own_checkout(before_31):
    """Whatever the virtualenv has installed — here the tree at d154da8, ahead of the editable install on
    the path — the entry runs this checkout's packages (infra/__main__.py puts its own root first)."""
    d = pulumi_run("up", stack_of(live()), site=before_31, answers=answers(), calls=CALLS)
    assert d.returncode == 0, d.errors
    assert {n: Path(d.modules[n]).resolve() for n in ("infra", "evidence", "training")} == \
        {n: ROOT / n / "__init__.py" for n in ("infra", "evidence", "training")}


def test_the_exec_stand_in_is_alone_in_its_directory():
    """Its directory is the interpreter's sys.path[0]: anything importable beside it would be a harness-made shadow."""
    assert [p.name for p in EXEC.parent.iterdir() if p.name != "__pycache__"] == [EXEC.name]
    assert os.access(EXEC, os.X_OK)
