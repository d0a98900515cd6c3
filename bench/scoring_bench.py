"""Benchmark: scoring throughput one case at a time against batches, on the same cases, in one run —
and whether batched answers are the one-at-a-time answers, token for token.

    python bench/scoring_bench.py --home trials/cooperative-learning-gpu-135m \
        --model trials/cooperative-learning-gpu-135m/runs/clean-single/model \
        [--role test --cases 256 --one-cases 64 --batches 1,16,128 --dtypes float32,bfloat16 --out result.json]

For each generation dtype (autocast on CUDA; FP32 weights either way, as `evaluate` scores) and each
batch size, it answers the first `--cases` cases of the role greedily with `training.evaluate.
generate_answers` — the function `evaluate` uses — under the generation budget `evaluate` would use
for that role, and prints seconds, cases/s, generated tokens/s (each answer up to and including its
end token), exact answers, and how many answers equal that dtype's batch-1 answers token for token
(and FP32 batch 1's), with the first differing case and position. Batch 1 is slow, so it answers only
the first `--one-cases` of them; identity is compared on those. Batch 16 in FP32 is how scoring ran
before `score_batch` (the "before"); the profile's `score_batch` is the "after". A short untimed
warm-up comes first. The model directory is verified against its receipt; the GPU is locked as any
evaluation locks it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def first_difference(a: list[list[int]], b: list[list[int]]) -> dict | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            pos = next((k for k, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            return {"case_index": i, "token_position": pos}
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", required=True, help="a prepared trial home (its cases)")
    ap.add_argument("--model", required=True, help="a model directory with receipt.json (a seed or runs/<arm>/model)")
    ap.add_argument("--role", default="test", choices=("dev", "test"))
    ap.add_argument("--cases", type=int, default=64, help="the first N cases of the role (0: all)")
    ap.add_argument("--one-cases", type=int, default=None, help="batch 1 answers only the first N of them "
                                                                   "(default: all)")
    ap.add_argument("--batches", default="1,16,128")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="generation dtypes (bfloat16 only on CUDA)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from evidence.checker import check_answer
    from training.evaluate import generate_answers, generation_budget
    from training.prepare import load_cases, require_prepared
    from training.runtime import device_lock, pick_device
    from training.seed import load_tokenizer, quiet_libraries, verify_seed

    require_prepared(Path(args.home))
    verify_seed(args.model)
    device = pick_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), 0)
    lock = device_lock(device)  # noqa: F841 — held for the process's life
    quiet_libraries()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval().to(device)
    tok = load_tokenizer(args.model, verified=True)
    every = [c for c in load_cases(Path(args.home)).values() if c["split"] == args.role]
    budget = generation_budget(tok, every)  # as evaluate: over every case of the role
    cases = every[:args.cases] if args.cases else every
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = [d for d in args.dtypes.split(",") if device.type == "cuda" or d == "float32"]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generate_answers(model, tok, cases[:2], batch=2, max_new_tokens=8, device=device)  # warm-up, untimed

    rows, answers = [], {}
    for dt in dtypes:
        cast = None if dt == "float32" else getattr(torch, dt)
        for b in batches:
            these = cases[:args.one_cases] if b == 1 and args.one_cases else cases
            sync()
            t0 = time.perf_counter()
            got = generate_answers(model, tok, these, batch=b, max_new_tokens=budget, device=device,
                                   autocast_dtype=cast)
            sync()
            s = time.perf_counter() - t0
            answers[(dt, b)] = got
            tokens = sum(len(a) for a in got)
            exact = sum(check_answer(tok.decode(a, skip_special_tokens=True).strip(), c["schema"],
                                     c["answer"]).correct for c, a in zip(these, got))
            ref = answers.get((dt, batches[0]))
            ref32 = answers.get(("float32", batches[0]))
            same = lambda ref: None if ref is None else sum(x == y for x, y in zip(got, ref))  # noqa: E731
            rows.append({"dtype": dt, "batch": b, "cases": len(these), "seconds": s, "cases_per_second": len(these) / s,
                         "generated_tokens": tokens, "generated_tokens_per_second": tokens / s, "exact": exact,
                         "compared_with_batch1": min(len(got), len(ref)),
                         "identical_to_batch1_same_dtype": same(ref),
                         "first_difference_same_dtype": first_difference(got, ref),
                         "identical_to_batch1_float32": same(ref32),
                         "first_difference_float32": None if ref32 is None else first_difference(got, ref32)})
            r = rows[-1]
            print(f"{dt:>9} batch {b:>4}: {s:8.2f} s  {r['cases_per_second']:8.2f} cases/s  "
                  f"{r['generated_tokens_per_second']:10,.0f} tokens/s  exact {exact}/{len(these)}  "
                  f"identical to batch {batches[0]} on its {len(ref)}: {r['identical_to_batch1_same_dtype']} ({dt}), "
                  f"{r['identical_to_batch1_float32']} (float32)", flush=True)
    result = {"command": " ".join(["python", *sys.argv]), "machine": platform.machine(), "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
              "torch": torch.__version__, "model": args.model, "home": args.home, "role": args.role,
              "max_new_tokens": budget, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
