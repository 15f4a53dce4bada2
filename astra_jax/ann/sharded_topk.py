"""Exact top-k over W where it lives: no device ever holds more of W than its own shard.

W's rows are split over the mesh's 'model' axis (sharding.py); a block of test queries is
split over every device, like the training batch. Inside `jax.shard_map` each device

  1. encodes its own queries (the encoder is data parallel) and all-gathers its data
     group's embeddings over 'model' (B/D x d numbers),
  2. scores them against its own R = L'/M rows of W in tiles of `label_block` rows, keeping
     a running top-k, so its memory is O(B/D x (label_block + k)) and no (B, L) array exists,
  3. all-gathers the group's candidates over 'model' (M x B/D x k scores and ids: k / R of
     what gathering W would move) and keeps the best k,
  4. keeps the rows of the queries it encoded.

So only queries and candidates cross devices and processes, each process reads and ranks
only the test rows its devices hold, and the per-row metric sums are added across
processes at the end (evaluation.mesh_rank_filter_sums). Tiles are read from the shard in
place with a clamped dynamic slice (the last tile overlaps its predecessor, whose rows are
masked), so the shard is never padded or copied.

The label-text fusion (score_fusion.py) runs through the same kernel with E(z_l)/|E(z_l)|
laid out like W, each tile's [w_l | E(z_l)/|E(z_l)|] assembled on the fly. The neighbour
vote (neighbour_vote.py) arrives as each query's (S,) voted label ids and votes, split over
the devices like the queries and gathered over 'model' with them; each tile adds the votes
that fall inside it. Unless they were taken before, each process takes the votes of the
rows its devices hold from the embeddings of step 1, so a row is encoded once and voted for
by one process.

The score's weights are an argument of the compiled kernel, not constants in it, and it
takes a (G, 2) array of them: the products of a tile and its votes are taken once and
each of the G weightings merges into its own running top-k, so a choice among weights
(training/score_choice.py) reads all of them from one pass over W. With `text_shapes`
each row also carries the label-text term's scale and shift, so one pass reads many shapes
of the term too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.ann.exact_topk import dot_scores, merge_topk
from astra_jax.ann.vote_cache import VoteCache
from astra_jax.ann.vote_memory import VoteMemory
from astra_jax.parallel import mesh_embedding
from astra_jax.parallel.sharding import ALL, from_host
from astra_jax.xc.neighbour_vote import NeighbourVote, Votes, tile_votes
from astra_jax.xc.score_fusion import LabelTextFusion, text_term

EncodeFn = Callable[[object, jax.Array], jax.Array]  # (encoder params, (B, T) ids) -> (B, d)


def _tile_scorer(
  fusion: LabelTextFusion | None,
  vote: NeighbourVote | None,
  queries: jax.Array,
  tile: jax.Array,
  votes: tuple[jax.Array, jax.Array] | None,
  first_id: jax.Array,
  vote_parts: tuple[int, ...] = (),
  text_shapes: bool = False,
):
  """at(w) -> (q, t) a tile's score at weights w = (beta, a, c_0, c_1, ...), for every w
  from one pass of the products (`fusion`, `vote`: which terms the score has; their
  weights come from w). The votes' columns fall into parts, `vote_parts` the column counts
  of the last ones and the first the rest; part j's votes are scaled by c_j. With one part
  (and c_0 = 1) the votes are scattered once for every w. With `text_shapes` w ends in
  the label-text term's (scale, shift), in place of the fusion's own."""
  tile = tile.astype(jnp.float32)
  d = fusion.dim if fusion is not None else tile.shape[1]
  logits = dot_scores(queries[:, :d], tile[:, :d])
  if fusion is None and vote is None:
    return lambda w: logits
  p = jax.nn.sigmoid(logits)
  text = cos = None
  if fusion is not None and text_shapes:
    cos = fusion.cosines(queries, tile)
  elif fusion is not None:
    text = fusion.text_probabilities(queries, tile)
  t = tile.shape[0]
  voted, part = None, None
  if vote is not None and not vote_parts:
    voted = tile_votes(votes[0], votes[1], first_id, t)
  elif vote is not None:
    columns = votes[0].shape[1]
    sizes = (columns - sum(vote_parts), *vote_parts)
    part = jnp.asarray(np.repeat(np.arange(len(sizes)), sizes), jnp.int32)

  def at(w: jax.Array) -> jax.Array:
    s = p
    if fusion is not None:
      shaped = text if cos is None else text_term(cos, w[-2], w[-1])
      s = dataclasses.replace(fusion, text_weight=w[0]).mix(s, shaped)
    if vote is not None:
      v = voted
      if v is None:  # each part's votes scaled by this w's factor, then scattered
        v = tile_votes(votes[0], votes[1] * w[2:][part], first_id, t)
      s = dataclasses.replace(vote, weight=w[1]).mix(s, v)
    # With both weights 0 the score is W's alone, ranked by its logits as a search without
    # the terms ranks it: the sigmoid would tie the labels where it saturates.
    return jnp.where((w[0] == 0) & (w[1] == 0), logits, s)

  return at


def _tile_topk(
  weights: jax.Array,
  queries: jax.Array,
  label_parts: tuple[jax.Array, ...],
  k: int,
  label_block: int,
  first_id: jax.Array,
  num_labels: int,
  fusion: LabelTextFusion | None = None,
  vote: NeighbourVote | None = None,
  votes: tuple[jax.Array, jax.Array] | None = None,
  vote_parts: tuple[int, ...] = (),
  text_shapes: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Top-k of `queries` (q, d') against the local rows [first_id, first_id + R) of the
  label arrays (each (R, .)), one tile of `label_block` rows at a time, for each row of
  `weights` (G, 2 + parts [+ 2 with `text_shapes`]) (`_tile_scorer`): (scores, ids)
  (G, q, k). With `vote`, each tile's scores are mixed with the queries' `votes` ((q, S)
  ids, (q, S) values)."""
  rows = label_parts[0].shape[0]
  lb = min(label_block, rows)
  tiles = -(-rows // lb)
  q = queries.shape[0]
  local = jnp.arange(lb, dtype=jnp.int32)

  def body(t, carry):
    nominal = t * lb
    start = jnp.minimum(nominal, rows - lb)  # the last tile is moved back inside the shard
    tile = jnp.concatenate(
      [jax.lax.dynamic_slice_in_dim(x, start, lb) for x in label_parts], axis=1
    )
    at = _tile_scorer(fusion, vote, queries, tile, votes, first_id + start, vote_parts, text_shapes)
    ids = first_id + start + local
    # Rows the moved-back last tile shares with its predecessor, and padded rows of W.
    keep = (start + local >= nominal) & (ids < num_labels)

    def merged(args):
      w, best_s, best_i = args
      return merge_topk(best_s, best_i, jnp.where(keep[None, :], at(w), -jnp.inf), ids, k)

    if weights.shape[0] == 1:  # one score: no loop around it
      s, i = merged((weights[0], carry[0][0], carry[1][0]))
      return s[None], i[None]
    # One weight at a time: the products above are shared, and one (q, t) score is live.
    return jax.lax.map(merged, (weights, *carry))

  g = weights.shape[0]
  init = (jnp.full((g, q, k), -jnp.inf, jnp.float32), jnp.full((g, q, k), -1, jnp.int32))
  return jax.lax.fori_loop(0, tiles, body, init)


@dataclasses.dataclass(frozen=True)
class ShardedSearch:
  """Exact top-k of encoded token rows against W's shards on `mesh` (module docstring).

  Attributes:
    mesh: the (data, model) mesh W is laid out on.
    num_labels: L; W's padded rows [L, L') are never returned.
    label_block: W rows scored per tile on each device.
    fusion: the label-text fusion, or None for <w_l, E(x)>.
    vote: the neighbour vote mixed into the score (`search_rows` then takes each row's
      votes), or None; with lexical terms, their fold with it (xc/lexical.fold).
    vote_parts: the column counts of the votes' last parts (the lexical terms' t and u
      beside a memory's votes, which are the first part: the rest of the columns); each
      part is scaled by its own factor, a column of the kernel's weights; () for one part.
    vote_factors: the search's own factors, one per part (xc/lexical.vote_factors); ()
      for 1 each.
    text_shapes: the kernel's weight rows end in the label-text term's (scale, shift), so
      that one pass reads many shapes (the score choice's); False: the fusion's own.
  """

  mesh: jax.sharding.Mesh
  num_labels: int
  label_block: int = 32768
  fusion: LabelTextFusion | None = None
  vote: NeighbourVote | None = None
  vote_parts: tuple[int, ...] = ()
  vote_factors: tuple[float, ...] = ()
  text_shapes: bool = False

  @property
  def devices(self) -> int:
    return self.mesh.devices.size

  def block_rows(self, batch_size: int) -> int:
    """Query rows per call: `batch_size` rounded up to a multiple of the devices."""
    return mesh_embedding.block_rows(self.mesh, batch_size)

  def kernel(self, k: int, weights: np.ndarray | None = None):
    """jit((embeddings (Q, d) split over all devices, votes ((Q, S) ids, (Q, S) values)
    split likewise or None, W (L', d) split over 'model' [, unit label texts (L', d)]) ->
    (scores, ids) (Q, G, k), split like the embeddings): the top-k by each of the G rows of
    `weights` ((G, 2) label-text weight beta and vote weight a, then one factor per vote
    part (`vote_parts`), then with `text_shapes` the term's scale and shift; None: the
    search's own, G = 1, every factor 1), from one pass over W. One per (search, k) for
    the process's life, the weights an argument: every evaluation of a run reuses it, and
    a choice among weights (training/score_choice.py) compiles it once for each number of
    rows it reads."""
    unweighted = dataclasses.replace(
      self,
      fusion=None if self.fusion is None else dataclasses.replace(self.fusion, text_weight=0.0),
      vote=None if self.vote is None else dataclasses.replace(self.vote, weight=0.0),
      vote_factors=(),
    )
    if self.text_shapes and self.fusion is None:
      raise ValueError("text_shapes needs a search with the label-text fusion")
    columns = 3 + len(self.vote_parts) if self.vote_parts else 2
    if weights is None:
      factors = self.vote_factors or (1.0,) * (columns - 2)
      shape = (self.fusion.text_scale, self.fusion.text_shift) if self.text_shapes else ()
      weights = [
        [
          0.0 if self.fusion is None else self.fusion.text_weight,
          0.0 if self.vote is None else self.vote.weight,
          *factors,
          *shape,
        ]
      ]
    columns += 2 if self.text_shapes else 0
    weights = np.atleast_2d(np.asarray(weights, np.float32))
    if weights.shape[1] != columns:
      raise ValueError(f"weights of {weights.shape[1]} columns for a search that takes {columns}")
    if weights[:, 0].any() and self.fusion is None:
      raise ValueError("a label-text weight above 0 needs a search with the label-text fusion")
    if weights[:, 1].any() and self.vote is None:
      raise ValueError("a neighbour weight above 0 needs a search with the neighbour vote")
    return functools.partial(_kernel(unweighted, k), weights)

  def encoder(self, encode: EncodeFn):
    """jit((encoder params, ids (Q, T) split over all devices) -> embeddings (Q, d) split
    likewise): each device encodes its own queries."""
    return mesh_embedding.encoder(self.mesh, encode)

  def label_parts(
    self, classifier: jax.Array, label_texts: np.ndarray | None
  ) -> tuple[jax.Array, ...]:
    """The arrays the kernel scores: (W,) or (W, E(z_l)/|E(z_l)|), both split over 'model'."""
    if self.fusion is None:
      return (classifier,)
    if label_texts is None:
      raise ValueError("a label-text fusion needs the label texts' embeddings")
    texts = np.asarray(label_texts, np.float32)
    texts = np.pad(texts, ((0, classifier.shape[0] - len(texts)), (0, 0)))
    return (classifier, unit_rows(texts, self.mesh))

  def search_rows(
    self,
    encode: EncodeFn,
    enc_params,
    tokens,
    lo: int,
    hi: int,
    k: int,
    label_parts: tuple[jax.Array, ...],
    batch_size: int,
    votes: Votes | None = None,
    memory: VoteMemory | None = None,
    vote_cache: VoteCache | None = None,
    extra_votes: Votes | None = None,
    weights: np.ndarray | None = None,
  ) -> list[tuple[int, np.ndarray]]:
    """Top-k label ids of token rows [lo, hi) that this process's devices rank.

    Args:
      encode: the inference-mode encoder (embedding.make_embed_fn).
      enc_params: its parameters (replicated on the mesh, or a host copy).
      tokens: (n, T) token ids, e.g. a memory-mapped token file; each process reads only
        the rows its devices hold.
      lo, hi: the global rows to rank.
      k: labels per row.
      label_parts: `label_parts(W, E(z_l))`.
      batch_size: query rows per call (rounded to the devices; the last call is padded).
      votes: with `self.vote`, the votes of rows [lo, hi) (row lo first), when already
        taken; else
      memory: with `self.vote`, the rows that vote: each process votes for the rows it
        ranks, from the embeddings it ranks them by.
      vote_cache: where those votes are kept for, or read from, another search of the same
        rows from the same memory (None: taken anew).
      extra_votes: with a memory, entries added beside each row's votes from it, rows
        [lo, hi) (row lo first): the lexical terms (xc/lexical.py).
      weights: (G, 2) (label-text weight, neighbour weight) rows to rank by, each from the
        same pass over W, with a factor per vote part after them and, with `text_shapes`,
        the term's scale and shift (`kernel`); None: the search's own weights.
    Returns:
      [(first global row, ids (n_i, k) int32, or (n_i, G, k) with `weights`)] for this
      process's contiguous runs of rows, in row order (padding rows past `hi` dropped).
    """
    kernel, encoder = self.kernel(k, weights), self.encoder(encode)
    q = self.block_rows(batch_size)
    sharding = NamedSharding(self.mesh, P(ALL))
    if self.vote is not None and (votes is None) == (memory is None):
      raise ValueError("a search with a neighbour vote needs the rows' votes or a memory")
    # A memory that streams its keys to the device for every search takes many blocks'
    # queries at once (process_memory.py); the others one block at a time.
    per_search = 1
    if self.vote is not None and memory is not None:
      per_search = max(1, memory.query_rows_per_search // q)
    starts = list(range(lo, hi, q))
    out = []
    for g in range(0, len(starts), per_search):
      group = starts[g : g + per_search]
      embs, voted = [], []
      for start in group:
        stop = min(start + q, hi)
        block = functools.partial(mesh_embedding.block_array, sharding, start=start, stop=stop, q=q)
        embs.append(encoder(enc_params, block(tokens, dtype=np.int32)))
        if self.vote is not None and votes is not None:
          ids = block(votes.ids, fill=-1, offset=lo)
          voted.append((ids, block(votes.values, fill=0.0, offset=lo)))
      if self.vote is None:
        voted = [None] * len(group)
      elif votes is None:
        voted = self._own_votes(embs, memory, group, hi, vote_cache, extra_votes, lo)
      for start, emb, block_votes in zip(group, embs, voted):
        stop = min(start + q, hi)
        _, top = kernel(emb, block_votes, *label_parts)
        for shard in top.addressable_shards:
          a = start + (shard.index[0].start or 0)
          n = min(stop - a, shard.data.shape[0])
          if n > 0:
            ids = np.asarray(shard.data)[:n]
            out.append((a, ids if weights is not None else ids[:, 0]))
    return sorted(out, key=lambda x: x[0])

  def _own_votes(
    self,
    embs: list[jax.Array],
    memory: VoteMemory,
    starts: list[int],
    hi: int,
    cache: VoteCache | None,
    extra: Votes | None = None,
    lo: int = 0,
  ) -> list[tuple[jax.Array, jax.Array]]:
    """The votes of the rows of encoded blocks `embs` (global rows from `starts`) this
    process's devices hold, each split like its block; rows at or past `hi` vote for
    nothing. One search of the memory for all the blocks `cache` does not hold (every
    process holds the same blocks: they are searched in step). `extra`'s entries of the
    same rows (global row lo + i at row i) are set beside the memory's votes."""
    held, keys, mine = [], [], []
    for emb, start in zip(embs, starts):
      shards = sorted(emb.addressable_shards, key=lambda x: x.index[0].start or 0)
      stop = min(start + emb.shape[0], hi)
      held.append(
        [max(0, min(stop - start - (x.index[0].start or 0), x.data.shape[0])) for x in shards]
      )
      keys.append((dataclasses.replace(self.vote, weight=0.0), start, stop, emb.shape[0]))
      mine.append(None if cache is None else cache.get(keys[-1]))
    todo = [i for i, m in enumerate(mine) if m is None]
    if todo:  # a collective for a memory split over devices or processes
      found = memory.own_votes_blocks([(embs[i], held[i]) for i in todo], self.vote)
      for i, votes in zip(todo, found):
        mine[i] = votes if cache is None else cache.put(keys[i], votes)
    if extra is not None:
      mine = [
        self._with_extra(emb, start, votes, counts, extra, lo)
        for emb, start, votes, counts in zip(embs, starts, mine, held)
      ]
    return [self._placed(emb, votes, counts) for emb, votes, counts in zip(embs, mine, held)]

  def _with_extra(
    self, emb: jax.Array, start: int, votes: Votes, held: list[int], extra: Votes, lo: int
  ) -> Votes:
    """`votes` (this process's held rows of the block at `start`) with `extra`'s entries
    of the same global rows beside them."""
    shards = sorted(emb.addressable_shards, key=lambda x: x.index[0].start or 0)
    rows = np.concatenate(
      [start + (x.index[0].start or 0) + np.arange(n) for x, n in zip(shards, held)]
    ).astype(np.int64)
    return Votes.beside([votes, Votes(extra.ids[rows - lo], extra.values[rows - lo])])

  def _placed(self, emb: jax.Array, votes: Votes, held: list[int]) -> tuple[jax.Array, jax.Array]:
    """This process's `votes` for its held rows of block `emb`, as (ids, values) split like
    the block (padding rows vote for nothing)."""
    shards = sorted(emb.addressable_shards, key=lambda x: x.index[0].start or 0)
    ids, values, first = [], [], 0
    for x, n in zip(shards, held):
      i, v = votes.padded(first, first + n, x.data.shape[0])
      ids.append(jax.device_put(i, x.device))
      values.append(jax.device_put(v, x.device))
      first += n
    shape = (emb.shape[0], votes.ids.shape[1])
    return (
      jax.make_array_from_single_device_arrays(shape, emb.sharding, ids),
      jax.make_array_from_single_device_arrays(shape, emb.sharding, values),
    )


@functools.lru_cache(maxsize=32)
def _kernel(search: ShardedSearch, k: int):
  """ShardedSearch.kernel's compiled function."""
  mesh, fusion, vote, num_labels, label_block, vote_parts, text_shapes = (
    search.mesh,
    search.fusion,
    search.vote,
    search.num_labels,
    search.label_block,
    search.vote_parts,
    search.text_shapes,
  )

  def body(weights, emb, voted, *label_parts):
    group = jax.lax.all_gather(emb, "model", tiled=True).astype(jnp.float32)
    if fusion is not None:
      group = fusion.device_query_rows(group)
    if vote is not None:  # the group's votes, as its embeddings
      voted = tuple(jax.lax.all_gather(x, "model", tiled=True) for x in voted)
    rows = label_parts[0].shape[0]
    first_id = jax.lax.axis_index("model") * rows
    s, i = _tile_topk(
      weights,
      group,
      label_parts,
      k,
      label_block,
      first_id,
      num_labels,
      fusion,
      vote,
      voted,
      vote_parts,
      text_shapes,
    )
    # The group's (G, q, M k) candidates -> its best k, then this device's own queries.
    cand_s = jax.lax.all_gather(s, "model", axis=2, tiled=True)
    cand_i = jax.lax.all_gather(i, "model", axis=2, tiled=True)
    top_s, pos = jax.lax.top_k(cand_s, k)
    top_i = jnp.take_along_axis(cand_i, pos, axis=2)
    mine = emb.shape[0]
    start = jax.lax.axis_index("model") * mine
    return (
      jnp.swapaxes(jax.lax.dynamic_slice_in_dim(top_s, start, mine, axis=1), 0, 1),
      jnp.swapaxes(jax.lax.dynamic_slice_in_dim(top_i, start, mine, axis=1), 0, 1),
    )

  parts = 1 if fusion is None else 2
  voted_spec = (P(ALL), P(ALL)) if vote is not None else None
  sharded = jax.shard_map(
    body,
    mesh=mesh,
    in_specs=(P(), P(ALL), voted_spec) + (P("model"),) * parts,
    out_specs=(P(ALL), P(ALL)),
    check_vma=False,
  )
  return jax.jit(sharded)


def on_mesh(classifier: jax.Array, mesh: jax.sharding.Mesh) -> jax.Array:
  """W split over `mesh`'s 'model' axis: as it is when the train state put it there (the
  sparse step), else placed so (the dense step's W, on one device of a 1 x 1 mesh)."""
  target = NamedSharding(mesh, P("model"))
  sharding = getattr(classifier, "sharding", None)
  if sharding is not None and sharding.is_equivalent_to(target, classifier.ndim):
    return classifier
  return jax.device_put(classifier, target)


def unit_rows(x: np.ndarray, mesh: jax.sharding.Mesh) -> jax.Array:
  """Rows scaled to unit norm, split over 'model' like W (zero rows stay zero)."""
  sharding = NamedSharding(mesh, P("model"))

  @functools.partial(jax.jit, out_shardings=sharding)
  def unit(x):
    x = x.astype(jnp.float32)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), 1e-12)

  return unit(from_host(x, sharding))
