"""How fast does one replica's engine (training/engine.py) generate, at each number of requests in
flight, on this device — and do its tokens stay the same? (#58)

The seed a profile serves (the real SmolLM2-135M at `cpu` and `gpu-135m`), the dev prompts of an
experiment at that profile, greedy answers up to the replica's budget. Beside the engine, the replica's
call before #58 (`generate()` one request at a time, eager, dynamic cache) on a few of the same prompts,
so both are measured in one process on one device. For each engine shape (`--slots`) and each level c
of `--levels`: c client threads in a closed loop over `--requests` requests (the dev cases cycled), as
the probe's client drives a replica: generated tokens/s, requests/s, p50/p95 latency and time to first
token, against the memory-bandwidth bound of the device (min(c, slots) rows per decode step, each step
reading the weights once). Identity: every task's tokens at every level and shape against the first
level's, and the first `--logit-cases` tasks' logits at every level against the same task alone, bit for bit.

    python bench/serving_bench.py --profile gpu-135m --slots 64 --levels 1,4,16,64 --out serving.json
    python bench/serving_bench.py --profile cpu --threads 2 --slots 1,2,4,8 --levels 1,4,8 --requests 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["ATEN_CPU_CAPABILITY"] = "default"  # as `training serve` runs a replica (training/engine.py)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from serving_cpu_bench import replica_call  # noqa: E402  (bench/ is this script's folder)
from training.config import lineage  # noqa: E402
from training.engine import Engine, cast_for_serving, compare_tokens, step_bound  # noqa: E402
from training.evaluate import eos_ids, generation_budget, prompt_text  # noqa: E402
from training.prepare import task_rows  # noqa: E402
from training.seed import load_tokenizer, materialize  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def level(engine: Engine, prompts: list[list[int]], budget: int, c: int, n: int, keep: int) -> dict:
    """n requests (prompts cycled), c in flight: each client thread submits its next request when its
    last one is answered."""
    answers: list = [None] * n
    nxt = iter(range(n))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            answers[i] = engine.submit(prompts[i % len(prompts)], budget, keep_logits=i < keep).result()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(len(a.tokens) for a in answers)
    lat = [a.generate_seconds for a in answers]
    ttft = [a.first_token_seconds for a in answers]
    return {"in_flight": c, "requests": n, "wall_seconds": wall, "generated_tokens": tokens,
            "tokens_per_second": tokens / wall, "requests_per_second": n / wall,
            "latency_p50": pct(lat, 50), "latency_p95": pct(lat, 95),
            "first_token_p50": pct(ttft, 50), "first_token_p95": pct(ttft, 95),
            "answers": answers}


def random_135m(device: torch.device) -> tuple:
    """The anchor's model (../shared/anchors/serving/serve_bench.py `build_model`): SmolLM2-135M's shape, random
    weights from seed 0, the end token's embedding zeroed (never the argmax), and its prompts' lengths."""
    import random

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
                      rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, rms_norm_eps=1e-5,
                      initializer_range=0.041666666666666664, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[2].zero_()
    rng = random.Random(1234)
    prompts = [[1] + [rng.randrange(3, 49152) for _ in range(rng.randint(280, 320) - 1)] for _ in range(64)]
    return model, prompts, 64


def profile(engine: Engine, steps: int) -> dict:
    """Where a decode step's time goes: the captured graph replayed alone (no host work), each prefill
    bucket's graph, and the kernels of `steps` replays by total time (torch.profiler, CUPTI)."""
    from torch.profiler import ProfilerActivity, profile as prof

    def timed(fn, n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n

    out = {"decode_step_replay_ms": 1e3 * timed(engine.graph.replay, 200),
           "prefill_replay_ms": {str(m): 1e3 * timed(g[0].replay, 20) for m, g in sorted(engine.prefills.items())}}
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            engine.graph.replay()
        torch.cuda.synchronize()
    rows = []
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append({"kernel": e.key[:90], "calls": e.count, "ms_per_step": t / 1e3 / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    out["kernels_per_step"] = sum(r["calls"] for r in rows) / steps
    out["kernel_ms_per_step"] = sum(r["ms_per_step"] for r in rows)
    out["top_kernels"] = rows[:20]
    print(f"profile: decode step replay {out['decode_step_replay_ms']:.3f} ms, {out['kernels_per_step']:.0f} kernels "
          f"({out['kernel_ms_per_step']:.3f} ms of kernel time) per step; prefill replays "
          + ", ".join(f"{m}: {v:.2f} ms" for m, v in out["prefill_replay_ms"].items()), flush=True)
    for r in rows[:12]:
        print(f"  {r['ms_per_step']:.4f} ms  x{r['calls'] // steps}  {r['kernel']}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default="local-training-windows")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--seeds", default=str(ROOT / ".seeds"))
    ap.add_argument("--slots", default="4", help="engine shapes to measure (comma list)")
    ap.add_argument("--levels", default="1,4,16,64", help="requests in flight (comma list)")
    ap.add_argument("--requests", type=int, default=64, help="requests per level")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--reference", type=int, default=4, help="prompts answered by the replica's call before #58")
    ap.add_argument("--logit-cases", type=int, default=4)
    ap.add_argument("--profile-steps", type=int, default=0, help="CUDA: profile this many decode-step replays")
    ap.add_argument("--no-compile", action="store_true", help="CUDA: the decode step's graph without the compiler")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the serving precision")
    ap.add_argument("--random-135m", metavar="DEVICE", help="no seed: a random model of SmolLM2-135M's shape (as "
                    "../shared/anchors/serving does: end token unreachable), 64 random prompts of 280-320 tokens, "
                    "64 new tokens, on DEVICE")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.random_135m:
        device = torch.device(args.random_135m)
        model, prompts, budget = random_135m(device)
        cases, tok, eos, pad = [None] * len(prompts), None, set(), 2
        args.experiment, args.profile = "random-135m-shape", "none"
    else:
        cfg = lineage(args.experiment, args.profile)[-1]
        device = torch.device(cfg.profile.device)
        md = Path(args.seeds) / cfg.profile.seed
        materialize(cfg.profile.seed, md)
        cases = [r for r in task_rows(cfg)[1] if r["split"] == "dev"]
        tok = load_tokenizer(md, verified=True)
        model = AutoModelForCausalLM.from_pretrained(str(md), dtype=torch.float32).eval().to(device)
        budget = generation_budget(tok, cases)
        eos = eos_ids(model, tok)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        prompts = [tok(prompt_text(tok, c), add_special_tokens=False)["input_ids"] for c in cases]
    cast_for_serving(model, getattr(torch, args.dtype))  # as the replica does (training/serve.py)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{len(cases)} dev cases of {args.experiment}/{args.profile}, prompts {min(map(len, prompts))}–"
          f"{max(map(len, prompts))} tokens, budget {budget}, {name}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}", flush=True)
    import transformers

    result: dict = {"experiment": args.experiment, "profile": args.profile, "device": name, "budget": budget,
                    "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
                    "threads": torch.get_num_threads(), "shapes": []}
    print(f"transformers {transformers.__version__}, serving precision {args.dtype}", flush=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ref_n = min(args.reference, len(cases))

    def one(i: int, n: int) -> list[int]:  # generate() one request at a time: the replica's call before #58
        if tok is not None:
            return replica_call(model, tok, cases[i], n, eos, pad)
        with torch.no_grad():
            g = model.generate(torch.tensor([prompts[i]], device=device), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=pad, eos_token_id=None)
        return g[0, len(prompts[i]):].tolist()

    one(0, 4)  # the first call allocates
    sync()
    t = time.perf_counter()
    reference = [one(i, budget) for i in range(ref_n)]
    sync()
    secs = time.perf_counter() - t
    result["replica_call_before"] = {"requests": ref_n, "tokens_per_second": sum(map(len, reference)) / secs,
                                     "seconds_per_request": secs / ref_n}
    print(f"the replica's call before #58 (one at a time, eager generate): "
          f"{result['replica_call_before']['tokens_per_second']:.1f} tokens/s, "
          f"{secs / ref_n:.3f} s per request ({ref_n} requests)", flush=True)

    first_tokens: dict[int, list[int]] = {}
    print("\n| slots | in flight | tokens/s | req/s | p50 s | p95 s | TTFT p50 s | bound tokens/s | % of bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for slots in [int(x) for x in args.slots.split(",")]:
        t = time.perf_counter()
        engine = Engine(model, slots=slots, max_len=max(map(len, prompts)) + budget, eos=eos, device=device,
                        threads=args.threads, prompt_lengths=[len(p) for p in prompts],
                        compile=False if args.no_compile else None)
        built = time.perf_counter() - t
        facts = engine.describe()
        sb = step_bound(facts)
        engine.start()
        alone = [engine.submit(p, budget, keep_logits=True).result()
                 for p in prompts[:max(args.logit_cases, ref_n)]]
        verdicts = [compare_tokens(a.tokens, a.logits, r, engine.dtype) for a, r in zip(alone, reference)]
        shape = {"slots": slots, "engine_seconds": built, "facts": facts, "step_bound": sb, "levels": [],
                 "against_generate": {"requests": len(verdicts), "equal": verdicts.count("equal"),
                                      "near_ties": verdicts.count("near-tie"), "differ": verdicts.count("differs")}}
        print(f"engine of {slots} slots built in {built:.1f} s (decode step compiled in "
              f"{facts['compile_seconds']:.1f} s); step bound {sb['seconds'] * 1e3:.3f} ms ({sb['bound_by']}: "
              f"weights {facts['weights_bytes'] / 1e6:.0f} MB + cache {facts['cache_bytes'] / 1e6:.0f} MB, "
              f"{facts['step_flops'] / 1e9:.1f} GFLOP); against generate(): {shape['against_generate']}",
              flush=True)
        for c in [int(x) for x in args.levels.split(",")]:
            lv = level(engine, prompts, budget, c, max(args.requests, c), args.logit_cases)
            answers = lv.pop("answers")
            same = diff = 0
            for i, a in enumerate(answers):
                k = i % len(prompts)
                want = first_tokens.setdefault(k, a.tokens)
                same, diff = (same + 1, diff) if a.tokens == want else (same, diff + 1)
            bits = sum(all(torch.equal(x, y) for x, y in zip(a.logits, alone[i].logits))
                       and len(a.logits) == len(alone[i].logits) for i, a in enumerate(answers[:args.logit_cases]))
            bound = min(c, slots) / sb["seconds"]
            lv.update(tokens_identical=same, tokens_differing=diff, logits_bit_identical=bits,
                      logits_compared=min(args.logit_cases, len(answers)), bound_tokens_per_second=bound,
                      bound_from=sb["bandwidth_from"])
            shape["levels"].append(lv)
            print(f"| {slots} | {c} | {lv['tokens_per_second']:.1f} | {lv['requests_per_second']:.2f} | "
                  f"{lv['latency_p50']:.3f} | {lv['latency_p95']:.3f} | {lv['first_token_p50']:.3f} | "
                  f"{bound:,.0f} | {100 * lv['tokens_per_second'] / bound:.1f} % |", flush=True)
        engine.close()
        if args.profile_steps and device.type == "cuda":
            shape["profile"] = profile(engine, args.profile_steps)
        result["shapes"].append(shape)
    same_ref = sum(first_tokens[i] == r for i, r in enumerate(reference))
    print(f"against generate() one at a time ({ref_n} tasks, near-tie gap per training/engine.py NEAR_TIE): "
          + "; ".join(f"{s['slots']} slots {s['against_generate']}" for s in result["shapes"]), flush=True)
    result["identical_to_replica_call_before"] = f"{same_ref}/{len(reference)}"
    total_diff = sum(lv["tokens_differing"] for s in result["shapes"] for lv in s["levels"])
    print(f"\ntokens: {total_diff} answers differ from their task's first answer across every shape and level; "
          f"the engine's tokens equal the replica's call before #58 on {same_ref} of {len(reference)} tasks; "
          f"weights per decode step {facts['weights_bytes'] / 1e6:.1f} MB, cache {facts['cache_bytes'] / 1e6:.1f} MB; bandwidth "
          f"{(facts['bandwidth_bytes_per_s'] or 0) / 1e9:.0f} GB/s spec, "
          f"{facts['measured_copy_bytes_per_s'] / 1e9:.0f} GB/s measured copy", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
