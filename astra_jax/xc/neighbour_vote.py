"""The neighbour vote: the labels of the training rows nearest to a query, mixed into its
score (`scoring.neighbour_weight`).

With neighbour weight a > 0 the model ranks label l for query x by

    (1 - a) p(x, l) + a v(x, l),   v(x, l) = sum_j omega_j [l in y_j] / sum_j omega_j,

where p is the classifier's probability sigmoid(<w_l, E(x)>) (or the label-text fused
score, score_fusion.py), j runs over the k training rows x_j nearest to x by cosine under
the same encoder (the memory, ann/vote_memory.py: their normalised E(x_j) and label rows
y_j), and
omega_j = exp((cos(x, x_j) - max_j' cos(x, x_j')) / tau). v is a distribution over labels
that sums to the neighbours' mean label count; only its `max_votes` largest entries per
query are kept (the rest count as 0).

Why: W is one vector per label, a linear read-out of E(x). Where a head label's queries
fall in several regions of the embedding space that other labels' regions separate (a
build dependency that packages of some families list and others do not), no single w_l
draws that boundary, and W fits its training rows far beyond held-out ones; the training
rows themselves still do, as votes. On tail-heavy data where W and the label texts rank
well, the vote adds noise; its weight is chosen on a validation split among
`scoring.neighbour_weight_choices` (training/score_choice.py), where 0 turns it off.

The vote enters the exact top-k kernels as a sparse term: each tile of labels adds the
votes that fall inside it (`add_votes`), so the top-k stays exact and no (n, L) array
exists. Cost: the memory holds N x d float32 (N training rows), searched exactly in tiles
of bounded memory, time growing as N per query, or past 10^6 rows with a ScaNN index over
it, a fixed number of rows per query (ann/vote_memory.py; plan/score_extras.py prices
both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from astra_jax.data.sparse_rows import SparseRows, StackedRows

MAX_VOTES = 256  # labels a query's vote keeps, the most voted
# Rows a ScaNN search of the memory scores per query, by default: ann/memory_search.py's
# SCANN_ROWS_PER_QUERY, which this layer cannot import (tests/test_neighbour_vote.py checks
# that they agree).
SEARCH_ROWS = 50_000


@dataclasses.dataclass(frozen=True)
class NeighbourVote:
  """How the vote is taken and mixed; hashable, so the top-k kernels compile it in.

  Attributes:
    weight: a, the vote's share of the score, in [0, 1].
    neighbours: k, training rows that vote.
    temperature: tau of the votes' weights exp((cos - best cos) / tau).
    max_votes: labels kept per query (the most voted).
    search: how the memory is searched (ann/memory_search.SEARCHES: auto, exact, scann).
    search_rows: rows a ScaNN search scores per query.
  """

  weight: float
  neighbours: int
  temperature: float
  max_votes: int = MAX_VOTES
  search: str = "auto"
  search_rows: int = SEARCH_ROWS

  def mix(self, probabilities: jax.Array, votes: jax.Array) -> jax.Array:
    """(1 - a) p + a v."""
    return (1.0 - self.weight) * probabilities + self.weight * votes


@dataclasses.dataclass(frozen=True)
class Votes:
  """Each query's voted labels (n, S): ids (-1: none) and their vote v(x, l) (0 for none)."""

  ids: np.ndarray
  values: np.ndarray

  @classmethod
  def none(cls, n: int, slots: int) -> Votes:
    """n queries that vote for nothing."""
    return cls(np.full((n, slots), -1, np.int32), np.zeros((n, slots), np.float32))

  @classmethod
  def beside(cls, parts: list[Votes]) -> Votes:
    """The parts' slots side by side (n, sum of S): a label in several parts gets the sum
    of its entries in the kernels (`add_votes`)."""
    return cls(
      np.concatenate([p.ids for p in parts], axis=1),
      np.concatenate([p.values for p in parts], axis=1).astype(np.float32),
    )

  def padded(self, lo: int, hi: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, values) of rows [lo, hi) padded to `rows` rows that vote for nothing (a
    kernel's fixed query block)."""
    pad = ((0, rows - (hi - lo)), (0, 0))
    return (
      np.pad(self.ids[lo:hi], pad, constant_values=-1),
      np.pad(self.values[lo:hi], pad),
    )


def label_votes(
  neighbours: np.ndarray,
  weights: np.ndarray,
  labels: SparseRows | StackedRows,
  top: int,
  normalise: bool = False,
) -> Votes:
  """Each query's labels scored by the summed weights of the neighbours that carry them.

  Args:
    neighbours: (n, k) row ids of `labels` (-1: none).
    weights: (n, k) each neighbour's weight.
    labels: the rows' labels.
    top: labels kept per query, the highest scored.
    normalise: divide each query's scores by the sum of its neighbours' weights.
  Returns:
    Votes (n, top), highest first; ties go to the smaller label id.
  """
  n, k = neighbours.shape
  valid = neighbours >= 0
  q = np.repeat(np.arange(n), k)[valid.ravel()]
  nb = neighbours.ravel()[valid.ravel()]
  w = weights.ravel()[valid.ravel()].astype(np.float64)
  which, ids = labels.entries(nb)
  qs = q[which]
  # One score per (query, label) pair.
  keys, inverse = np.unique(qs * labels.num_cols + ids, return_inverse=True)
  scores = np.bincount(inverse, weights=w[which], minlength=len(keys))
  if normalise:
    total = np.bincount(q, weights=w, minlength=n)
    scores = scores / np.maximum(total[keys // labels.num_cols], 1e-30)
  kq, kl = keys // labels.num_cols, keys % labels.num_cols
  order = np.lexsort((kl, -scores, kq))  # by query, then score descending, then label
  kq, kl, scores = kq[order], kl[order], scores[order]
  first = np.searchsorted(kq, np.arange(n))
  rank = np.arange(len(kq)) - first[kq]
  out_ids = np.full((n, top), -1, np.int32)
  out_values = np.zeros((n, top), np.float32)
  keep = rank < top
  out_ids[kq[keep], rank[keep]] = kl[keep]
  out_values[kq[keep], rank[keep]] = scores[keep]
  return Votes(out_ids, out_values)


def tile_votes(
  vote_ids: jax.Array, vote_values: jax.Array, first_id: jax.Array, tile: int
) -> jax.Array:
  """The queries' votes for a tile of labels [first_id, first_id + tile).

  Args:
    vote_ids: (q, S) the queries' voted labels (-1: none).
    vote_values: (q, S) their votes.
    first_id: the tile's first label id.
    tile: labels in the tile.
  Returns:
    (q, tile) v(x, l), 0 where a query voted for nothing in the tile.
  """
  q = vote_ids.shape[0]
  local = vote_ids - first_id
  inside = (vote_ids >= 0) & (local >= 0) & (local < tile)
  votes = jnp.zeros((q, tile), jnp.float32)
  rows = jnp.broadcast_to(jnp.arange(q)[:, None], local.shape)
  return votes.at[rows, jnp.where(inside, local, tile)].add(
    jnp.where(inside, vote_values, 0.0), mode="drop"
  )


def add_votes(
  probabilities: jax.Array,
  vote: NeighbourVote,
  vote_ids: jax.Array,
  vote_values: jax.Array,
  first_id: jax.Array,
) -> jax.Array:
  """The mixed score of a tile of labels [first_id, first_id + t): (1 - a) p + a v.

  Args:
    probabilities: (q, t) p(x, l) of the tile.
    vote: the vote's settings.
    vote_ids: (q, S) the queries' voted labels (-1: none).
    vote_values: (q, S) their votes.
    first_id: the tile's first label id.
  Returns:
    (q, t) the mixed scores.
  """
  votes = tile_votes(vote_ids, vote_values, first_id, probabilities.shape[1])
  return vote.mix(probabilities, votes)


def from_config(config) -> NeighbourVote | None:
  """The config's vote (`scoring.neighbour_*`), or None when its weight is 0."""
  sc = config.get("scoring")
  return None if sc is None else from_scoring(sc)


def from_scoring(scoring: Mapping) -> NeighbourVote | None:
  """The vote of a `scoring` section (the config's, or an exported model's model.json
  record of it), or None when its weight is 0 (a record without the search's keys reads
  as the defaults)."""
  weight = scoring.get("neighbour_weight", 0.0)
  if not weight:
    return None
  return dataclasses.replace(search_settings(scoring), weight=float(weight))


def search_settings(scoring: Mapping) -> NeighbourVote:
  """The vote of a `scoring` section at weight 0: how its neighbours are found and weighed
  (a record without the keys reads as the defaults)."""
  return NeighbourVote(
    0.0,
    int(scoring.get("neighbours", 50)),
    float(scoring.get("neighbour_temperature", 0.1)),
    search=str(scoring.get("neighbour_search", "auto")),
    search_rows=int(scoring.get("neighbour_search_rows", SEARCH_ROWS)),
  )
