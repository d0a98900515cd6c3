"""Does batching pay off for a serving replica on this machine's CPU, at the main job's size? (#58's
"on CPU, measure first"): the seed the CPU main job serves (SmolLM2-135M, FP32), the dev prompts of
its experiment at its profile, greedy answers up to the replica's budget, the replica's own call
(`training/serve.py`: one request at a time, eager `generate`, dynamic cache) beside batched eager
`generate` (left-padded, masked: scoring's `generate_answers`) at several batch sizes, and a static
cache at batch 1. Per mode: generated tokens/s, seconds per request, and whether every answer's
tokens equal the replica's call's.

    python bench/serving_cpu_bench.py [--experiment local-training-windows --profile cpu] \
        [--cases 32] [--threads 2] [--batches 1,4,8,16,32] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from training.config import lineage  # noqa: E402
from training.evaluate import answer_tokens, eos_ids, generate_answers, generation_budget, prompt_text  # noqa: E402
from training.prepare import task_rows  # noqa: E402
from training.seed import load_tokenizer, materialize  # noqa: E402


def replica_call(model, tok, case: dict, budget: int, eos: set[int], pad: int, **extra) -> list[int]:
    """What training/serve.py's replica did for one request before its engine (#58)."""
    enc = tok(prompt_text(tok, case), add_special_tokens=False, return_tensors="pt").to(model.device)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=budget, do_sample=False, pad_token_id=pad,
                             eos_token_id=sorted(eos), **extra)
    return answer_tokens(gen[0, enc["input_ids"].shape[1]:], eos)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default="local-training-windows")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--seeds", default=str(ROOT / ".seeds"))
    ap.add_argument("--cases", type=int, default=64, help="at most this many dev cases (the profile may have fewer)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="4,8,16")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = lineage(args.experiment, args.profile)[-1]
    md = Path(args.seeds) / cfg.profile.seed
    materialize(cfg.profile.seed, md)
    cases = [r for r in task_rows(cfg)[1] if r["split"] == "dev"][:args.cases]
    tok = load_tokenizer(md, verified=True)
    model = AutoModelForCausalLM.from_pretrained(str(md), dtype=torch.float32).eval()
    budget = generation_budget(tok, cases)
    eos = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompt_tokens = [len(tok(prompt_text(tok, c), add_special_tokens=False)["input_ids"]) for c in cases]
    print(f"{len(cases)} dev cases of {args.experiment}/{args.profile}, prompts {min(prompt_tokens)}–"
          f"{max(prompt_tokens)} tokens, budget {budget} new tokens, {args.threads} threads, torch "
          f"{torch.__version__}", flush=True)
    rows = []

    def record(mode: str, answers: list[list[int]], seconds: float, base: list[list[int]] | None) -> list[list[int]]:
        n = sum(len(a) for a in answers)
        same = None if base is None else sum(a == b for a, b in zip(answers, base))
        row = {"mode": mode, "cases": len(answers), "generated_tokens": n, "seconds": seconds,
               "tokens_per_second": n / seconds, "seconds_per_request": seconds / len(answers),
               "identical_to_replica_call": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
        return answers

    replica_call(model, tok, cases[0], 4, eos, pad)  # warm-up: the first call allocates
    t = time.perf_counter()
    base = record("replica call: batch 1, eager, dynamic cache",
                  [replica_call(model, tok, c, budget, eos, pad) for c in cases], time.perf_counter() - t, None)
    t = time.perf_counter()
    record("batch 1, static cache", [replica_call(model, tok, c, budget, eos, pad, cache_implementation="static")
                                     for c in cases], time.perf_counter() - t, base)
    for b in [int(x) for x in args.batches.split(",") if int(x) <= len(cases)]:  # a larger one is the same batch
        t = time.perf_counter()
        record(f"batched eager generate, batch {b} (left-padded, masked)",
               generate_answers(model, tok, cases, batch=b, max_new_tokens=budget, device=torch.device("cpu")),
               time.perf_counter() - t, base)
    print("\n| mode | generated tokens/s | s per request | tokens identical to the replica's call |")
    print("|---|---|---|---|")
    for r in rows:
        same = "—" if r["identical_to_replica_call"] is None else f"{r['identical_to_replica_call']}/{r['cases']}"
        print(f"| {r['mode']} | {r['tokens_per_second']:.1f} | {r['seconds_per_request']:.3f} | {same} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"experiment": args.experiment, "profile": args.profile,
                                              "threads": args.threads, "budget": budget,
                                              "prompt_tokens": prompt_tokens, "torch": torch.__version__,
                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
