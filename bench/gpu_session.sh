#!/usr/bin/env bash
# One call on the lent 2-GPU machine (issue #9), writing under $OUT:
#   tests     the arms' equivalence tests on CUDA with NCCL (tests/test_arms.py, 2-rank cases)
#   recovery  the recovery trial on 2 GPUs (clean-pair, cuda-smoke: kill rank 1 after 11, resume from 8)
#   profile   a torch.profiler breakdown of the 1.7B batched single arm, per profile in $PROFILES
# STEPS (default "tests recovery profile") picks them; PROFILES defaults to gpu-bench.
#   carry: .whl (pure-Python wheels the image lacks), .seeds/tiny
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
STEPS=${STEPS:-tests recovery profile}
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
s=$SECONDS
if [[ $STEPS == *tests* ]]; then
  TRIAL_TEST_DEVICE=cuda TRIAL_TEST_TINY_SEED=$PWD/.seeds/tiny timeout 300 python3 -m pytest -q -p no:cacheprovider \
    --tb=short tests/test_arms.py -k "not four and not diloco_equals and not outer_step and not chunked_mean" \
    > "$OUT/cuda-arms-tests.txt" 2>&1
  grep -E "^E |passed|failed" "$OUT/cuda-arms-tests.txt" | tail -30
  echo "arms tests on CUDA: $((SECONDS - s)) s"; s=$SECONDS
fi
if [[ $STEPS == *recovery* ]]; then
  timeout 300 python3 -m orchestrate recovery-trial --arm clean-pair --profile cuda-smoke --from-step 8 \
    --kill-after 11 --out /tmp/rec --seeds .seeds 2>&1 | tail -8 | tee "$OUT/recovery-cuda.txt"
  cp /tmp/rec/recovery-comparison.json "$OUT/recovery-comparison-cuda.json" 2>/dev/null
  echo "recovery trial on CUDA: $((SECONDS - s)) s"; s=$SECONDS
fi
if [[ $STEPS == *profile* ]]; then
  python3 bench/make_arch_seed.py --tokenizer-from .seeds/tiny --out /tmp/arch >/dev/null && \
    python3 -m training seed --kind local --source /tmp/arch --out /tmp/seed-local >/dev/null
  echo "1.7B seed: $((SECONDS - s)) s"; s=$SECONDS
  for p in ${PROFILES:-gpu-bench}; do
    TRIAL_PROFILE=$OUT/prof-$p timeout 440 python3 bench/arms_bench.py --profile "$p" --model-dir /tmp/seed-local \
      --arms batched-learning:single --max-world 1 --peak --label "profile $p" --work "/tmp/work-$p" \
      --out "$OUT/single-$p.json" 2>&1 | grep -E "MFU|bf16|Error|error|step s|single " | tail -8
    echo "profiled $p: $((SECONDS - s)) s"; s=$SECONDS
  done
fi
