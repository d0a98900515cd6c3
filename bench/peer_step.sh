#!/usr/bin/env bash
# Issue #25 on one lent H200, in one call: torchtitan's anchor (../shared/anchors/torchtitan, as given:
# its config, shims and peak measurement) and the project's single arm on the same 1.7B architecture,
# then one table (bench/peer_table.py) against the one bf16 peak measured here. torchtitan imports
# Hugging Face `datasets` at module level for a loader the anchor never runs; the image lacks it,
# so bench/peer_stubs stands in (anything of it that is called raises).
#
# Carry: .whl (pydantic & co.), .peer (a copy of ../shared/anchors/torchtitan in .peer/torchtitan and
# the wheels its README names in .peer/whl: torchtitan 0.3.0, torchdata 0.11.0, tyro and the small
# pure-Python packages they import), and in .peer/tok the tiny seed's tokenizer files (the 1.7B random-init seed borrows them).
#   TT_BATCHES   torchtitan local batches to run (default "16": its best in the anchor's result)
#   TT_ARGS      torchtitan overrides (default --training.disable_cuda_graphs: the anchor ran with
#                CUDA graphs off, which on torch 2.11 refuse its FlexAttention BlockMask)
#   PACK_ROWS    the project's packed rows per forward to run, each its own arm run (default "4")
#   UPDATES      the project's updates per run (default 16: 2 passes of gpu-bench-batched's data)
# Writes under $OUT: peer.log, peak.json, table.md, tt-bs<B>.json, single-rows<K>.json, logs.tar.gz.
set -uo pipefail
exec > >(tee -a "$OUT/peer.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
ANCHOR=$PWD/.peer/torchtitan STUBS=$PWD/bench/peer_stubs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .peer/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
git log -1 --format='commit %H' 2>/dev/null || true
s=$SECONDS
mkdir -p /tmp/logs
python3 "$ANCHOR/mm.py" "$OUT/peak.json"
echo "peak: $((SECONDS - s)) s"; s=$SECONDS
for bs in ${TT_BATCHES:-16}; do
  (cd /tmp && PYTHONPATH=/tmp/site:$ANCHOR:$STUBS TT_BS=$bs TT_STEPS=30 TT_WARMUP=5 TT_OUT=$OUT/tt-bs$bs.json \
    timeout ${TT_TIMEOUT:-240} torchrun --standalone --nproc_per_node=1 "$ANCHOR/launch.py" --module tt_anchor \
    --config smollm2_1p7b ${TT_ARGS---training.disable_cuda_graphs}) > /tmp/logs/tt-bs$bs.log 2>&1
  grep -E "TT_RESULT|TT_SHIMS|Error|error" /tmp/logs/tt-bs$bs.log | tail -5
  echo "torchtitan local batch $bs: $((SECONDS - s)) s"; s=$SECONDS
done
python3 bench/make_arch_seed.py --tokenizer-from .peer/tok --out /tmp/arch >/dev/null && \
  python3 -m training seed --kind local --source /tmp/arch --out /tmp/seed-local >/dev/null && rm -rf /tmp/arch
echo "1.7B seed: $((SECONDS - s)) s"; s=$SECONDS
for k in ${PACK_ROWS:-4}; do
  timeout ${ARM_TIMEOUT:-300} python3 bench/arms_bench.py --profile gpu-bench-batched --model-dir /tmp/seed-local \
    --arms batched-learning:single --max-world 1 --pack-rows "$k" --updates ${UPDATES:-16} --label "rows $k" \
    --work /tmp/work-$k --out "$OUT/single-rows$k.json" > /tmp/logs/single-rows$k.log 2>&1
  grep -E "tokens/s|Error|error|FAILED" /tmp/logs/single-rows$k.log | tail -6
  rm -rf /tmp/work-$k
  echo "project, $k rows per forward: $((SECONDS - s)) s"; s=$SECONDS
done
python3 bench/peer_table.py --peak "$OUT/peak.json" --torchtitan "$OUT"/tt-bs*.json --project "$OUT"/single-rows*.json \
  --out "$OUT/table.md"
tar -czf "$OUT/logs.tar.gz" -C /tmp logs
ls -la "$OUT"
