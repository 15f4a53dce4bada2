"""The classifier: its model-parallel kernel and its O(rows touched) updates.

The kernel (`classifier_grads`) runs inside `jax.shard_map` on the (data, model) mesh of
sharding.py, W's rows split over 'model'. Each device
  1. all-gathers its data group's embeddings over 'model' (B/D x d numbers),
  2. gathers the rows it owns: positives (global ids, so masked to the shard; partial
     scores are psum'd over 'model', B/D x k_p numbers), its own block of hard negatives and
     its own random draws (the sampler groups both by shard, so they are all local),
  3. takes the gradient of its part of the estimator (loss.estimator_terms: the positives'
     term, the same on every shard, and its own negatives' terms) w.r.t. the scores locally,
  4. reduce-scatters dloss/dE(x) back to the queries it encoded,
  5. returns the row gradients in factored form: the gradient of a per-query row is
     dloss/dscore times its query's embedding, so it keeps the B x K coefficients and the
     B x d embeddings, all-gathered over 'data' (every data replica of a shard applies the
     same update), not the B x K x d gradients: d times less to all-gather and to keep for
     the micro-batches of an accumulated step.
`classifier_update` then forms each micro-batch's row gradients in turn and scatter-adds
them into the donated shard of V (W = scale * V, below). With classifier momentum,
`classifier_momentum_update` does the same into W's and the velocity's arrays, which hold
each row in the coordinates of sparse_momentum.py, and the kernel reads rows through them;
`classifier_momentum_step`, what the train step runs, takes kernel and update a block of
queries at a time (exact under momentum: a step's gradient leaves the W it reads).
Nothing in a step is O(L), and the row gradients held at once are one micro-batch's.

SGD with decoupled weight decay in O(rows touched) per step. Dense SGD + decoupled decay
updates every row each step: W <- (1 - lr wd) W - lr G, where G is non-zero only on the
rows the batch touched. We keep W = scale * V instead. The decay of all rows is one scalar
multiply, scale <- scale (1 - lr wd), and the gradient goes into the touched rows of V:
V[ids] <- V[ids] - (lr / scale_new) G[ids] (a scatter-add into the donated buffer, so
duplicate ids add up exactly like the dense gradient). This is the dense update, exactly,
not an approximation ("decay of touched rows" would be a different optimizer). `fold`
multiplies the scale back into V (O(L)); the trainer folds at epoch ends, before anything
outside the step reads W, and whenever the scale falls below 1e-2 (float range). With
optim.classifier_momentum > 0 the update is sparse_momentum.py's instead (each row kept in
coordinates that only its own gradients change; its docstring says how).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from astra_jax.data.batch import LabelBatch, label_axes
from astra_jax.parallel.sharding import ALL, label_specs
from astra_jax.xc import loss, sparse_momentum
from astra_jax.xc.sparse_momentum import MOMENTUM_SPEC


def _unless_single(mesh: jax.sharding.Mesh, collective):
  """`collective(x, axis, ...)`, or x itself where the mesh axis has one device: the
  identity, but XLA:CPU still copies the operand, a third of a per-query step's time on a
  1 x 1 mesh (docs/results/implementation_notes.md)."""

  def apply(x, axis, **kwargs):
    return x if mesh.shape[axis] == 1 else collective(x, axis, **kwargs)

  return apply


def _local_rows(v: jax.Array, scale: jax.Array, labels: LabelBatch, momentum) -> tuple:
  """Inside the kernel: for positives, hard and random negatives, (local ids, rows) of the
  ids this shard owns (W = scale * V, or read through `momentum`); another shard's
  id reads as rows_per_shard with a zero row."""
  rows_per_shard = v.shape[0]
  offset = jax.lax.axis_index("model") * rows_per_shard

  def local(ids):
    lid = ids - offset
    mine = (lid >= 0) & (lid < rows_per_shard)
    safe = jnp.clip(lid, 0, rows_per_shard - 1)
    rows = (
      scale * v[safe].astype(jnp.float32)
      if momentum is None
      else sparse_momentum.current_rows(v, momentum, safe)
    )
    return jnp.where(mine, lid, rows_per_shard), jnp.where(mine[..., None], rows, 0.0)

  return tuple(local(ids) for ids in (labels.pos_ids, labels.hard_ids, labels.rand_ids))


def classifier_forward(mesh: jax.sharding.Mesh):
  """(emb (B, d), V (Lp, d), label arrays of one micro-batch, scale) -> the scores of
  positives (B, k_p), hard negatives (B, k_h) and random negatives (B, k_r) (shared draws:
  each data group's queries against the draw), laid out like their ids: the forward half of
  `classifier_grads`, for the step profiler, with W never gathered."""
  all_gather, psum = (_unless_single(mesh, c) for c in (jax.lax.all_gather, jax.lax.psum))

  def body(emb, v, scale, labels):
    emb_group = all_gather(emb, "model", tiled=True).astype(jnp.float32)
    (_, pos_r), (_, hard_r), (_, rand_r) = _local_rows(v, scale, labels, None)
    return (
      psum(loss.score_rows(emb_group, pos_r), "model"),
      loss.score_rows(emb_group, hard_r),
      loss.score_rows(emb_group, rand_r),
    )

  def forward(emb, v, labels, scale):
    return jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(P(ALL), P("model"), P(), label_specs(labels)),
      out_specs=(P("data"), P("data", "model"), P("data", "model")),
      check_vma=False,
    )(emb, v, scale, labels)

  return jax.jit(forward)


def classifier_grads(mesh: jax.sharding.Mesh, global_batch: int):
  """(emb (B, d), V (Lp, d), scale, one micro-batch's LabelBatch[, momentum]) ->
  (loss, dloss/demb (B, d), row_grads).

  W's rows are scale * V's, or with `momentum` (a sparse_momentum.MomentumState; scale is
  then unused) read from V's and the velocity's rows with the period's coefficients.

  row_grads, per shard (out spec P('model') on every leaf), the gradient w.r.t. W's rows:
    ids (n, K) int32    local row ids of the per-query rows (positives, hard negatives, and
                        random negatives when drawn per query); rows_per_shard marks a row
                        that is not this shard's (dropped by the update)
    coef (n, K) f32     dloss/dscore of each
    queries (n, d) f32  the embeddings they were scored with: row ids[i, k] has gradient
                        coef[i, k] * queries[i]
    shared_ids (m,), shared_grads (m, d): rows with their summed gradients (a shared random
                        draw, m = k_r; m = 0 with per-query draws)
  n is the whole batch's queries (all-gathered over 'data'). Loss and gradients are for the
  mean over `global_batch` queries."""

  all_gather, psum, psum_scatter = (
    _unless_single(mesh, c) for c in (jax.lax.all_gather, jax.lax.psum, jax.lax.psum_scatter)
  )

  def body(emb, v, scale, labels, momentum):
    emb_group = all_gather(emb, "model", tiled=True).astype(jnp.float32)
    (pos_l, pos_r), (hard_l, hard_r), (rand_l, rand_r) = _local_rows(v, scale, labels, momentum)
    per_query = labels.per_query_random
    pos_s = psum(loss.score_rows(emb_group, pos_r), "model")
    hard_s, rand_s = loss.score_rows(emb_group, hard_r), loss.score_rows(emb_group, rand_r)

    def estimator(pos_s, hard_s, rand_s):
      """Positives' term (the same on every shard) + this shard's negatives' terms."""
      terms = loss.estimator_terms((pos_s, hard_s, rand_s), labels)
      pos, neg = terms.positives.sum(), terms.negatives_total()
      return (pos + neg) / global_batch, (pos / global_batch, neg / global_batch)

    (_, (pos, neg)), (d_pos, d_hard, d_rand) = jax.value_and_grad(
      estimator, argnums=(0, 1, 2), has_aux=True
    )(pos_s, hard_s, rand_s)
    value = psum(pos + psum(neg, "model"), "data")
    d = emb.shape[-1]
    d_emb_group = (
      jnp.einsum("bk,bkd->bd", d_pos, pos_r)
      + jnp.einsum("bk,bkd->bd", d_hard, hard_r)
      + (jnp.einsum("bk,bkd->bd", d_rand, rand_r) if per_query else d_rand @ rand_r)
    )
    d_emb = psum_scatter(d_emb_group, "model", scatter_dimension=0, tiled=True)
    queried = [(pos_l, d_pos), (hard_l, d_hard)] + ([(rand_l, d_rand)] if per_query else [])
    gather_data = lambda x: all_gather(x, "data", tiled=True)
    row_grads = {
      "ids": gather_data(jnp.concatenate([l for l, _ in queried], axis=1)),
      "coef": gather_data(jnp.concatenate([g for _, g in queried], axis=1)),
      "queries": gather_data(emb_group),
    }
    if per_query:
      row_grads["shared_ids"] = jnp.zeros((0,), jnp.int32)
      row_grads["shared_grads"] = jnp.zeros((0, d), jnp.float32)
    else:  # one draw serves the data group: its rows' gradients add up over 'data'
      row_grads["shared_ids"] = rand_l
      row_grads["shared_grads"] = psum(d_rand.T @ emb_group, "data")
    return value, d_emb.astype(emb.dtype), row_grads

  def kernel(emb, v, scale, labels, momentum=None):
    return jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(
        P(ALL),
        P("model"),
        P(),
        label_specs(labels),
        None if momentum is None else MOMENTUM_SPEC,
      ),
      out_specs=(P(), P(ALL), P("model")),
      # row_grads are identical across data replicas (all-gathered), which
      # the vma checker cannot infer; the mesh-equivalence tests check it.
      check_vma=False,
    )(emb, v, scale, labels, momentum)

  return kernel


# On the CPU, the row gradients an update forms at once, in bytes: a micro-batch's (n K, d)
# gradients are formed and scattered a block of queries at a time. XLA:CPU maps its
# temporaries afresh at every call and faults each page in, which cost more than the
# scatter itself for a whole micro-batch's gradients. A GPU keeps its temporaries
# allocated and would only launch more, smaller scatters: there a micro-batch is one block.
UPDATE_BLOCK_BYTES = 4 << 20


def update_block_bytes(mesh: jax.sharding.Mesh) -> int:
  """The update's block of row gradients on `mesh`'s devices (0: a micro-batch at once)."""
  return UPDATE_BLOCK_BYTES if mesh.devices.flat[0].platform == "cpu" else 0


def _rows_and_grads(ids: jax.Array, coef: jax.Array, queries: jax.Array):
  """Factored row gradients (`classifier_grads`) as (ids (n K,), gradients (n K, d)): row
  ids[i, k] gets coef[i, k] * queries[i]."""
  n, k = ids.shape
  return ids.reshape(-1), (coef[..., None] * queries[:, None]).reshape(n * k, -1)


def _block_size(n: int, most: int) -> int:
  """The largest divisor of n that is at most `most` (at least 1): a block's queries."""
  return max(b for b in range(1, min(n, max(1, most)) + 1) if n % b == 0)


def _query_blocks(g: dict, block_bytes: int) -> dict:
  """One micro-batch's per-query row gradients split into blocks of queries along a new
  leading axis (every block the same size, a divisor of n, its gradients at most about
  `block_bytes`; 0: one block)."""
  n, k = g["ids"].shape
  d = g["queries"].shape[-1]
  size = _block_size(n, block_bytes // (k * d * 4) if block_bytes else n)
  split = lambda x: x.reshape(n // size, size, *x.shape[1:])
  return {key: split(g[key]) for key in ("ids", "coef", "queries")}


def _add_micro_batch(add, state, g: dict, block_bytes: int):
  """`state` after `add(state, ids, grads)` for every block of the micro-batch's per-query
  row gradients (`_query_blocks`), then for its shared rows."""
  blocks = _query_blocks(g, block_bytes)

  def add_block(state, b):
    return add(state, *_rows_and_grads(b["ids"], b["coef"], b["queries"])), None

  state, _ = jax.lax.scan(add_block, state, blocks)
  if g["shared_ids"].shape[0]:
    state = add(state, g["shared_ids"], g["shared_grads"])
  return state


def drop_frozen(row_grads: dict, trainable: jax.Array | None) -> dict:
  """Inside an update: `row_grads` with the ids of rows `trainable` (this shard's (rows,)
  bool) marks False turned into rows (dropped, like another shard's), so a step leaves them
  as they are; unchanged when `trainable` is None."""
  if trainable is None:
    return row_grads
  rows = trainable.shape[0]

  def keep(ids):
    return jnp.where((ids < rows) & trainable[jnp.clip(ids, 0, rows - 1)], ids, rows)

  return {**row_grads, "ids": keep(row_grads["ids"]), "shared_ids": keep(row_grads["shared_ids"])}


def _trainable_spec(trainable: jax.Array | None):
  return None if trainable is None else P("model")


def classifier_update(mesh: jax.sharding.Mesh, weight_decay: float):
  """(V, scale, row_grads with a leading micro-batch axis A, lr[, trainable]) -> (V', scale'):
  one SGD + decoupled decay step with the row gradients of A micro-batches
  (`classifier_grads`), each shard into its own rows. A block of queries' (n K, d) gradients
  exist at a time. trainable: (L',) bool split over 'model', the rows the step may change
  (`drop_frozen`); None: all."""
  block_bytes = update_block_bytes(mesh)

  def body(v, scale, row_grads, lr, trainable):
    new_scale = decayed_scale(scale, lr, weight_decay)
    step = -lr / new_scale
    add = lambda v, ids, grads: add_rows(v, ids, grads, step)

    def add_micro_batch(v, g):
      return _add_micro_batch(add, v, g, block_bytes), None

    v, _ = jax.lax.scan(add_micro_batch, v, drop_frozen(row_grads, trainable))
    return v, new_scale

  def update(v, scale, row_grads, lr, trainable=None):
    return jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(P("model"), P(), P(None, "model"), P(), _trainable_spec(trainable)),
      out_specs=(P("model"), P()),
      check_vma=False,
    )(v, scale, row_grads, lr, trainable)

  return update


def classifier_momentum_update(mesh: jax.sharding.Mesh):
  """(W, MomentumState, row_grads with a leading micro-batch axis A, apply[, trainable])
  -> (W', state'): one step of SGD with momentum and weight decay inside it (the dense
  optax chain), each shard into its own rows, O(rows touched): two scatter-adds of each
  block's gradients (sparse_momentum.py; the step's learning rate, decay and momentum are
  in the state's period coefficients). apply=False: a step that changes nothing.
  trainable: as `classifier_update`'s (a frozen row's velocity stays 0, so with wd = 0 the
  row never moves)."""

  block_bytes = update_block_bytes(mesh)

  def body(w, state, row_grads, apply, trainable):
    state = sparse_momentum.begin_step(state, apply)

    def add(carry, ids, grads):
      return sparse_momentum.add_gradients(*carry, ids, grads, apply)

    def add_micro_batch(carry, g):
      return _add_micro_batch(add, carry, g, block_bytes), None

    (w, state), _ = jax.lax.scan(add_micro_batch, (w, state), drop_frozen(row_grads, trainable))
    return w, state

  def update(w, state, row_grads, apply, trainable=None):
    return jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(P("model"), MOMENTUM_SPEC, P(None, "model"), P(), _trainable_spec(trainable)),
      out_specs=(P("model"), MOMENTUM_SPEC),
      check_vma=False,
    )(w, state, row_grads, apply, trainable)

  return update


def _split_by_device(x: jax.Array, chunks: int, blocks: int) -> jax.Array:
  """(n, ...) whose rows are split into `chunks` equal parts, one per device -> (blocks,
  n / blocks, ...): block b holds the b-th part of every device's rows, in device order, so
  every block is split over the devices as x is and taking one moves nothing."""
  size = x.shape[0] // (chunks * blocks)  # not -1: a field may have no columns (k_h = 0)
  parts = x.reshape(chunks, blocks, size, *x.shape[1:]).swapaxes(0, 1)
  return parts.reshape(blocks, chunks * size, *x.shape[1:])


def _join_by_device(y: jax.Array, chunks: int) -> jax.Array:
  """`_split_by_device`'s inverse."""
  blocks, n = y.shape[:2]
  parts = y.reshape(blocks, chunks, n // chunks, *y.shape[2:]).swapaxes(0, 1)
  return parts.reshape(blocks * n, *y.shape[2:])


def momentum_query_blocks(
  mesh: jax.sharding.Mesh, labels: LabelBatch, dim: int, block_bytes: int
) -> int:
  """The blocks of queries `classifier_momentum_step` splits one micro-batch into: as few
  as keep a block's row gradients on a shard (every data group's queries of the block,
  times the rows each scores there, times d float32s) within `block_bytes`, and a divisor
  of each device's queries (0 bytes: one block)."""
  if not block_bytes:
    return 1
  chunks, shards = mesh.shape["data"] * mesh.shape["model"], mesh.shape["model"]
  per_device = labels.pos_ids.shape[0] // chunks
  rows = labels.pos_ids.shape[-1] + labels.hard_ids.shape[-1] // shards
  if labels.per_query_random:
    rows += labels.rand_ids.shape[-1] // shards
  return per_device // _block_size(per_device, block_bytes // (chunks * rows * dim * 4))


def classifier_momentum_step(mesh: jax.sharding.Mesh, global_batch: int):
  """(emb (B', d), W, MomentumState, one micro-batch's LabelBatch[, trainable]) -> (loss,
  dloss/demb (B', d), W', state'): `classifier_grads` and `classifier_momentum_update` of
  the micro-batch's queries, taken a block of queries at a time, each block's rows updated
  right after the block scored them.

  Under momentum a step's gradient leaves the W that step reads unchanged (it moves the
  velocity first; docs/DESIGN.md, section 3), so a later block, or micro-batch, reading a
  row an earlier one already updated reads the same W: the result is the whole step's, up
  to float rounding. The gain is where the rows are: a block's rows are updated while they
  are still in the CPU's cache, where a whole batch's (twice W's bytes, with the velocity)
  would have left it (`momentum_query_blocks`; a GPU takes the micro-batch as one block).
  Every gradient is applied, so a step that may be skipped (dynamic loss scaling) takes
  the two passes instead. The state's period step is left where it is: the train step
  advances it once, after its micro-batches (sparse_momentum.begin_step)."""
  grads = classifier_grads(mesh, global_batch)
  update = classifier_momentum_update(mesh)
  chunks = mesh.shape["data"] * mesh.shape["model"]

  def step(emb, w, state, labels, trainable=None):
    blocks = momentum_query_blocks(mesh, labels, emb.shape[-1], update_block_bytes(mesh))
    per_query = [a is not None and a[0] == "query_group" for a in label_axes(labels)]
    split = lambda x: _split_by_device(x, chunks, blocks)
    xs = LabelBatch(*(split(x) if q else None for x, q in zip(labels, per_query)))
    shared = {k: x for k, x, q in zip(LabelBatch._fields, labels, per_query) if not q}

    def block(carry, x):
      w, velocity = carry
      emb_block, labels_block = x
      # Every block reads at the step's period step; the update adds at the next one and
      # only its velocity is kept (the train step advances the period step once).
      read = state._replace(velocity=velocity)
      value, d_emb, row_grads = grads(
        emb_block, w, jnp.float32(1.0), labels_block._replace(**shared), read
      )
      w, added = update(w, read, jax.tree.map(lambda g: g[None], row_grads), True, trainable)
      return (w, added.velocity), (value, d_emb)

    (w, velocity), (values, d_emb) = jax.lax.scan(block, (w, state.velocity), (split(emb), xs))
    return values.sum(), _join_by_device(d_emb, chunks), w, state._replace(velocity=velocity)

  return step


def decayed_scale(scale: jax.Array, lr: jax.Array, weight_decay: float) -> jax.Array:
  """The scale after one step's decay of every row: scale (1 - lr wd)."""
  return scale * (1.0 - lr * weight_decay)


def add_rows(v: jax.Array, ids: jax.Array, grads: jax.Array, step: jax.Array) -> jax.Array:
  """V[ids] += step * grads, duplicates adding up; ids out of range are dropped (another
  shard's rows, padding)."""
  return v.at[ids].add((step * grads).astype(v.dtype), mode="drop")


def sgd_update(
  v: jax.Array,
  scale: jax.Array,
  ids: jax.Array,
  grads: jax.Array,
  lr: jax.Array,
  weight_decay: float,
) -> tuple[jax.Array, jax.Array]:
  """ids: (n,) row ids (duplicates allowed); grads: (n, d) dLoss/dW rows for them."""
  new_scale = decayed_scale(scale, lr, weight_decay)
  return add_rows(v, ids, grads, -(lr / new_scale)), new_scale


@functools.partial(jax.jit, donate_argnums=(0,))
def fold(v: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
  """V * scale, scale = 1: the true W."""
  return (v * scale).astype(v.dtype), jnp.ones_like(scale)
