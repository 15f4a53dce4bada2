#!/usr/bin/env bash
# The encoders on a real dataset in one lease of a GPU machine:
#   bash benchmarks/real_data_gpu.sh DATA_DIR WORKDIR OUT_DIR [JOBS]
# `reproduce --table=encoders_real`: the validation stage's runs side by side (JOBS at once,
# default 6), the choice, then the test stage's three runs. Finished runs in WORKDIR are
# reused, so a second lease continues where one stopped. The runs share one persistent
# compilation cache (WORKDIR/xla_cache): the MiniLM variants compile the same programs,
# and compiling them once per run, with many runs compiling at once on the host's cores,
# was most of a lease's time (docs/results/real_data_gpu.md). The tables go to OUT_DIR,
# and OUT_DIR/runs.tgz holds every run's results.json and logs (not the exported models).
set -u
data=${1:?usage: real_data_gpu.sh DATA_DIR WORKDIR OUT_DIR [JOBS]}
root=${2:?usage: real_data_gpu.sh DATA_DIR WORKDIR OUT_DIR [JOBS]}
out=${3:?usage: real_data_gpu.sh DATA_DIR WORKDIR OUT_DIR [JOBS]}
jobs=${4:-6}
mkdir -p "$out"
PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
export PYTHONPATH PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$root/xla_cache}
py=${PYTHON:-python3}
nvidia-smi -L 2>/dev/null
$py -c "import jax; print('jax', jax.__version__, jax.devices())"
$py -m astra_jax.reproduce --table=encoders_real --data="$data" --workdir="$root" \
  --out="$out" --jobs="$jobs"
code=$?
(cd "$root" && find . \( -name results.json -o -name "*.log" -o -name metrics.jsonl \) -print0 \
  | tar czf "$out/runs.tgz" --null -T -)
exit $code
