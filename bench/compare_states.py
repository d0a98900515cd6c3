"""Every rank's checkpointed state at every published step of two trials, tensor by tensor, plus the
final parameters' digests: `bench/compare_homes.py`'s facts down to the saved state.

    PYTHONPATH=. python bench/compare_states.py TRIALS_OLD TRIALS_NEW

The states are loaded by the code on PYTHONPATH, so a comparison across a change also shows that the
old code's files still load. Exit status 1 when any state or digest differs."""
import json, sys
from pathlib import Path
from training.checkpoint.compare import compare_states
from training.checkpoint.group import load_rank_state
from training.runs import local_manifests

old, new = Path(sys.argv[1]), Path(sys.argv[2])
ok = True
for home in sorted(p for p in old.iterdir() if (p / "runs").is_dir()):
    for rank_dir in sorted((home / "runs").glob("*/rank-*")):
        arm, r = rank_dir.parent.name, int(rank_dir.name[5:])
        other = new / home.name / "runs" / arm / rank_dir.name
        fo = json.loads((rank_dir / "result.json").read_text())["digests"]["final_parameters"]
        fn = json.loads((other / "result.json").read_text())["digests"]["final_parameters"]
        line = [f"{home.name} {arm} rank {r}: final_parameters {'same' if fo == fn else 'DIFFER'}"]
        ok &= fo == fn
        for step in sorted(local_manifests(rank_dir)):
            a, _ = load_rank_state(rank_dir, step, r)
            b, _ = load_rank_state(other, step, r)
            c = compare_states(a, b)
            ok &= c["identical"]
            n = sum(v["tensors"] for v in c.values() if isinstance(v, dict))
            line.append(f"step {step}: {n} tensors, max|Δ| {c['max_abs_diff']}, identical={c['identical']}")
            raw = (rank_dir / "checkpoints" / f"step-{step:06d}" / "state.bin").read_bytes()[:1 << 20]
            raw2 = (other / "checkpoints" / f"step-{step:06d}" / "state.bin").read_bytes()[:1 << 20]
            assert b"training.checkpoint" in raw and b"training.checkpoint" in raw2
        print("; ".join(line))
print("ALL IDENTICAL" if ok else "SOME DIFFER")
sys.exit(0 if ok else 1)
