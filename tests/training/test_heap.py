"""training/heap.py: what a block loads is frozen out of the collector's sight (`long_lived`), or only the collector
paused while it runs (`paused`); either way the collector is left as it was found — including when the block
raises."""

from __future__ import annotations

import gc
import weakref

import pytest

from training.heap import long_lived, paused


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector could free it


@pytest.fixture
def collector():
    """The collector switched back as the test found it. A test's `gc.freeze()` freezes everything in the
    worker's generations then, not only its own objects — cycles not yet collected included, which then stay
    allocated for the worker's life. Both ways out cost more: thawing afterwards (`gc.unfreeze()`) would also
    thaw what the worker froze before (the suite's collected modules, conftest.py, and every `long_lived`
    block's libraries), and every later full collection in the worker would traverse them again; collecting
    first took 3.9 s in the suite and made test_heap.py's tests 13.2 s instead of 2.3
    (bench/results/2026-12-05-cpu-cuts-2cpu/)."""
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_what_the_block_loads_is_frozen_and_the_collector_left_as_found(collector, enabled):
    (gc.enable if enabled else gc.disable)()
    before = gc.get_freeze_count()
    with long_lived():
        assert not gc.isenabled()  # paused while the block loads
        kept = [Node() for _ in range(1000)]
    assert gc.isenabled() is enabled
    assert gc.get_freeze_count() >= before + 1000
    ours = {id(n) for n in kept}
    for generation in range(3):  # in none of the generations a collection visits
        assert not ours & {id(o) for o in gc.get_objects(generation)}


def test_a_block_that_raises_still_freezes_and_resumes(collector):
    gc.enable()
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError):
        with long_lived():
            kept = [Node() for _ in range(100)]  # noqa: F841
            raise RuntimeError("import failed")
    assert gc.isenabled() and gc.get_freeze_count() >= before + 100


@pytest.mark.parametrize("enabled", [True, False])
def test_a_paused_block_freezes_nothing_and_its_cycles_are_reclaimed_after(collector, enabled):
    """A seed's conversion runs `paused`: what it allocated and dropped is not kept out of the collector's
    sight afterwards — a cycle made in the block goes at the next collection — and a block that raises
    leaves the collector as it found it too."""
    (gc.enable if enabled else gc.disable)()
    before = gc.get_freeze_count()
    with paused():
        assert not gc.isenabled()
        gone = weakref.ref(Node())  # only the cycle holds it
        churn = [[] for _ in range(20 * gc.get_threshold()[0])]  # allocations that would start collections
        assert gone() is not None  # none ran
        del churn
    assert gc.isenabled() is enabled
    assert gc.get_freeze_count() <= before  # nothing frozen (frozen objects other threads drop still go)
    gc.collect(0)  # the youngest generation, where the block left it: a frozen cycle would stay
    assert gone() is None
    with pytest.raises(RuntimeError):
        with paused():
            raise RuntimeError("conversion failed")
    assert gc.isenabled() is enabled and gc.get_freeze_count() <= before
