"""Per-test CPU: the worker's own (RUSAGE_SELF) and its waited-for children's (RUSAGE_CHILDREN), setup to teardown."""
import os, resource, time
import pytest

_LOG = os.environ.get("CPUPLUG_LOG", "/tmp/cpuplug.log")

def _now():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime, time.perf_counter()

@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    a = _now()
    try:
        return (yield)
    finally:
        b = _now()
        with open(_LOG, "a") as f:
            f.write(f"{os.environ.get('PYTEST_XDIST_WORKER','-')}\t{item.nodeid}\t{b[0]-a[0]:.3f}\t{b[1]-a[1]:.3f}\t{b[2]-a[2]:.3f}\n")
