"""The neighbour vote: the labels of the training rows nearest to a query, mixed into its
score (`scoring.neighbour_weight`).

With neighbour weight a > 0 the model ranks label l for query x by

    (1 - a) p(x, l) + a v(x, l),   v(x, l) = sum_j omega_j [l in y_j] / sum_j omega_j,

where p is the classifier's probability sigmoid(<w_l, E(x)>) (or the label-text fused
score, score_fusion.py), j runs over the k training rows x_j nearest to x by cosine under
the same encoder (the `Memory`: their normalised E(x_j) and label rows y_j), and
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
exists. Cost: the memory holds N x d float32 (N training rows), searched exactly in
(query block x key block) tiles (`nearest`), so memory is bounded whatever N; time grows as
N per query (plan/score_extras.py prices it).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from astra_jax.data.sparse_rows import SparseRows

MAX_VOTES = 256  # labels a query's vote keeps, the most voted


@dataclasses.dataclass(frozen=True)
class NeighbourVote:
  """How the vote is taken and mixed; hashable, so the top-k kernels compile it in.

  Attributes:
    weight: a, the vote's share of the score, in [0, 1].
    neighbours: k, training rows that vote.
    temperature: tau of the votes' weights exp((cos - best cos) / tau).
    max_votes: labels kept per query (the most voted).
  """

  weight: float
  neighbours: int
  temperature: float
  max_votes: int = MAX_VOTES

  def mix(self, probabilities: jax.Array, votes: jax.Array) -> jax.Array:
    """(1 - a) p + a v."""
    return (1.0 - self.weight) * probabilities + self.weight * votes


@dataclasses.dataclass(frozen=True)
class Votes:
  """Each query's voted labels (n, S): ids (-1: none) and their vote v(x, l) (0 for none)."""

  ids: np.ndarray
  values: np.ndarray

  def rows(self, lo: int, hi: int) -> Votes:
    return Votes(self.ids[lo:hi], self.values[lo:hi])

  def padded(self, lo: int, hi: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, values) of rows [lo, hi) padded to `rows` rows that vote for nothing (a
    kernel's fixed query block)."""
    pad = ((0, rows - (hi - lo)), (0, 0))
    return (
      np.pad(self.ids[lo:hi], pad, constant_values=-1),
      np.pad(self.values[lo:hi], pad),
    )


@dataclasses.dataclass(frozen=True)
class Memory:
  """The training rows that vote: their unit-norm embeddings and their labels.

  Attributes:
    keys: (N, d) float32, E(x_j) / |E(x_j)|.
    labels: the N rows' labels.
  """

  keys: np.ndarray
  labels: SparseRows

  def __post_init__(self):
    if len(self.keys) != self.labels.num_rows:
      raise ValueError(f"{len(self.keys)} memory rows but {self.labels.num_rows} label rows")

  @classmethod
  def from_embeddings(cls, embeddings: np.ndarray, labels: SparseRows) -> Memory:
    return cls(unit_rows(embeddings), labels)

  def plus(self, other: Memory) -> Memory:
    """This memory's rows, then `other`'s."""
    return Memory(np.concatenate([self.keys, other.keys]), self.labels.vstack(other.labels))

  @functools.cached_property
  def search_keys(self) -> jax.Array | np.ndarray:
    """The keys a search reads: on the default device, placed once for every search, when
    they take at most RESIDENT_KEY_BYTES; else the host array, streamed a block at a time
    (a memory of 146M rows of d = 64 is 37 GB, more than a V100 holds)."""
    if self.keys.nbytes <= RESIDENT_KEY_BYTES:
      return jnp.asarray(self.keys, jnp.float32)
    return self.keys

  def votes(self, queries: np.ndarray, vote: NeighbourVote, block: int = 1024) -> Votes:
    """The votes of each query's `vote.neighbours` nearest rows.

    Args:
      queries: (n, d) E(x) (normalised here).
      vote: the vote's settings.
      block: queries per exact search call.
    Returns:
      Votes (n, vote.max_votes), most voted first (ties: the lower label id).
    """
    neighbours, sims = nearest(queries, self.search_keys, vote.neighbours, block)
    weights = np.exp((sims - sims[:, :1]) / vote.temperature)
    return label_votes(neighbours, weights, self.labels, vote.max_votes, normalise=True)


def unit_rows(x: np.ndarray) -> np.ndarray:
  """Rows over their norms, float32 (zero rows stay zero)."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _normalise(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# A memory up to this size stays on the device between searches; a larger one is streamed.
RESIDENT_KEY_BYTES = 4 << 30
# Scores of one (query block x key block) tile: 256 MB of float32 whatever the memory's size.
TILE_FLOATS = 1 << 26


@functools.partial(jax.jit, static_argnames=("k",))
def _nearest_block(
  queries: jax.Array, keys: jax.Array, k: int, offset: int = 0
) -> tuple[jax.Array, jax.Array]:
  # One compiled search per (block shape, key block shape, k): a server's calls reuse it.
  sims, ids = jax.lax.top_k(_normalise(queries) @ _normalise(keys).T, k)
  return sims, ids + offset


@functools.partial(jax.jit, static_argnames=("k",))
def _merge(
  sims: jax.Array, ids: jax.Array, more_sims: jax.Array, more_ids: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
  # The running top k comes first and holds the lower ids, and top_k prefers the lower
  # position among equal values: ties go to the lower id, as one search over all keys would.
  top, where = jax.lax.top_k(jnp.concatenate([sims, more_sims], axis=1), k)
  return top, jnp.take_along_axis(jnp.concatenate([ids, more_ids], axis=1), where, axis=1)


def nearest(
  queries: np.ndarray, keys, k: int, block: int = 1024, tile_floats: int = TILE_FLOATS
) -> tuple[np.ndarray, np.ndarray]:
  """The k most cosine-similar keys of each query, exactly, in (query block x key block)
  tiles: each key block's top k is merged into a running top k, so memory is bounded by
  the tile, not by the number of keys. Each key block moves to the device once.

  Args:
    queries: (n, d) embeddings (normalised here).
    keys: (m, d) embeddings, on the host or the device (normalised here).
    k: neighbours per query (at most m).
    block: queries per matmul.
    tile_floats: scores per tile; key blocks hold max(k, tile_floats // block) keys.
  Returns:
    ((n, k) int64 key ids, (n, k) float32 cosine similarities), most similar first (ties:
    the lower id first).
  """
  num_keys, n = keys.shape[0], len(queries)
  k = min(k, num_keys)
  if not n:
    return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
  key_block = max(k, tile_floats // block)
  query_blocks = [
    jnp.asarray(queries[start : start + block], jnp.float32) for start in range(0, n, block)
  ]
  best: list[tuple[jax.Array, jax.Array] | None] = [None] * len(query_blocks)
  for r in range(0, num_keys, key_block):
    part = keys if key_block >= num_keys else keys[r : r + key_block]
    part = jnp.asarray(part, jnp.float32)
    kk = min(k, part.shape[0])
    for b, q in enumerate(query_blocks):
      found = _nearest_block(q, part, kk, r)
      best[b] = found if best[b] is None else _merge(*best[b], *found, k)
  sims = np.concatenate([np.asarray(s) for s, _ in best])
  ids = np.concatenate([np.asarray(i, np.int64) for _, i in best])
  return ids, sims


def label_votes(
  neighbours: np.ndarray,
  weights: np.ndarray,
  labels: SparseRows,
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
  counts = labels.indptr[nb + 1] - labels.indptr[nb]
  starts = np.repeat(labels.indptr[nb], counts)
  offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
  ids = labels.indices[starts + offsets].astype(np.int64)
  qs = np.repeat(q, counts)
  # One score per (query, label) pair.
  keys, inverse = np.unique(qs * labels.num_cols + ids, return_inverse=True)
  scores = np.bincount(inverse, weights=np.repeat(w, counts), minlength=len(keys))
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
  q, t = probabilities.shape
  local = vote_ids - first_id
  inside = (vote_ids >= 0) & (local >= 0) & (local < t)
  votes = jnp.zeros((q, t), jnp.float32)
  rows = jnp.broadcast_to(jnp.arange(q)[:, None], local.shape)
  votes = votes.at[rows, jnp.where(inside, local, t)].add(
    jnp.where(inside, vote_values, 0.0), mode="drop"
  )
  return vote.mix(probabilities, votes)


def from_config(config) -> NeighbourVote | None:
  """The config's vote (`scoring.neighbour_*`), or None when its weight is 0."""
  sc = config.get("scoring")
  return None if sc is None else from_scoring(sc)


def from_scoring(scoring: Mapping) -> NeighbourVote | None:
  """The vote of a `scoring` section (the config's, or an exported model's model.json
  record of it), or None when its weight is 0."""
  weight = scoring.get("neighbour_weight", 0.0)
  return with_weight(scoring, weight) if weight else None


def with_weight(scoring: Mapping, weight: float) -> NeighbourVote:
  """A `scoring` section's vote settings with another weight (the choice's candidates)."""
  return NeighbourVote(
    float(weight), int(scoring["neighbours"]), float(scoring["neighbour_temperature"])
  )
