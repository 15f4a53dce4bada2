#!/usr/bin/env bash
# One process driving every GPU of this machine: the (data, model) mesh spans all local
# devices (mesh.data=-1 takes what the config's mesh.model leaves).
#
#   launch/single_node.sh experiments/ss20m.py [--config.a.b=v ...]
#   launch/single_node.sh --dry-run experiments/ss20m.py     (or DRY_RUN=1)
#
# Environment: NUM_GPUS (default: the visible GPUs) and those in launch/common.sh.
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

visible_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    local ids
    IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  elif command -v nvidia-smi > /dev/null; then
    # grep -c exits 1 on no match, and nvidia-smi fails without a driver (a login node's
    # dry run): count 0 -> 1, never end the script here (set -e, pipefail)
    local n
    n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
    echo "$(( ${n:-0} > 0 ? n : 1 ))"
  else
    echo 1
  fi
}

GPU=${GPU:-$(detect_gpu)}
DTYPE=${DTYPE:-$(default_dtype "$GPU")}
NUM_GPUS=${NUM_GPUS:-$(visible_gpus)}
NAME=$(basename "${CONFIG%%:*}" .py)
WORKDIR=${WORKDIR:-workdir/${NAME}-$(date +%Y%m%d-%H%M%S)}

cmd=("$PYTHON" -m astra_jax.main --config="$CONFIG" --workdir="$WORKDIR"
     --config.mesh.data=-1 --config.mesh.distributed=off
     --config.encoder.dtype="$DTYPE" "$@")

echo "astra_jax on $NUM_GPUS x $GPU (one process), $DTYPE compute"
run_plan "$CONFIG" "$NUM_GPUS" --config.encoder.dtype="$DTYPE" "$@"
echo
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "dry run; would run:"
  show_command "${cmd[@]}"
  exit 0
fi
mkdir -p "$WORKDIR"
exec "${cmd[@]}"
