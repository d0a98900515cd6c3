#!/usr/bin/env bash
# One call on the lent GPU machine (issue #9; 1 or 2 GPUs), writing under $OUT:
#   tests     the arms' equivalence tests on CUDA with NCCL ($TEST_FILES, default tests/training/test_arms.py,
#             selected by $TEST_K; default: its 2-rank cases)
#   recovery  the recovery trial on 2 GPUs (clean-pair, cuda-smoke: kill rank 1 after 11, resume from 8)
#   io        bench/checkpoint_io.py: checkpoint write against a plain write + fsync, from GPU tensors
#   profile   the 1.7B batched single arm (or $PROFILE_ARMS) per profile in $PROFILES (default
#             gpu-bench), on one GPU, with the bf16 peak, a torch.profiler table of updates 2-4 (or
#             from $TRIAL_PROFILE_FROM), and $BENCH_FLAGS (e.g. "--checkpoint-every 16 --io-baseline",
#             or "--ranks 2" for multi-rank arms as pairs; a powersgd arm needs two ranks: its compression
#             alone, on one GPU, is the reduction step's);
#             outputs are named $PROFILE_TAG-<profile> (default single-<profile>)
#   reduction bench/powersgd_step.py: the ddp/powersgd gradient reduction alone at the 1.7B shapes, on
#             $REDUCTION_WORLD ranks (default 1: the compression without the network; 2: over sockets)
#   sockets   the 2-rank arms ($SOCKET_ARMS: groups separated by ';', each its own run) over NCCL
#             TCP sockets on loopback, profile $SOCKET_PROFILE, multi-rank arms as pairs (--ranks 2)
# STEPS (default "tests recovery profile") picks them, run in the order given.
#   carry: .whl (pure-Python wheels the image lacks), .seeds/tiny, and .inductor when a previous
#   call left one (torch.compile's cache: kernels compiled there are reused here)
set -uo pipefail
exec > >(tee -a "$OUT/session.log") 2>&1  # what ran so far comes back even if the call runs out of time
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=$PWD/.inductor
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
STEPS=${STEPS:-tests recovery profile}
# NCCL over TCP sockets on loopback: the inter-host emulation of the sockets and reduction steps
SOCKETS=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_ALGO=Ring NCCL_PROTO=Simple)
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
df -h /tmp | tail -1
s=$SECONDS
seed17() {
  [[ -d /tmp/seed-local ]] && return
  python3 bench/make_arch_seed.py --tokenizer-from .seeds/tiny --out /tmp/arch >/dev/null && \
    python3 -m training seed --kind local --source /tmp/arch --out /tmp/seed-local >/dev/null && rm -rf /tmp/arch
  echo "1.7B seed: $((SECONDS - s)) s"; s=$SECONDS
}
step_tests() {
  TRIAL_TEST_DEVICE=cuda TRIAL_TEST_TINY_SEED=$PWD/.seeds/tiny timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider \
    --tb=short ${TEST_FILES:-tests/training/test_arms.py} -k "${TEST_K:-not four and not diloco_equals and not outer_step_formula and not chunked_mean}" \
    > "$OUT/cuda-arms-tests.txt" 2>&1
  grep -E "^E |passed|failed" "$OUT/cuda-arms-tests.txt" | tail -30
  echo "arms tests on CUDA: $((SECONDS - s)) s"; s=$SECONDS
}
step_recovery() {
  timeout 300 python3 -m orchestrate recovery-trial --arm clean-pair --profile cuda-smoke --from-step 8 \
    --kill-after 11 --out /tmp/rec --seeds .seeds 2>&1 | tail -8 | tee "$OUT/recovery-cuda.txt"
  cp /tmp/rec/recovery-comparison.json "$OUT/recovery-comparison-cuda.json" 2>/dev/null
  echo "recovery trial on CUDA: $((SECONDS - s)) s"; s=$SECONDS
}
step_io() {
  timeout ${IO_TIMEOUT:-300} python3 bench/checkpoint_io.py --gib ${IO_GIB:-4} --repeats 2 --dir /tmp/ckio --out "$OUT/checkpoint-io.json"
  echo "checkpoint io: $((SECONDS - s)) s"; s=$SECONDS
}
step_profile() {
  seed17
  for p in ${PROFILES:-gpu-bench}; do
    local tag=${PROFILE_TAG:-single}-$p
    TRIAL_PROFILE=$OUT/prof-$tag timeout ${PROFILE_TIMEOUT:-480} python3 bench/arms_bench.py --profile "$p" --model-dir /tmp/seed-local \
      --arms "${PROFILE_ARMS:-batched-learning:single}" --max-world 1 --peak --label "profile $p" --work "/tmp/work-$p" \
      ${BENCH_FLAGS:-} --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
    grep -E "MFU|bf16|Error|error|step s|single |powersgd|PowerSGD|checkpoint" "$OUT/$tag.log" | tail -16
    rm -rf "/tmp/work-$p"
    echo "profiled $tag: $((SECONDS - s)) s"; s=$SECONDS
  done
}
step_reduction() {  # the ddp and powersgd arms' gradient reduction alone (bench/powersgd_step.py)
  local w=${REDUCTION_WORLD:-1} net=()
  (( w > 1 )) && net=("${SOCKETS[@]}")
  "${net[@]}" timeout ${REDUCTION_TIMEOUT:-300} python3 bench/powersgd_step.py --world "$w" --steps ${REDUCTION_STEPS:-8} \
    --profile "$OUT/prof-reduction-world$w" > "$OUT/reduction-world$w.log" 2>&1
  grep -E "median|parameters|Error|error" "$OUT/reduction-world$w.log" | tail -8
  echo "reduction, $w rank(s): $((SECONDS - s)) s"; s=$SECONDS
}
step_sockets() {
  seed17
  local i=0 group
  IFS=';' read -ra groups <<< "${SOCKET_ARMS:-ddp-four,diloco-four}"
  for group in "${groups[@]}"; do  # each group its own benchmark run: one timing out loses only itself
    i=$((i + 1))
    "${SOCKETS[@]}" timeout ${SOCKET_TIMEOUT:-420} python3 bench/arms_bench.py --profile "${SOCKET_PROFILE:-gpu-bench}" --model-dir /tmp/seed-local \
      --arms "$group" --ranks 2 --max-world 2 --peak --label sockets \
      --work /tmp/work-sockets-$i --out "$OUT/sockets-$i.json" > "$OUT/sockets-$i.log" 2>&1
    grep -vE "^  update|^\s*$" "$OUT/sockets-$i.log" | tail -30
    rm -rf /tmp/work-sockets-$i
    echo "sockets $group: $((SECONDS - s)) s"; s=$SECONDS
  done
}
for step in $STEPS; do
  "step_$step"
done
ls -la "$OUT"
