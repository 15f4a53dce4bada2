# shellcheck shell=bash
# Shared by launch/slurm.sbatch and launch/single_node.sh (sourced, not run).
#
# Environment (all optional):
#   PYTHON    the interpreter with astra_jax installed      (default: .venv/bin/python)
#   GPU       v100-32gb | v100-16gb | a100-40gb | a100-80gb | h100-80gb | h200-141gb
#             (default: from nvidia-smi's name and memory of the first GPU)
#   DTYPE     float32 | bfloat16 | float16 encoder compute   (default: per GPU, see below)
#   WORKDIR   results directory       (default: workdir/<config>-<run name>, stable across
#             resubmits: see each script)
#   DRY_RUN   1: print the commands and the memory plan, run nothing
#   PLAN_CHECK 0: launch even when the planner says the run does not fit (default 1: stop)
#   KEEP_LD_LIBRARY_PATH 1: keep CUDA directories in LD_LIBRARY_PATH (default: removed)

PYTHON=${PYTHON:-.venv/bin/python}
# The planner assumes XLA may use 90% of a GPU; JAX's own default is 75%.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}

# GPU kind from the first GPU's name and memory. Without a GPU (a dry run on a login node)
# it plans for v100-32gb and says so on stderr: set GPU= to the compute nodes' kind.
detect_gpu() {
  local line name mib
  line=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null |
         head -n 1 || true)
  name=${line%,*}
  mib=${line##*,}
  mib=${mib// /}
  case "$name" in
    *V100*) if [[ ${mib:-0} -lt 20000 ]]; then echo v100-16gb; else echo v100-32gb; fi ;;
    *A100*) if [[ ${mib:-0} -lt 60000 ]]; then echo a100-40gb; else echo a100-80gb; fi ;;
    *H200*) echo h200-141gb ;;
    *H100*) echo h100-80gb ;;
    *)
      echo "no GPU this script knows (nvidia-smi: '${line:-none}'): planning for v100-32gb;" \
           "set GPU=v100-32gb|v100-16gb|a100-40gb|a100-80gb|h100-80gb|h200-141gb" >&2
      echo v100-32gb ;;
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

# jax[cuda12] brings its CUDA libraries as pip wheels (nvidia-*-cu12) and finds them itself.
# `module load cuda` puts the system's CUDA, cuDNN or NCCL directories in LD_LIBRARY_PATH,
# which the loader then prefers: another cuDNN/NCCL version than jax was built against
# (errors at the first convolution or collective) or a CUDA plugin that fails to load, after
# which jax runs on the CPU with a warning. Entries naming cuda, cudnn or nccl are removed
# (KEEP_LD_LIBRARY_PATH=1 keeps them: a jax built against the site's CUDA).
sanitize_library_path() {
  [[ "${KEEP_LD_LIBRARY_PATH:-0}" == "1" || -z "${LD_LIBRARY_PATH:-}" ]] && return 0
  local kept=() removed=() dirs=() dir
  IFS=: read -r -a dirs <<< "$LD_LIBRARY_PATH"
  for dir in "${dirs[@]}"; do
    case "${dir,,}" in
      *cuda*|*cudnn*|*nccl*) removed+=("$dir") ;;
      "") ;;
      *) kept+=("$dir") ;;
    esac
  done
  if [[ ${#removed[@]} -gt 0 ]]; then
    echo "LD_LIBRARY_PATH: removed ${removed[*]} (the pip CUDA wheels are used;" \
         "KEEP_LD_LIBRARY_PATH=1 keeps them)"
    if [[ ${#kept[@]} -eq 0 ]]; then
      unset LD_LIBRARY_PATH  # empty, it would name the current directory
    else
      local IFS=:
      export LD_LIBRARY_PATH="${kept[*]}"
    fi
  fi
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
# PLAN_GPUS_PER_NODE / PLAN_PROCESSES_PER_NODE (set by the launcher): the node layout its
# host-memory and disk lines are for (0: the planner's defaults).
run_plan() {
  local config=$1 num_gpus=$2
  shift 2
  local overrides=()
  while IFS= read -r -d '' arg; do
    overrides+=("$arg")
  done < <(config_overrides "$@")
  local rc=0
  "$PYTHON" -m astra_jax.plan --config="$config" --gpu="$GPU" --num_gpus="$num_gpus" \
    --gpus_per_node="${PLAN_GPUS_PER_NODE:-0}" \
    --processes_per_node="${PLAN_PROCESSES_PER_NODE:-0}" --check "${overrides[@]}" || rc=$?
  if [[ $rc -eq 3 ]]; then
    if [[ "${PLAN_CHECK:-1}" == "0" ]]; then
      echo "PLAN_CHECK=0: launching although the planner says it does not fit" >&2
    elif [[ "${DRY_RUN:-0}" == "1" ]]; then
      echo "a real launch would stop here (the planner: does not fit; PLAN_CHECK=0 overrides)"
    else
      echo "stopping: the planner says the run does not fit (see its suggestions above;" \
           "PLAN_CHECK=0 launches anyway)" >&2
      exit 3
    fi
  elif [[ $rc -ne 0 ]]; then
    exit "$rc"
  fi
}
