#!/usr/bin/env bash
# One process driving every GPU of this machine: the (data, model) mesh spans all local
# devices (mesh.data=-1 takes what the config's mesh.model leaves).
#
#   launch/single_node.sh experiments/ss20m.py [--config.a.b=v ...]
#   launch/single_node.sh --dry-run experiments/ss20m.py     (or DRY_RUN=1)
#
# Environment: NUM_GPUS (default: the visible GPUs), RUN_NAME (the workdir is
# workdir/<config>[-RUN_NAME]: the same command resumes the same run) and those in
# launch/common.sh.
set -euo pipefail

if [[ "${1:-}" == "--dry-run" ]]; then
  DRY_RUN=1
  shift
fi
CONFIG=${1:?usage: launch/single_node.sh [--dry-run] experiments/<name>.py [--config.a.b=v ...]}
shift

cd "$(dirname "$0")/.."
# shellcheck source=launch/common.sh
source launch/common.sh

# The GPUs this process may use: CUDA_VISIBLE_DEVICES if set (SLURM sets it to the job's),
# else nvidia-smi's count; 0 without a working GPU (a login node's dry run).
visible_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    local ids
    IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  elif command -v nvidia-smi > /dev/null; then
    # grep -c exits 1 on no match, and nvidia-smi fails without a driver: never end the
    # script here (set -e, pipefail)
    local n
    n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
    echo "${n:-0}"
  else
    echo 0
  fi
}

GPU=${GPU:-$(detect_gpu)}
DTYPE=${DTYPE:-$(default_dtype "$GPU")}
VISIBLE=$(visible_gpus)
NUM_GPUS=${NUM_GPUS:-$(( VISIBLE > 0 ? VISIBLE : 1 ))}
if [[ $VISIBLE -gt 0 && $NUM_GPUS -gt $VISIBLE ]]; then
  echo "error: NUM_GPUS=$NUM_GPUS but this process sees $VISIBLE GPU(s)" \
       "(CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}); inside SLURM, allocate with" \
       "--gpus-per-node, not --gpus-per-task=1" >&2
  exit 2
fi
if [[ $VISIBLE -gt 0 ]]; then
  # main.py stops with one line if jax finds fewer (a CPU-only jax, shadowed CUDA libraries)
  export ASTRA_EXPECT_GPUS=$NUM_GPUS
fi
sanitize_library_path
NAME=$(basename "${CONFIG%%:*}" .py)
WORKDIR=${WORKDIR:-workdir/${NAME}${RUN_NAME:+-$RUN_NAME}}

cmd=("$PYTHON" -m astra_jax.main --config="$CONFIG" --workdir="$WORKDIR"
     --config.mesh.data=-1 --config.mesh.distributed=off
     --config.encoder.dtype="$DTYPE" "$@")

echo "astra_jax on $NUM_GPUS x $GPU (one process), $DTYPE compute"
PLAN_PROCESSES_PER_NODE=1 run_plan "$CONFIG" "$NUM_GPUS" --config.encoder.dtype="$DTYPE" "$@"
echo
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "environment: ASTRA_EXPECT_GPUS=${ASTRA_EXPECT_GPUS:-unset}" \
       "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "dry run; would run:"
  show_command "${cmd[@]}"
  exit 0
fi
mkdir -p "$WORKDIR"
exec "${cmd[@]}"
