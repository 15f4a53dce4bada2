# shellcheck shell=bash
# Shared by launch/slurm.sbatch and launch/single_node.sh (sourced, not run).
#
# Environment (all optional):
#   PYTHON    the interpreter with astra_jax installed      (default: .venv/bin/python)
#   GPU       v100-32gb | a100-80gb | h100-80gb              (default: from nvidia-smi)
#   DTYPE     float32 | bfloat16 | float16 encoder compute   (default: per GPU, see below)
#   WORKDIR   results directory                            (default: workdir/<config>-<id>)
#   DRY_RUN   1: print the commands and the memory plan, run nothing

PYTHON=${PYTHON:-.venv/bin/python}
# The planner assumes XLA may use 90% of a GPU; JAX's own default is 75%.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}

# GPU kind from the first GPU's name (v100-32gb when there is none, e.g. a dry run on a
# login node).
detect_gpu() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
  case "$name" in
    *A100*) echo a100-80gb ;;
    *H100* | *H200*) echo h100-80gb ;;  # H200 planned as 80 GB: conservative
    *) echo v100-32gb ;;
  esac
}

# V100 has no bf16: fp16 with dynamic loss scaling (optim.loss_scale=0) is what the paper's
# PyTorch code ran; DTYPE=float32 is the safe alternative. A100/H100: bf16.
default_dtype() {
  case "$1" in
    v100-*) echo float16 ;;
    *) echo bfloat16 ;;
  esac
}

# Prints a command with shell quoting, one argument per word.
show_command() {
  printf '  '
  printf '%q ' "$@"
  printf '\n'
}

# The planner sees only the --config.* overrides among the user's arguments.
config_overrides() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      --config.*) printf '%s\0' "$arg" ;;
    esac
  done
}

# run_plan CONFIG NUM_GPUS [main's arguments...]: the memory check, before anything runs.
run_plan() {
  local config=$1 num_gpus=$2
  shift 2
  local overrides=()
  while IFS= read -r -d '' arg; do
    overrides+=("$arg")
  done < <(config_overrides "$@")
  "$PYTHON" -m astra_jax.plan --config="$config" --gpu="$GPU" --num_gpus="$num_gpus" \
    "${overrides[@]}"
}
