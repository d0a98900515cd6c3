#!/usr/bin/env bash
# Issue #58 on one lent GPU, calls back to back (the seed waits in /tmp between them):
#
#   STEPS="stash check"  call 1, carry .whl .seed-parts/part-aa: the seed's first part into /tmp; the
#                        engine's tests on CUDA (a request alone vs beside neighbours, bit for bit, graphs replayed)
#   STEPS="stash"        call 2, carry .whl .seed-parts/part-ab1
#   STEPS="bench"        call 3, carry .whl .seed-parts/part-ab2 .peer: joins and materializes the 135M seed, then
#                        bench/serving_bench.py at gpu-135m (one replica's engine, 1/4/16/64 in flight, the
#                        replica's call before #58 beside it) and the same library's serving modes
#                        (.peer/serving/serve_bench.py, a copy of ../shared/anchors/serving) in the same call
#   STEPS="study"        call 4, carry .whl: `orchestrate run cooperative-learning --profile gpu-135m --share-gpus`,
#                        its probe sweeping 1/4/16/64 in flight on every phase (four replicas sharing the GPU)
# Writes under $OUT: session.log and, per step, its figures, report and logs.
set -uo pipefail
exec > >(tee -a "$OUT/session.log") 2>&1
. bench/lent_gpu.sh  # lent_gpu_env, SEED_WHEEL, join_seed
STUDY=/tmp/study
mkdir -p "$STUDY" /tmp/logs
lent_gpu_env
s=$SECONDS

step_stash() { stash_seed_parts; }
step_check() {
  timeout 240 python3 -m pytest -p no:cacheprovider -q tests/training/test_engine.py -k cuda 2>&1 | tail -8
}
step_bench() {
  join_seed "$STUDY/seeds"
  local t0=$SECONDS
  timeout "${BENCH_TIMEOUT:-200}" python3 bench/serving_bench.py --experiment cooperative-learning --profile gpu-135m \
    --seeds "$STUDY/seeds" --slots "${SLOTS:-16,64}" --levels 1,4,16,64 --requests 64 --reference 8 \
    --out "$OUT/serving-bench-gpu-135m.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/serving-bench-gpu-135m.txt"
  echo "serving bench: exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
  t0=$SECONDS
  OUT=$OUT SERVE_BENCH_BUDGET_S=${ANCHOR_BUDGET:-230} SERVE_BENCH_MODES=${ANCHOR_MODES:-a_replica,b_static_compile,e_static_compile_b16,c_batched_64} \
    timeout 260 python3 .peer/serving/serve_bench.py > "$OUT/anchor-serve-bench.txt" 2>&1
  echo "anchor serve_bench: exit $? in $((SECONDS - t0)) s"; tail -12 "$OUT/anchor-serve-bench.txt"
}
step_study() {
  [[ -f $STUDY/seeds/smollm2-135m/receipt.json ]] || { echo "no 135M seed in $STUDY/seeds: run the bench call first"; exit 7; }
  local t0=$SECONDS
  timeout "${RUN_TIMEOUT:-540}" python3 -m orchestrate run cooperative-learning --profile gpu-135m --share-gpus \
    --trials "$STUDY/trials" --seeds "$STUDY/seeds" --record "$STUDY/coop-record.json" > "$STUDY/coop-run.log" 2>&1
  echo "orchestrate run cooperative-learning --profile gpu-135m --share-gpus: exit $? in $((SECONDS - t0)) s"
  grep -vE "^  update [0-9]+/|^\s*$" "$STUDY/coop-run.log" | tail -60
  local home=$STUDY/trials/cooperative-learning-gpu-135m
  cp "$STUDY/coop-record.json" "$STUDY/coop-run.log" "$home/report.md" "$home/report.json" "$home/commitments.jsonl" "$OUT/" 2>/dev/null
  tar -czf "$OUT/coop-serving.tar.gz" --ignore-failed-read "$home/serving" "$home/logs/serving" "$home/prepared.json" \
    "$home/selection.json" 2>/dev/null
}
for step in ${STEPS:-}; do
  "step_$step"
  echo "step $step: $((SECONDS - s)) s"; s=$SECONDS
done
ls -la "$OUT"
