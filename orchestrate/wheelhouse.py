"""The hosts' wheelhouse: every dependency of the project as wheels for the hosts' Python and platform,
not the controller's.

The hosts install offline (`orchestrate/remote.py`), so the wheelhouse is all they get. The AMI's own
torch is not the pinned one (the PyTorch DLAMI ships its own release; docs/aws.md #31), so the
wheelhouse carries torch and the CUDA libraries it links (`nvidia-*`, `cuda-*`, `triton`): 29 wheels,
2.74 GB for torch 2.13.0 on CPython 3.12 x86_64 (seen with `pip download`, 2026-12-02). Wheels are
tagged for one Python and one platform: a wheel built for the controller's Python (cp311, say) does
not install on the hosts' (cp312), and pip's `--platform` matches tags exactly, so one manylinux tag
misses the many older ones the CUDA wheels carry (`manylinux_2_18`, `manylinux2014`, `manylinux1`…):
`download_args` lists every tag a host of the given glibc accepts.

`unfit` is the check: the wheels of a directory that no tag of the hosts' Python (and platform, when
known) accepts. `plan --wheelhouse` reports them against the stack's `host_python_version` and
`host_platform`; staging refuses them against the Python each host reports, before anything is
uploaded."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Iterable

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from evidence.errors import UserError

LEGACY_MANYLINUX = (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5))
"""PEP 600's aliases: manylinux2014 is manylinux_2_17, and so on."""


class WheelhouseError(UserError, ValueError):
    """A target that is not a Python version or a manylinux platform, or a download that failed."""


def python_version(v: str) -> tuple[int, int]:
    """'3.12' or '3.12.7' as (3, 12)."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", v.strip())
    if not m:
        raise WheelhouseError(f"{v!r} is not a Python version (3.12)")
    return int(m.group(1)), int(m.group(2))


def platforms(platform: str) -> list[str]:
    """Every platform tag a host of `platform` (its newest manylinux tag, `manylinux_2_39_x86_64` for
    glibc 2.39) installs, newest first: each manylinux_2_N down to N = 5, the legacy aliases within it,
    and `linux_<arch>` (a wheel built on such a host)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_([a-z0-9_]+)", platform)
    if not m or m.group(1) != "2":
        raise WheelhouseError(f"{platform!r} is not a glibc platform tag (manylinux_2_39_x86_64)")
    minor, arch = int(m.group(2)), m.group(3)
    out = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    out += [f"{name}_{arch}" for name, n in LEGACY_MANYLINUX if n <= minor]
    return out + [f"linux_{arch}"]


def host_tags(python: str, platform: str | None) -> set:
    """The tags pip on a CPython `python` host of `platform` accepts. Without a platform, every tag of
    that Python on a placeholder platform: `unfit` then compares only interpreter and ABI."""

    v = python_version(python)
    plats = platforms(platform) if platform else ["-"]
    return set(cpython_tags(v, platforms=plats)) | set(compatible_tags(v, f"cp{v[0]}{v[1]}", plats))


def unfit(names: Iterable[str], python: str, platform: str | None = None) -> list[str]:
    """The wheel file names among `names` that a CPython `python` host (of `platform`, when given) would
    not install: none of their tags is among the host's. Sorted."""

    ok = host_tags(python, platform)
    pairs = {(t.interpreter, t.abi) for t in ok}
    out = []
    for name in names:
        try:
            tags = parse_wheel_filename(Path(name).name)[3]
        except InvalidWheelFilename:
            out.append(name)
            continue
        fits = (tags & ok) if platform else {t for t in tags if (t.interpreter, t.abi) in pairs}
        if not fits:
            out.append(name)
    return sorted(out)


def describe_unfit(bad: list[str], python: str, platform: str | None) -> str:
    """One sentence naming the wheels that do not fit and how to build the wheelhouse instead."""
    v = ".".join(map(str, python_version(python)))
    target = f"CPython {v}" + (f" on {platform}" if platform else "")
    return (f"{len(bad)} wheel(s) of the wheelhouse do not install on the hosts' {target} "
            f"({', '.join(bad[:4])}{', …' if len(bad) > 4 else ''}): build it for the hosts with `orchestrate "
            f"wheelhouse --stack <stack file> DIR` (pip download --only-binary=:all: --python-version {v} "
            "--platform … for every tag they accept)")


def project_requirements(root: Path) -> list[str]:
    """The project's own dependencies (pyproject.toml), pinned there: what every host needs."""

    return list(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"])


def download_args(dest: Path, python: str, platform: str, requirements: list[str], *,
                  constraints: Path | None = None, find_links: list[Path] = (), no_index: bool = False) -> list[str]:
    """`pip download` for the hosts: binary wheels only, for their interpreter, ABI and every platform
    tag they accept."""
    major, minor = python_version(python)
    args = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest),
            "--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}"]
    for p in platforms(platform):
        args += ["--platform", p]
    if constraints is not None:
        args += ["--constraint", str(constraints)]
    for d in find_links:
        args += ["--find-links", str(d)]
    if no_index:
        args.append("--no-index")
    return args + requirements


def download(dest: Path, python: str, platform: str, requirements: list[str], **options) -> list[Path]:
    """Fill `dest` with wheels of `requirements` (and their dependencies) for the hosts, then check every
    wheel in it; refused (WheelhouseError) when pip fails or a wheel there does not fit."""
    dest.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(download_args(dest, python, platform, requirements, **options), capture_output=True, text=True)
    if p.returncode != 0:
        raise WheelhouseError(f"pip download for CPython {python} on {platform} failed: {p.stderr.strip()[-1200:]}")
    wheels = sorted(dest.glob("*.whl"))
    bad = unfit([w.name for w in wheels], python, platform)
    if bad:  # e.g. wheels left in `dest` from an earlier download for another Python
        raise WheelhouseError(f"{dest}: " + describe_unfit(bad, python, platform))
    return wheels


PACKAGES = ("training", "evidence", "orchestrate", "infra")
"""What the project's wheel holds (pyproject.toml's `packages.find`)."""


def build_wheelhouse(out: Path, extra: Path | None = None) -> Path:
    """The project's own wheel, plus every wheel in `extra` (a host without this project's
    dependencies needs them all: torch, transformers, … — `pip download` them for the hosts' Python)."""
    root = Path(__file__).resolve().parent.parent
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # built from a copy of the sources as they are now: setuptools builds in place and never clears
    # its build/lib, so a module since removed or renamed would otherwise ship to every host
    with tempfile.TemporaryDirectory(prefix="trials-wheel-") as tmp:
        src = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, src / name)
        for pkg in PACKAGES:
            shutil.copytree(root / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(src)], capture_output=True, text=True)
    if p.returncode != 0:
        raise WheelhouseError(f"building the project wheel failed: {p.stderr.strip()[-800:]}")
    if extra is not None:
        if not extra.is_dir():
            raise WheelhouseError(f"--wheelhouse {extra} is not a directory")
        others = [p.name for p in extra.iterdir() if p.is_file() and not p.name.endswith(".whl")]
        if others:
            raise WheelhouseError(f"{extra} holds files that are not wheels ({', '.join(sorted(others)[:5])}): hosts "
                               "install offline from wheels only — `pip wheel` them, or `pip download "
                               "--only-binary=:all:`")
        wheels = sorted(extra.glob("*.whl"))
        if not wheels:
            raise WheelhouseError(f"--wheelhouse {extra} holds no wheels")
        for w in wheels:
            shutil.copyfile(w, out / w.name)
    return out
