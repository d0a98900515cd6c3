"""Which Python processes a test run starts, by test and by kind (#34: is the suite's time in process
start-ups or in the work itself?).

    python bench/process_census.py install .venv [--log /tmp/pystarts.log]   # every start of that venv's python is logged
    ./scripts/test.sh -q ...                                                  # the run to count
    python bench/process_census.py report [--log /tmp/pystarts.log]           # the tables
    python bench/process_census.py uninstall .venv

`install` puts a `.pth` hook in the venv's site-packages (a measurement, never left in place: `uninstall`
removes it): each interpreter that starts appends its time, pid, the test that started it (the
PYTEST_CURRENT_TEST it inherited; "-" for processes started through sshd on the namespace hosts, which
inherit nothing) and its command line; at a normal exit it appends the CPU seconds it used itself
(`getrusage`, children apart; a process ended by a signal reports none). An interpreter started with
-S (no site) is not counted.

    python bench/process_census.py sample [--log /tmp/pycpu.log] &   # until SIGTERM or Ctrl-C
    ./scripts/test.sh -q ...; kill %1
    python bench/process_census.py report --log /tmp/pycpu.log

`sample` reads every process's CPU time from /proc twice a second instead, and writes the hook's lines when
stopped: it also counts what the hook cannot — ranks that leave by `os._exit`, processes ended by a signal,
and programs that are not Python (sshd, Pulumi's engine). A process that lives under half a second is missed;
one that was running when sampling began counts only what it used after. The test is the
PYTEST_CURRENT_TEST in the process's environment, as the hook reads it. It also writes the whole machine's
busy core-seconds over the sampling (/proc/stat), which misses nothing: the suite is CPU-bound when that
is close to the wall time times the cores.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import time
from pathlib import Path

HOOK = '''import atexit, os, resource, sys, time
def _line(what):
    try:
        with open({log!r}, "a") as f:
            f.write(f"{{time.time():.3f}}\\t{{os.getpid()}}\\t{{os.environ.get('PYTEST_CURRENT_TEST', '-')}}\\t"
                    f"{{' '.join(getattr(sys, 'orig_argv', sys.argv))[:240]}}\\t{{what}}\\n")
    except OSError:
        pass
def _cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    _line(f"cpu={{u.ru_utime + u.ru_stime:.3f}}")
_line("start")
atexit.register(_cpu)
'''


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"{venv}: no lib/python3*/site-packages")
    return found[0]


def kind(argv: str) -> str:
    m = re.search(r"-m (\S+ \S+)", argv)
    if m:
        return m.group(1)
    if " -I -c" in argv:
        return "python -I -c (host checks)"
    if "_in_process" in argv:
        return "pip build hook"
    if "exec(eval" in argv:
        return "xdist worker"
    return "other: " + re.sub(r"/\S*/", "…/", argv)[:60]


def report(log: Path) -> None:
    rows = [r for r in (line.rstrip("\n").split("\t") for line in log.open()) if len(r) in (4, 5)]
    for r in rows:
        if r[3] == "machine":  # `sample`'s whole-machine line
            busy, wall = (float(x.split("=")[1]) for x in r[4].split())
            print(f"the machine: {busy:,.1f} core-seconds busy in {wall:,.1f} s "
                  f"({busy / wall:.2f} of {os.cpu_count()} cores on average)")
    rows = [r for r in rows if r[3] != "machine"]
    by_test, by_kind, both = collections.Counter(), collections.Counter(), collections.Counter()
    cpu_test, cpu_kind, cpu_both = collections.Counter(), collections.Counter(), collections.Counter()
    ended = 0
    for row in rows:
        _, _, test, argv = row[:4]
        what = row[4] if len(row) == 5 else "start"
        t = re.sub(r"@.*", "", test).split("::")[0]
        k = kind(argv)
        if what == "start":
            by_test[t] += 1
            by_kind[k] += 1
            both[(t, k)] += 1
        elif what.startswith("cpu="):  # at a normal exit: what the process itself used (children apart)
            ended += 1
            sec = float(what[4:])
            cpu_test[t] += sec
            cpu_kind[k] += sec
            cpu_both[(t, k)] += sec
    print(f"{sum(by_kind.values())} processes started (with the hook: Python ones)")
    tables("", by_test, by_kind, both, "{:6d}")
    if ended:
        print(f"\nCPU seconds of the {ended} with a figure (the hook: those that exited normally; `sample`: all): "
              f"{sum(cpu_kind.values()):,.1f} in all")
        tables("CPU ", cpu_test, cpu_kind, cpu_both, "{:9.1f}")


def tables(prefix: str, by_test: collections.Counter, by_kind: collections.Counter,
           both: collections.Counter, fmt: str) -> None:
    for title, counter, n in (("by test file", by_test, 30), ("by kind", by_kind, 25),
                              ("by test file and kind", both, 40)):
        print(f"\n{prefix}{title}:")
        for key, value in counter.most_common(n):
            print(f"{fmt.format(value)}  {' · '.join(key) if isinstance(key, tuple) else key}")


def machine_busy() -> float:
    """Core-seconds every CPU of the machine has spent busy since boot (/proc/stat: all but idle and
    iowait): it counts what the per-process sampling misses (processes shorter than a sample, the kernel)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def sample(log: Path, every_s: float = 0.5) -> None:
    """Every process's CPU seconds from /proc, until SIGTERM or SIGINT; then the hook's lines for each."""
    tick, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    seen: dict[tuple[int, str], list] = {}  # (pid, start time) -> [test, argv, cpu, cpu when first seen]
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: stopped.append(n))
    first, t0, busy0 = True, time.time(), machine_busy()
    while not stopped:
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != me):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu, key = (int(fields[11]) + int(fields[12])) / tick, (pid, fields[19])
                if key not in seen:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    test = next((e[20:].decode(errors="replace") for e in env
                                 if e.startswith(b"PYTEST_CURRENT_TEST=")), "-")
                    seen[key] = [test, argv.strip()[:240], cpu, cpu if first else 0.0]
                seen[key][2] = cpu
            except (OSError, IndexError, ValueError):  # gone meanwhile, or a kernel thread
                pass
        first = False
        time.sleep(every_s)
    with log.open("a") as f:
        f.write(f"{time.time():.3f}\t0\t-\tmachine\tbusy={machine_busy() - busy0:.1f} wall={time.time() - t0:.1f}\n")
        for (pid, _), (test, argv, cpu, base) in seen.items():
            f.write(f"{time.time():.3f}\t{pid}\t{test}\t{argv}\tstart\n"
                    f"{time.time():.3f}\t{pid}\t{test}\t{argv}\tcpu={cpu - base:.3f}\n")
    print(f"{len(seen)} processes sampled into {log}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("install", "uninstall", "report", "sample"))
    ap.add_argument("venv", nargs="?", type=Path)
    ap.add_argument("--log", type=Path, default=Path("/tmp/pystarts.log"))
    a = ap.parse_args()
    if a.action == "report":
        report(a.log)
        return
    if a.action == "sample":
        sample(a.log)
        return
    if a.venv is None:
        raise SystemExit(f"{a.action} needs the venv")
    sp = site_packages(a.venv)
    if a.action == "install":
        (sp / "_process_census.py").write_text(HOOK.format(log=str(a.log)))
        (sp / "zz_process_census.pth").write_text("import _process_census\n")
        print(f"logging every start of {a.venv}'s python to {a.log}")
    else:
        for name in ("_process_census.py", "zz_process_census.pth"):
            (sp / name).unlink(missing_ok=True)
        print(f"removed the hook from {sp}")


if __name__ == "__main__":
    main()
