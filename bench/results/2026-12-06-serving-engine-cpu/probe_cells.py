import sys, time, shutil, json
from pathlib import Path
from orchestrate.backends.local import LocalReplicas
from orchestrate.serving import run_phase, warm_all
from evidence.serving import workload, warmup_workload
from training.prepare import load_cases
src = Path("/tmp/fresh/trials/local-training-windows-cpu")
home = Path("/tmp/cpuprobe/home"); shutil.rmtree(home.parent, ignore_errors=True); home.parent.mkdir(parents=True)
shutil.copytree(src, home)
dev = sorted(c for c, v in load_cases(home).items() if v["split"] == "dev")
levels = [int(x) for x in sys.argv[1].split(",")]; R = int(sys.argv[2])
t0 = time.perf_counter()
import os
with LocalReplicas(home, 4, home / "logs" / "serving", threads=int(os.environ.get("XTHREADS", "1"))) as reps:
    print(f"start {time.perf_counter()-t0:.1f} s", flush=True)
    t = time.perf_counter()
    eps = reps.endpoints
    for phase, E in (("single", eps[:1]), ("replicas", eps)):
        for c in levels:
            t = time.perf_counter()
            d = run_phase(workload(dev, f"{phase}-c{c}", R), E, concurrency=c)
            f = d["figures"]
            toks = sum(len(r["response"]["token_ids"]) for r in d["requests"] if r["outcome"] == "ok")
            print(f"{phase} c{c}: {time.perf_counter()-t:.1f} s, {f['completed']}/{R}, {toks/d['wall_seconds']:.1f} tok/s, {toks/R:.0f} tok/req", flush=True)
print(f"total {time.perf_counter()-t0:.1f} s")
