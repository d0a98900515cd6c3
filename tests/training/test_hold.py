"""training/hold.py: one holder at a time, and no lock file left beside a target that is not there (#55)."""

from __future__ import annotations

import threading

import pytest

from training.hold import HeldError, hold, lock_path


def test_a_hold_on_a_target_that_is_not_there_leaves_no_lock(tmp_path):
    home = tmp_path / "trials" / "my-study-smoke"
    with hold(home, "trial home"):
        assert lock_path(home).is_file()
    assert not lock_path(home).exists()  # a refused run: nothing left
    home.mkdir()
    with hold(home, "trial home"):
        pass
    assert lock_path(home).is_file()  # a target that is there keeps its lock file (flocks need one)
    with hold(home, "trial home"):
        home.rmdir()  # removed while held (`orchestrate remove`)
    assert not lock_path(home).exists()


def test_a_waiter_on_an_unlinked_lock_file_takes_the_lock_anew(tmp_path):
    """A holds the lock of a target that is not there; B opens the same lock file and waits on it. A
    ends: it unlinks the file while holding it, and B gets that file's flock — on a file the path no
    longer names. Without checking the inode, B would hold it while C, arriving now, creates a new file
    at the path and holds that too: two holders. B must notice, retry on the path's file, and be the
    only holder: C is refused, naming the holder."""
    target = tmp_path / "home"
    b_waits, b_holds, c_tried = threading.Event(), threading.Event(), threading.Event()
    b_says: list[str] = []
    b_saw: list[bool] = []

    def b() -> None:
        def say(m: str) -> None:
            b_says.append(m)
            b_waits.set()  # B has A's file open and blocks on it next

        with hold(target, "home B wants", wait=True, say=say):
            b_saw.append(lock_path(target).is_file())  # B holds the file the path names
            b_holds.set()
            c_tried.wait(30)

    t = threading.Thread(target=b)
    with hold(target, "home A holds"):
        t.start()
        assert b_waits.wait(30)
    # A has ended and unlinked the file B waited on
    assert b_holds.wait(30), "B never held the lock"
    try:
        with pytest.raises(HeldError, match="home C wants is held by pid"):
            with hold(target, "home C wants"):
                pass  # C holding it while B does: two holders
    finally:
        c_tried.set()
        t.join(30)
    assert b_saw == [True] and len(b_says) == 1 and "waiting: home B wants is held by pid" in b_says[0]
    assert not lock_path(target).exists()  # B, ending with no target, left nothing either
