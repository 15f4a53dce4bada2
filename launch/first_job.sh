#!/usr/bin/env bash
# The first cluster run, in three steps; launch/first_job.md says what to look for in each.
#
#   launch/first_job.sh 1    one GPU, float16, ~500 steps with a hard-negative refresh: run
#                            it on a GPU node (srun --gpus=1 --pty bash, or a workstation)
#   launch/first_job.sh 2    sbatch: one node, all its GPUs, one process per GPU
#   launch/first_job.sh 3    sbatch: two nodes
#
# Environment: DRY_RUN=1 prints the command only; GPUS_PER_NODE (default 8) for steps 2-3;
# PYTHON as in launch/common.sh. Extra arguments go to astra_jax.main.
set -euo pipefail

STEP=${1:?usage: launch/first_job.sh 1|2|3 [--config.a.b=v ...]}
shift
cd "$(dirname "$0")/.."
# shellcheck source=launch/common.sh
source launch/common.sh

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
case "$STEP" in
  1)
    # One GPU even on a node with several; main.py stops with one line if jax sees no GPU.
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} ASTRA_EXPECT_GPUS=1
    sanitize_library_path
    cmd=("$PYTHON" -m astra_jax.main --config=experiments/demo.py
         --workdir=workdir/first_job_step1 --config.encoder.dtype=float16
         --config.train.epochs=3 --config.negatives.tau_s=2 --config.negatives.tau_r=1 "$@")
    ;;
  2|3)
    nodes=$((STEP - 1))
    # NCCL_DEBUG=INFO: NCCL prints which transport each pair of GPUs uses (first_job.md).
    export NCCL_DEBUG=${NCCL_DEBUG:-INFO}
    cmd=(sbatch --job-name="first_job_step$STEP" --nodes="$nodes"
         --ntasks-per-node="$GPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE"
         --time=00:30:00 launch/slurm.sbatch experiments/ss20m.py:synthetic
         --config.train.epochs=4 "$@")
    ;;
  *)
    echo "error: step $STEP: use 1, 2 or 3 (launch/first_job.md)" >&2
    exit 2 ;;
esac

echo "first job, step $STEP:"
show_command "${cmd[@]}"
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  exit 0
fi
exec "${cmd[@]}"
