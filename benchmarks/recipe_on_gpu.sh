#!/usr/bin/env bash
# The Multi30k recipe's settings through `keras-transformer train`: wall time
# from the command's start to its saved translator, then test2016 scored once
# (the saved translator: averaged checkpoints, beam 4). Issue 45's target on
# one GPU: at least 40 BLEU in at most 120 s.
#
#   bash benchmarks/recipe_on_gpu.sh DATA_DIR STEPS LIMIT_S NAME:OPTIONS...
#   KERAS_BACKEND=jax bash benchmarks/recipe_on_gpu.sh multi30k 6000 170 b4_cold:--buckets,4 b4_warm:--buckets,4
#
# DATA_DIR holds Multi30k's train, val and test2016 .en/.de. Each NAME:OPTIONS
# is one run: OPTIONS are more `train` options, commas for spaces. Runs whose
# names share the part before "_" share a JAX compilation cache
# (XDG_CACHE_HOME=runs/recipe_on_gpu/cache_<part>), so "b4_cold" then
# "b4_warm" times a first run and a repeated one. A run stopped at LIMIT_S
# seconds is reported and not scored. With TUNE_ALPHAS="0.6 1.0 ...", each
# finished run's alpha is then chosen on val (`tune --save`, timed apart)
# before test2016 is scored. Logs and hypotheses go to $OUT if set, else
# runs/recipe_on_gpu.
set -u
if [ $# -lt 4 ]; then sed -n 2,18p "$0"; exit 2; fi
data=$1; steps=$2; limit=$3; shift 3
root=runs/recipe_on_gpu; out=${OUT:-${root}}; mkdir -p "${root}" "${out}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
python3 - "${data}" "${root}/recipe.json" <<'PY' || exit 1
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("recipe", "recipes/multi30k_en_de.py")
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)
config = recipe.configuration(recipe.parse_args(["--data-dir", sys.argv[1]])).to_dict()
del config["model_dir"]
json.dump(config, open(sys.argv[2], "w"), indent=1)
import keras, keras_transformer  # noqa: E401,F401
print("Keras", keras.__version__, "backend", keras.backend.backend())
PY
for run in "$@"; do
  name=${run%%:*}; options=${run#*:}; options=${options//,/ }
  rm -rf "${root:?}/${name}"
  begin=$(date +%s%N)
  XDG_CACHE_HOME=${root}/cache_${name%%_*} timeout "${limit}" python3 -m keras_transformer train \
    --config "${root}/recipe.json" --model-dir "${root}/${name}" --train-steps "${steps}" --log-every 500 ${options} \
    >"${out}/${name}.log" 2>&1
  status=$?
  echo "== ${name} (${options:-as the recipe}): exit ${status} after $(( ($(date +%s%N) - begin) / 1000000 )) ms"
  grep -E "^batches:|^step (500|3000|${steps})/|at step (3000|${steps}) |saved the translator|rror" "${out}/${name}.log" | cut -c1-220
  if [ ${status} = 0 ] && [ -n "${TUNE_ALPHAS:-}" ]; then
    begin=$(date +%s%N)
    python3 -m keras_transformer tune --model-dir "${root}/${name}" --source "${data}/val.en" \
      --reference "${data}/val.de" --alphas ${TUNE_ALPHAS} --save 2>&1 | grep -E "^beam|^best|rror" | cut -c1-160
    echo "   val tuning in $(( ($(date +%s%N) - begin) / 1000000 )) ms"
  fi
  if [ ${status} = 0 ]; then
    begin=$(date +%s%N)
    python3 -m keras_transformer evaluate --model-dir "${root}/${name}" --source "${data}/test2016.en" \
      --reference "${data}/test2016.de" --output "${out}/${name}.test2016.hyp" 2>&1 | grep -E "BLEU|chrF|sentences|rror" | cut -c1-160
    echo "   test2016 scored in $(( ($(date +%s%N) - begin) / 1000000 )) ms"
  fi
done
