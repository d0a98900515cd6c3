"""What the benches that compare an earlier commit's program with this tree's share: the earlier tree as a
temporary `git worktree` (removed at the end, whatever happens) and the first words of what a deployment said."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def before_tree(rev: str, prefix: str) -> Iterator[tuple[Path, Path]]:
    """(the tree at `rev`, a scratch directory beside it); both gone at the end."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    before = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(before), rev], check=True)
    try:
        yield before, tmp
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def first_words(d: Any, markers: tuple[str, ...], n: int = 150) -> str:
    """The deployment's error from the first of `markers` it holds, on one line, `n` characters; "ok" if none."""
    text = d.failed or d.errors or ""
    for marker in markers:
        if marker in text:
            text = text[text.index(marker):]
            break
    return " ".join(text.split())[:n] or "ok"


def run_against(run_cases: Any, default_rev: str) -> None:
    """A bench's entry: moto on loopback (bench/local_moto.py), then `run_cases(aws, rev)` with the revision the
    command line names, or `default_rev`."""
    import sys

    import boto3

    from local_moto import local_moto

    rev = sys.argv[1] if len(sys.argv) > 1 else default_rev
    with local_moto():
        run_cases(boto3.Session(region_name="us-east-1"), rev)
