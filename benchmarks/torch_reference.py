r"""The PyTorch + HuggingFace reference for benchmarks/train_step.py's `encoder` part.

  python benchmarks/torch_reference.py --out=FILE.jsonl [--dtype=float32|bfloat16|float16]

Needs torch and transformers (not dependencies of astra_jax: install them beside it to
compare). The same step as train_step.py's encoder part, as the paper's implementation runs
it: `transformers.BertModel` of the all-MiniLM-L6-v2 shape (random weights, train mode, so
dropout 0.1 as in the JAX step), mean pooling over the attention mask, a fixed cotangent on
the pooled embedding, backward, torch.optim.AdamW. bfloat16/float16 run under autocast
(float16 with a GradScaler), as mixed precision is used in PyTorch. Writes one JSON line per
part (matmul, torch_encoder) with train_step.py's keys and FLOP formula.
"""

from __future__ import annotations

import statistics
import time

import jsonl  # benchmarks/jsonl.py
from absl import app, flags

from astra_jax.model.encoder_config import EncoderConfig  # jax-free

flags.DEFINE_string("dtype", "float32", "float32 | bfloat16 | float16 (autocast)")
flags.DEFINE_bool("tf32", False, "allow TF32 for fp32 matmuls on CUDA (PyTorch's default: no)")
flags.DEFINE_integer("batch_size", 256, "queries per step")
flags.DEFINE_integer("seq_len", 32, "tokens per query")
flags.DEFINE_integer("num_layers", 6, "encoder layers")
flags.DEFINE_integer("matmul_n", 2048, "matmul size")
flags.DEFINE_integer("steps", 10, "timed steps")
flags.DEFINE_string("out", None, "append JSON lines here")
F = flags.FLAGS


def main(_):
  import numpy as np
  import torch
  import transformers

  dev = "cuda" if torch.cuda.is_available() else "cpu"
  torch.backends.cuda.matmul.allow_tf32 = F.tf32
  torch.backends.cudnn.allow_tf32 = F.tf32
  dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[F.dtype]

  def sync():
    if dev == "cuda":
      torch.cuda.synchronize()

  def median_ms(fn, steps):
    times = []
    for i in range(steps + 2):
      t0 = time.perf_counter()
      fn()
      sync()
      if i >= 2:
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)

  n = F.matmul_n
  a = torch.randn(n, n, device=dev, dtype=dtype if dev == "cuda" else torch.float32)
  b = torch.randn_like(a)
  mm_ms = median_ms(lambda: a @ b, max(F.steps, 10))
  mm_rate = 2 * n**3 / 1e9 / mm_ms * 1e3

  cfg = transformers.BertConfig(
    vocab_size=30522,
    hidden_size=384,
    num_hidden_layers=F.num_layers,
    num_attention_heads=12,
    intermediate_size=1536,
    hidden_act="gelu",
    max_position_embeddings=512,
  )
  model = transformers.BertModel(cfg, add_pooling_layer=False).to(dev).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  scaler = torch.amp.GradScaler(dev, enabled=F.dtype == "float16")
  rng = np.random.default_rng(0)
  bsz, t = F.batch_size, F.seq_len
  ids = rng.integers(1000, 30522, (bsz, t))
  lengths = rng.integers(t // 4, t + 1, bsz)
  ids[np.arange(t)[None, :] >= lengths[:, None]] = 0
  ids = torch.as_tensor(ids, device=dev)
  mask = (ids != 0).long()
  cot = torch.full((bsz, 384), 1.0 / bsz, device=dev)

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=dtype, enabled=F.dtype != "float32"):
      states = model(input_ids=ids, attention_mask=mask).last_hidden_state
      m = mask[..., None].float()
      pooled = (states.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)
      loss = (pooled * cot).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()

  enc_ms = median_ms(step, F.steps)
  layers = F.num_layers
  gflop = EncoderConfig(num_layers=layers).train_step_gflop(bsz, t)  # train_step.py's count
  name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
  base = {
    "device": name,
    "platform": dev,
    "dtype": F.dtype,
    "batch_size": bsz,
    "seq_len": t,
    "num_layers": layers,
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "threads": torch.get_num_threads(),
    "tf32": F.tf32,
  }
  rows = [
    {"part": "matmul", "step_ms": mm_ms, "model_gflop": 2 * n**3 / 1e9, "gflops": mm_rate},
    {
      "part": "torch_encoder",
      "step_ms": enc_ms,
      "model_gflop": gflop,
      "gflops": gflop / enc_ms * 1e3,
    },
  ]
  for row in rows:
    row["share_of_matmul"] = row["gflops"] / mm_rate
    row.update(base)
    jsonl.emit(row, F.out, digits=4)


if __name__ == "__main__":
  app.run(main)
