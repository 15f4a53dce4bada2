"""W's starting point: small Gaussian rows, or each label's text embedding E(z_l).

With `classifier.init=label_text` row l starts as `init_scale * E(z_l) / |E(z_l)|`, the
encoder's (evaluation-mode) embedding of the label's text, as NGAME's and DEXA's classifier
stage does. A label with one or no training point then scores queries by their similarity
to its text from the first step, instead of by a random vector that the few gradient steps
it ever receives cannot move far (on tail-heavy data most rows of W are such labels).
Rows past the L real labels (padding to the mesh's model axis) stay zero: they are never
sampled or predicted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import ml_collections
import numpy as np

from astra_jax.runtime.errors import InputError

if TYPE_CHECKING:  # config validation imports this module, and the planner runs without jax
  import jax

INITS = ("normal", "label_text")
_EMBED_CHUNK = 1 << 18  # label texts embedded at a time (64 MB of rows at d = 64)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises InputError for an unknown init or a non-positive scale."""
  cc = config.classifier
  if cc.init not in INITS:
    raise InputError(f"config.classifier.init: unknown {cc.init!r}; use {' or '.join(INITS)}")
  if cc.init == "label_text" and not cc.init_scale > 0:
    raise InputError(f"config.classifier.init_scale: must be > 0, got {cc.init_scale}")


def label_text_rows(
  embed_rows: Callable[[np.ndarray], np.ndarray], label_tokens: np.ndarray, scale: float
) -> np.ndarray:
  """(L, d) rows `scale * E(z_l) / |E(z_l)|`.

  Args:
    embed_rows: token matrix (n, T) -> its evaluation-mode embeddings (n, d).
    label_tokens: (L, T) the label texts' tokens.
    scale: the rows' norm.
  Returns:
    float32 (L, d).
  """
  emb = np.asarray(embed_rows(np.asarray(label_tokens)), np.float32)
  norms = np.linalg.norm(emb, axis=1, keepdims=True)
  return (scale * emb / np.maximum(norms, 1e-12)).astype(np.float32)


def initial_classifier(
  config: ml_collections.ConfigDict,
  rows: int,
  dim: int,
  seed: int,
  label_tokens: np.ndarray | None,
  embed_rows: Callable[[np.ndarray], np.ndarray],
  sharding: jax.sharding.Sharding | None = None,
  skip: np.ndarray | None = None,
) -> jax.Array:
  """W (rows, d) at step 0, as `config.classifier.init` says, born where it lives: with a
  `sharding`, each device computes only its own rows (W is never whole on one device).

  Args:
    config: the run's config (classifier.init / init_scale, train.classifier_init_std).
    rows: W's rows (L padded to the model axis).
    dim: the embedding size d.
    seed: the run's seed (the Gaussian init draws from seed + 1, as it always has).
    label_tokens: (L, T) label-text tokens, or None when the dataset has none.
    embed_rows: the current encoder as a function of a token matrix (label_text only).
    sharding: W's layout (rows split over 'model'); None: the default device.
    skip: (L,) bool, labels whose rows the caller sets afterwards (a run continued from an
      exported model): label_text leaves them zero instead of embedding their texts.
  Returns:
    float32 (rows, d). The Gaussian rows are the same for every layout (jax's partitionable
    threefry draws each shard's numbers where it lives).
  """
  import jax  # noqa: PLC0415  (see the TYPE_CHECKING import above)
  import jax.numpy as jnp  # noqa: PLC0415

  cc = config.classifier
  if cc.init == "normal":
    draw = jax.jit(
      lambda key: jax.random.normal(key, (rows, dim), jnp.float32), out_shardings=sharding
    )
    # Scaled outside the draw (still shard by shard): inside, XLA fuses the product into the
    # sampler and the rows move by an ulp from the unsharded draw's.
    return config.train.classifier_init_std * draw(jax.random.key(seed + 1))
  if label_tokens is None:
    raise InputError(
      f"config.classifier.init=label_text needs label texts, but "
      f"{config.data.dir} has none; use classifier.init=normal"
    )
  num_labels = len(label_tokens)

  def shard(index) -> np.ndarray:
    """The rows of one shard: its labels' text embeddings, padded rows zero."""
    lo, hi = index[0].start or 0, rows if index[0].stop is None else index[0].stop
    w = np.zeros((hi - lo, dim), np.float32)
    # In chunks: at 10^7 labels the embeddings of a whole shard, their normalised copy and
    # the shard itself would be three W-sized arrays at once.
    todo = np.arange(lo, min(hi, num_labels))
    if skip is not None:
      todo = todo[~skip[todo]]
    for a in range(0, len(todo), _EMBED_CHUNK):
      ids = todo[a : a + _EMBED_CHUNK]
      w[ids - lo] = label_text_rows(embed_rows, label_tokens[ids], cc.init_scale)
    return w[:, index[1]]

  if sharding is None:
    return jnp.asarray(shard((slice(0, rows), slice(None))))
  # Each distinct shard computed once and put on every device that holds a replica of it
  # (make_array_from_callback would embed a shard's texts once per data replica).
  holders: dict[tuple, list] = {}
  for device, index in sharding.addressable_devices_indices_map((rows, dim)).items():
    holders.setdefault((index[0].start, index[0].stop), []).append((device, index))
  pieces = []
  for placed in holders.values():
    host = shard(placed[0][1])
    pieces += [jax.device_put(host, device) for device, _ in placed]
  return jax.make_array_from_single_device_arrays((rows, dim), sharding, pieces)
