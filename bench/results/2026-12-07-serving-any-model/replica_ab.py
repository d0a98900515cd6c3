import os, sys, time
root = sys.argv[1]; sys.path.insert(0, root); os.chdir(root)
import torch
torch.set_num_threads(1)
import training.engine as E
if hasattr(E, "cpu_kernels") and os.environ.get("FORCE"): E.cpu_kernels = lambda: "DEFAULT"
from training import serve as S
home = "/tmp/rl-before/trials/local-training-windows-cpu"
t = time.perf_counter()
rep = S.load_replica(home, name="replica-0", threads=1)
load = time.perf_counter() - t
tasks = sorted(rep.tasks)
t = time.perf_counter(); n = 0
for k, tid in enumerate(tasks[:8]):
    st, body = rep.answer(S.AnswerRequest(request_id=f"r{k}", task_id=tid)); n += len(body["token_ids"])
dt = time.perf_counter() - t
print(f"{root} cap={torch.backends.cpu.get_cpu_capability()} load {load:.1f} s; 8 requests one at a time {dt:.1f} s, {n} tokens, {n/dt:.1f} tok/s")
rep.close()
