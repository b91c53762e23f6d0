#!/usr/bin/env bash
# Issue 45's GPU figures in one device call, at most 590 s:
# torch decoding against transformers, torch training against
# torch.nn.Transformer, JAX training's share of the matmul peak on
# Multi30k's lengths, and the Multi30k recipe through `train` (cold cache,
# then test2016 scored once). Each part has its own time limit, so that a
# part that hangs costs only its share.
#
#   bash benchmarks/gpu_issue45.sh DATA_DIR
#
# DATA_DIR holds Multi30k's train, val and test2016 .en/.de. JSON reports and
# logs go to $OUT if set, else runs/gpu_issue45. TUNE_ALPHAS (default
# "1.4 1.8") are the recipe's length penalties tried on val. Needs Keras,
# keras-hub and transformers importable (the peers); it runs anywhere, but
# its figures mean something on a GPU only.
set -u
if [ $# -ne 1 ]; then sed -n 2,15p "$0"; exit 2; fi
data=$(cd "$1" && pwd) || exit 2
out=$(mkdir -p "${OUT:-runs/gpu_issue45}" && cd "${OUT:-runs/gpu_issue45}" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
part() {  # part NAME LIMIT_S COMMAND...: runs COMMAND, logs it, reports its time
  local name=$1 limit=$2 begin=$(date +%s)
  shift 2
  timeout "${limit}" "$@" >"${out}/${name}.log" 2>&1
  echo "== ${name}: exit $? after $(( $(date +%s) - begin )) s"
  grep -E "x |tokens/s|MFU|mfu|ms a step|speed|error" "${out}/${name}.log" | tail -12 | cut -c1-200
}
cd benchmarks || exit 2
part torch_decoding 110 env KERAS_BACKEND=torch python3 gpu_decoding.py --rounds 3 --json "${out}/torch_decoding.json"
part torch_training 110 env KERAS_BACKEND=torch python3 training_speed.py --size base --precision mixed_bfloat16 \
  --batch-size 768 --contenders torch --profile --out "${out}/torch_training.json"
part jax_mfu 120 env KERAS_BACKEND=jax python3 training_speed.py --size base --precision mixed_bfloat16 \
  --corpus "${data}/train.en" "${data}/train.de" --tokens-per-batch 25000 --buckets 2 --steps 8 --rounds 2 \
  --contenders ours_steps_per_execution --profile --out "${out}/jax_mfu.json"
sed -n "/XLA's operations by part/,/^$/p" "${out}/jax_mfu.log" | tail -13  # train's 8 steps a call, by part
cd .. || exit 2
# The recipe's settings as issue 45 times them; alpha chosen on val apart.
OUT="${out}" TUNE_ALPHAS="${TUNE_ALPHAS-1.4 1.8}" KERAS_BACKEND=jax \
  timeout 250 bash benchmarks/recipe_on_gpu.sh "${data}" 6000 130 b4nv_cold:--buckets,4,--valid-bleu-sentences,0
