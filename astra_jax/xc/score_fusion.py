"""The model's score with the label texts' similarity added (NGAME's and DEXA's inference).

With `scoring.label_text_weight` = beta > 0 a query x ranks label l by

    (1 - beta) sigmoid(<w_l, E(x)>) + beta sigmoid(s (cos(E(x), E(z_l)) - theta)),

the classifier's probability mixed with the similarity of x to the label's own text z_l
under the same encoder (s = `scoring.label_text_scale`, theta =
`scoring.label_text_shift`, the cosine at which the term is one half). On tail-heavy data
most rows of W have seen one or two positives, while E(z_l) exists for every label with a
text, the more so after the siamese warm start (`warmstart.py`) has placed queries near
their labels' texts: the second term ranks the tail where W is weakest. Both terms are
probabilities, so the mix needs no calibration beyond beta, s and theta, chosen on a
validation split (docs/real_data.md). With theta = 0 every label whose text points the
query's way gets at least beta / 2, which ranks many tail labels above head labels that W
holds; a larger shift keeps the term for texts close to the query
(training/score_choice.py chooses it).

Scoring runs through the exact blocked kernels over rows [w_l | E(z_l)/|E(z_l)|] (L, 2d)
and queries [E(x) | E(x)/|E(x)|] (n, 2d): exact over all L, in bounded memory; training's
evaluations on W's shards (sharded_topk.py), the Predictor on W in one piece (serving/predictor.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from astra_jax.runtime.errors import InputError


def unit_rows(x: np.ndarray) -> np.ndarray:
  """Each row of `x` over its norm (float32; an all-zero row stays zero)."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclasses.dataclass(frozen=True)
class LabelTextFusion:
  """The fused score; hashable, so `exact_topk.topk` compiles it into its kernel.

  Attributes:
    text_weight: beta, the label-text term's weight in [0, 1].
    text_scale: s, the inverse temperature of the cosine similarity.
    dim: d, the embedding width (the rows carry 2d columns).
    text_shift: theta, the cosine at which the label-text term is one half.
  """

  text_weight: float
  text_scale: float
  dim: int
  text_shift: float = 0.0

  def query_rows(self, embeddings: np.ndarray) -> np.ndarray:
    """(n, 2d) [E(x) | E(x)/|E(x)|]."""
    e = np.asarray(embeddings, np.float32)
    return np.concatenate([e, unit_rows(e)], axis=1)

  def device_query_rows(self, embeddings: jax.Array) -> jax.Array:
    """`query_rows` inside a compiled function."""
    norms = jnp.linalg.norm(embeddings, axis=1, keepdims=True)
    return jnp.concatenate([embeddings, embeddings / jnp.maximum(norms, 1e-12)], axis=1)

  def label_rows(self, classifier: np.ndarray, label_text_embeddings: np.ndarray) -> np.ndarray:
    """(L, 2d) [w_l | E(z_l)/|E(z_l)|]."""
    return np.concatenate(
      [np.asarray(classifier, np.float32), unit_rows(label_text_embeddings)], axis=1
    )

  def __call__(self, queries: jax.Array, rows: jax.Array) -> jax.Array:
    d = self.dim
    rows = rows.astype(jnp.float32)
    classifier = jax.nn.sigmoid(queries[:, :d] @ rows[:, :d].T)
    return self.mix(classifier, self.text_probabilities(queries, rows))

  def text_probabilities(self, queries: jax.Array, rows: jax.Array) -> jax.Array:
    """sigmoid(s (cos(E(x), E(z_l)) - theta)) of query rows against label rows (both 2d
    wide)."""
    return text_term(self.cosines(queries, rows), self.text_scale, self.text_shift)

  def cosines(self, queries: jax.Array, rows: jax.Array) -> jax.Array:
    """cos(E(x), E(z_l)) of query rows against label rows (both 2d wide)."""
    d = self.dim
    return queries[:, d:] @ rows[:, d:].astype(jnp.float32).T

  def mix(self, classifier: jax.Array, text: jax.Array) -> jax.Array:
    """(1 - beta) p + beta t."""
    return (1.0 - self.text_weight) * classifier + self.text_weight * text


def text_term(cos: jax.Array, scale, shift) -> jax.Array:
  """The label-text term sigmoid(s (cos - theta)); s and theta may be traced values."""
  return jax.nn.sigmoid(scale * (cos - shift))


def check_label_texts(config, has_label_texts: bool, data_dir: str) -> None:
  """Raises InputError when the config's score needs label texts the data lacks: the fused
  score, or a choice among label-text weights (`scoring.label_text_weight_choices`) that
  lists one above 0."""
  sc = config.get("scoring")
  if has_label_texts or sc is None:
    return
  for field in ("label_text_weight", "label_text_weight_choices"):
    value = sc.get(field, ())
    if np.any(np.asarray(value, np.float64) > 0):
      raise InputError(
        f"config.scoring.{field}={value}: the fused score needs label texts, and "
        f"{data_dir} has none"
      )


def from_config(config, dim: int) -> LabelTextFusion | None:
  """The config's fusion (`scoring.*`), or None when `scoring.label_text_weight` is 0."""
  sc = config.get("scoring")
  if sc is None or not sc.label_text_weight:
    return None
  return LabelTextFusion(
    float(sc.label_text_weight),
    float(sc.label_text_scale),
    dim,
    float(sc.get("label_text_shift", 0.0)),
  )
