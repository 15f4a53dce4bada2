#!/usr/bin/env bash
# The GPU measurements in one go (one lease of a GPU machine), and the host time per batch
# with 1-8 input threads:
#   bash benchmarks/gpu_suite.sh OUT_DIR
# train_step.py in fp32 / bf16 / fp16, the PyTorch + HF reference in the same dtypes (when
# torch and transformers are installed), step_vs_labels.py, the momentum step against the
# plain one, and one refresh by each backend (ScaNN on the host, exact on the GPU; the
# device alone at 10^7 labels, where the planner's device rate is an assumption). Each
# writes JSON lines into OUT_DIR; a failing part is reported and the rest still run.
set -u
out=${1:?usage: gpu_suite.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
run() { echo "== $*"; "$@" || echo "FAILED ($?): $*"; }
nvidia-smi -L 2>/dev/null
$py -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
steps=${STEPS:-30}
for dtype in float32 bfloat16 float16; do
  run $py benchmarks/train_step.py --dtype=$dtype --steps=$steps --matmul_n=8192 \
    --out="$out/train_step.jsonl" 2>&1 | grep -v "^[IW][0-9]"
done
if $py -c "import torch, transformers" 2>/dev/null; then
  for dtype in float32 bfloat16 float16; do
    run $py benchmarks/torch_reference.py --dtype=$dtype --steps=$steps --matmul_n=8192 \
      --out="$out/torch_reference.jsonl"
  done
  run $py benchmarks/torch_reference.py --dtype=float32 --tf32 --steps=$steps --matmul_n=8192 \
    --out="$out/torch_reference.jsonl"
fi
run $py benchmarks/step_vs_labels.py --steps=50 --out="$out/step_vs_labels.jsonl" 2>&1 | grep -v "^[IW][0-9]"
# the host side: can the input threads of a GPU host keep up with its step?
run $py benchmarks/input_pipeline.py --threads=1,2,4,8 --out="$out/input_pipeline.jsonl" 2>&1 | grep -v "^[IW][0-9]"
# the classifier's momentum step against the plain one, and the refresh's two backends
run $py benchmarks/momentum_step.py --num_labels=1e4,1e6,1e7 --steps=40 \
  --out="$out/momentum_step.jsonl" 2>&1 | grep -v "^[IW][0-9]"
run $py benchmarks/refresh_backends.py --num_labels=1e6 --num_queries=100000 \
  --out="$out/refresh_backends.jsonl" 2>&1 | grep -v "^[IW][0-9]"
run $py benchmarks/refresh_backends.py --num_labels=1e7 --num_queries=100000 --backends=device \
  --out="$out/refresh_backends.jsonl" 2>&1 | grep -v "^[IW][0-9]"
