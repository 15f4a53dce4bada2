"""One optax chain for the whole model: Adam(W) for the encoder, SGD + weight decay for the
classifier, each with its own linear-warmup + cosine-decay schedule (paper appendix).

Parameters are a dict {"encoder": <nnx.State>, "classifier": (L, d) array}.
Weight decay on the classifier is added to its gradient (`add_decayed_weights` before SGD):
w <- w - lr * (g + wd * w) over all rows each step; with momentum beta the sum goes through
the momentum, m <- beta m + g + wd w, w <- w - lr m (torch's SGD with weight_decay). Done
densely that is O(L) per step; `classifier.py` (beta = 0) and `sparse_momentum.py` compute
exactly the same update touching only the sampled rows.
"""

from __future__ import annotations

import jax
import optax

from astra_jax.model import architectures


def schedule(peak: float, warmup_steps: int, total_steps: int, end_fraction: float = 0.0):
  warmup_steps = min(warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=peak,
    warmup_steps=warmup_steps,
    decay_steps=max(total_steps, warmup_steps + 1),
    end_value=peak * end_fraction,
  )


def warmup_steps(optim_cfg, total_steps: int) -> int:
  """The warmup of both schedules: optim.warmup_steps, but at most optim.warmup_max_fraction
  of the run, so that a small dataset's few steps still reach the peak rates.

  Args:
    optim_cfg: the config's `optim` section.
    total_steps: the run's optimizer steps.
  Returns:
    The number of warmup steps.
  """
  fraction = optim_cfg.get("warmup_max_fraction", 1.0)
  return min(optim_cfg.warmup_steps, round(fraction * total_steps))


def encoder_schedule(optim_cfg, total_steps: int):
  return schedule(optim_cfg.encoder_lr, warmup_steps(optim_cfg, total_steps), total_steps)


def encoder_optimizer(optim_cfg, total_steps: int) -> optax.GradientTransformation:
  enc_lr = encoder_schedule(optim_cfg, total_steps)
  # Decay on matrices only, as in BERT fine-tuning: not on biases or LayerNorm (1-d).
  # eps: 1e-8 unless the config sets it (configs written before the key had 1e-8).
  encoder = optax.adamw(
    enc_lr,
    b1=0.9,
    b2=0.999,
    eps=optim_cfg.get("encoder_adam_eps", 1e-8),
    weight_decay=optim_cfg.encoder_weight_decay,
    mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p),
  )
  if optim_cfg.grad_clip_norm > 0:
    encoder = optax.chain(optax.clip_by_global_norm(optim_cfg.grad_clip_norm), encoder)
  return encoder


def classifier_schedule(optim_cfg, total_steps: int):
  return schedule(optim_cfg.classifier_lr, warmup_steps(optim_cfg, total_steps), total_steps)


def make_optimizer(optim_cfg, total_steps: int) -> optax.GradientTransformation:
  """The dense chain over {"encoder", "classifier"} (used by `optim.classifier_update=dense`
  and as the reference the sparse update is tested against)."""
  encoder = encoder_optimizer(optim_cfg, total_steps)
  classifier = optax.chain(
    optax.add_decayed_weights(optim_cfg.classifier_weight_decay),
    optax.sgd(
      classifier_schedule(optim_cfg, total_steps), momentum=optim_cfg.classifier_momentum or None
    ),
  )

  def labels(params):
    return {
      "encoder": jax.tree.map(lambda _: "encoder", params["encoder"]),
      "classifier": "classifier",
    }

  return optax.multi_transform({"encoder": encoder, "classifier": classifier}, labels)


def learning_rates(optim_cfg, total_steps: int, step: int) -> tuple[float, float]:
  return (
    float(encoder_schedule(optim_cfg, total_steps)(step)),
    float(classifier_schedule(optim_cfg, total_steps)(step)),
  )


def loss_scaling(config) -> str:
  """off | static | dynamic, from optim.loss_scale and encoder.dtype (see loss_scale.py)."""
  if config.optim.loss_scale > 0:
    return "static"
  return "dynamic" if config.encoder.dtype == "float16" else "off"


def initial_loss_scale(config) -> float:
  mode = loss_scaling(config)
  return {"static": config.optim.loss_scale, "dynamic": 2.0**15, "off": 1.0}[mode]


def table_by_rows(config) -> tuple[str, ...]:
  """The path of the encoder's lookup table when `optim.encoder_table_update=rows` updates
  it by the rows a step reads (training/table_rows.py); () when it is updated densely."""
  if config.optim.get("encoder_table_update", "dense") != "rows":
    return ()
  return architectures.get(config.encoder.arch).lookup_table
