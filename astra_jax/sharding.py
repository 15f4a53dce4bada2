"""Device mesh, the sharding rules, and the model-parallel classifier kernel.

Mesh axes: 'data' and 'model'. The rules (`RULES`): the encoder's parameters are replicated
and its batch is split over *all* devices (data x model), so the encoder is purely data
parallel; W's rows are split over 'model' (shard s holds rows [s R, (s+1) R) of the padded
matrix); the queries of one 'data' group are scored against every W shard of that group.

Inside `jax.shard_map` each device
  1. all-gathers its data group's embeddings over 'model' (B/D x d numbers),
  2. gathers the rows it owns: positives (global ids, so masked to the shard; partial
     scores are psum'd over 'model', B/D x k_p numbers), its own block of hard negatives and
     its own random draws (sampler.py groups both by shard, so they are all local),
  3. takes the gradient of the per-shard estimator w.r.t. the scores locally,
  4. reduce-scatters dloss/dE(x) back to the queries it encoded,
  5. returns the row gradients in factored form (`classifier_grads`): the gradient of a
     per-query row is dloss/dscore times its query's embedding, so it keeps the B x K
     coefficients and the B x d embeddings, all-gathered over 'data' (every data replica of
     a shard applies the same update), not the B x K x d gradients: d times less to
     all-gather and to keep for the micro-batches of an accumulated step.
`classifier_update` then forms each micro-batch's row gradients in turn and scatter-adds
them into the donated shard of V (W = scale * V, see sparse_sgd.py). With classifier
momentum, `classifier_momentum_update` does the same into W and its velocity, catching the
touched rows up first, and the kernel reads rows caught up (sparse_momentum.py). Nothing in
a step is O(L), and the row gradients held at once are one micro-batch's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from astra_jax import loss, mesh_topology, sparse_momentum, sparse_sgd
from astra_jax.errors import InputError

ALL = ("data", "model")
# Logical axis -> mesh axes. Batch arrays carry a leading micro-batch axis (never split).
RULES = {"query": ALL, "query_group": "data", "label_shard": "model", "replicated": None}
_LOGICAL = {  # per batch key: the logical name of each axis after the micro-batch axis
    "input_ids": ("query", None), "pos_ids": ("query_group", None),
    "pos_mask": ("query_group", None), "pos_weight": ("query_group",),
    "hard_ids": ("query_group", "label_shard"),
    "hard_mask": ("query_group", "label_shard"), "rand_ids": ("label_shard",),
    "rand_mask": ("query_group", "label_shard"), "rand_weight": ("label_shard",),
    "all_pos_ids": ("query_group", None)}
# Per-query random draws (negatives.random_draws=per_query) are laid out like hard negatives.
_PER_QUERY_LOGICAL = {"rand_ids": ("query_group", "label_shard")}


def kernel_spec(key: str, ndim: int) -> P:
  """The PartitionSpec of one label array of a micro-batch; `ndim` tells shared random draws
  (rand_ids of ndim 1) from per-query ones (ndim 2)."""
  axes = _LOGICAL[key]
  if len(axes) != ndim:
    axes = _PER_QUERY_LOGICAL.get(key, axes)
  if len(axes) != ndim:
    raise ValueError(f"batch[{key!r}] has {ndim} axes per micro-batch, expected {len(axes)}")
  return P(*(RULES.get(a) for a in axes))


def batch_spec(key: str, ndim: int) -> P:
  """The PartitionSpec of a batch array with its leading micro-batch axis."""
  return P(None, *kernel_spec(key, ndim - 1))


def make_mesh(data: int, model: int, devices=None) -> jax.sharding.Mesh:
  """A (data, model) mesh over every device of every process (1 x 1: the first device);
  data=-1 takes the devices model leaves over. Devices on several nodes: the hybrid grid
  of mesh_topology.py ('model' inside a node)."""
  devices = jax.devices() if devices is None else devices
  n = len(devices)
  if data == -1:
    if n % model:
      raise InputError(f"config.mesh.model={model} does not divide the {n} devices")
    data = n // model
  if data * model == 1:
    devices = devices[:1]
  elif data * model != n:
    raise InputError(f"config.mesh: {data} x {model} needs {data * model} devices, have {n} "
                     f"(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={data * model} "
                     f"fakes them)")
  grid = mesh_topology.hybrid_grid(devices, data, model) if data * model > 1 else None
  if grid is not None:
    return jax.sharding.Mesh(grid, ALL, axis_types=(AxisType.Auto,) * 2)
  return jax.make_mesh((data, model), ALL, axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


def padded_rows(num_labels: int, mesh: jax.sharding.Mesh) -> int:
  """Rows of W after padding to a multiple of the 'model' axis (padded rows are never
  sampled and never predicted)."""
  m = mesh.shape["model"]
  return -(-num_labels // m) * m


def _unless_single(mesh: jax.sharding.Mesh, collective):
  """`collective(x, axis, ...)`, or x itself where the mesh axis has one device: the
  identity, but XLA:CPU still copied the operand (a per-query step's B k_r x d row
  gradients: 3.5 of 9.5 ms on a 1 x 1 mesh, benchmarks/step_vs_labels.py)."""
  def apply(x, axis, **kwargs):
    return x if mesh.shape[axis] == 1 else collective(x, axis, **kwargs)
  return apply


def classifier_grads(mesh: jax.sharding.Mesh, global_batch: int):
  """(emb (B, d), V (Lp, d), scale, label arrays of one micro-batch[, momentum]) ->
  (loss, dloss/demb (B, d), row_grads).

  W's rows are scale * V's, or with `momentum` (a sparse_momentum.MomentumState; scale is
  then unused) V's rows caught up from their last touched step.

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

  all_gather, psum, psum_scatter = (_unless_single(mesh, c) for c in (
      jax.lax.all_gather, jax.lax.psum, jax.lax.psum_scatter))

  def body(emb, v, scale, batch, momentum):
    rows_per_shard = v.shape[0]
    offset = jax.lax.axis_index("model") * rows_per_shard
    emb_group = all_gather(emb, "model", tiled=True).astype(jnp.float32)

    def local(ids):
      lid = ids - offset
      mine = (lid >= 0) & (lid < rows_per_shard)
      safe = jnp.clip(lid, 0, rows_per_shard - 1)
      rows = (scale * v[safe].astype(jnp.float32) if momentum is None
              else sparse_momentum.current_rows(v, momentum, safe))
      return jnp.where(mine, lid, rows_per_shard), jnp.where(mine[..., None], rows, 0.0)

    (pos_l, pos_r), (hard_l, hard_r), (rand_l, rand_r) = (
        local(batch[k]) for k in ("pos_ids", "hard_ids", "rand_ids"))
    per_query = batch["rand_ids"].ndim == 2
    pos_s = psum(loss.score_rows(emb_group, pos_r), "model")
    hard_s, rand_s = loss.score_rows(emb_group, hard_r), loss.score_rows(emb_group, rand_r)

    def estimator(pos_s, hard_s, rand_s):
      """Positives' term (the same on every shard) + this shard's negatives' terms."""
      pos = (loss.positive_terms(pos_s, batch["pos_mask"]).sum(-1) *
             batch.get("pos_weight", 1.0)).sum()
      neg = (loss.negative_terms(hard_s, batch["hard_mask"]).sum() +
             (loss.negative_terms(rand_s, batch["rand_mask"]) * batch["rand_weight"]).sum())
      return (pos + neg) / global_batch, (pos / global_batch, neg / global_batch)

    (_, (pos, neg)), (d_pos, d_hard, d_rand) = jax.value_and_grad(
        estimator, argnums=(0, 1, 2), has_aux=True)(pos_s, hard_s, rand_s)
    value = psum(pos + psum(neg, "model"), "data")
    d = emb.shape[-1]
    d_emb_group = (jnp.einsum("bk,bkd->bd", d_pos, pos_r) +
                   jnp.einsum("bk,bkd->bd", d_hard, hard_r) +
                   (jnp.einsum("bk,bkd->bd", d_rand, rand_r) if per_query else d_rand @ rand_r))
    d_emb = psum_scatter(d_emb_group, "model", scatter_dimension=0, tiled=True)
    queried = [(pos_l, d_pos), (hard_l, d_hard)] + ([(rand_l, d_rand)] if per_query else [])
    gather_data = lambda x: all_gather(x, "data", tiled=True)
    row_grads = {"ids": gather_data(jnp.concatenate([l for l, _ in queried], axis=1)),
                 "coef": gather_data(jnp.concatenate([g for _, g in queried], axis=1)),
                 "queries": gather_data(emb_group)}
    if per_query:
      row_grads["shared_ids"] = jnp.zeros((0,), jnp.int32)
      row_grads["shared_grads"] = jnp.zeros((0, d), jnp.float32)
    else:  # one draw serves the data group: its rows' gradients add up over 'data'
      row_grads["shared_ids"] = rand_l
      row_grads["shared_grads"] = psum(d_rand.T @ emb_group, "data")
    return value, d_emb.astype(emb.dtype), row_grads

  def kernel(emb, v, scale, batch, momentum=None):
    labels = {k: kernel_spec(k, x.ndim) for k, x in batch.items()}
    return jax.shard_map(body, mesh=mesh,
                         in_specs=(P(ALL), P("model"), P(), labels,
                                   None if momentum is None else MOMENTUM_SPEC),
                         out_specs=(P(), P(ALL), P("model")),
                         # row_grads are identical across data replicas (all-gathered), which
                         # the vma checker cannot infer; the mesh-equivalence tests check it.
                         check_vma=False)(emb, v, scale, batch, momentum)

  return kernel


def classifier_update(mesh: jax.sharding.Mesh, weight_decay: float):
  """(V, scale, row_grads with a leading micro-batch axis A, lr) -> (V', scale'): one SGD +
  decoupled decay step with the row gradients of A micro-batches (`classifier_grads`), each
  shard into its own rows. One micro-batch's (n K, d) gradients exist at a time."""

  def body(v, scale, row_grads, lr):
    new_scale = sparse_sgd.decayed_scale(scale, lr, weight_decay)
    step = -lr / new_scale

    def add_micro_batch(v, g):
      n, k = g["ids"].shape
      grads = (g["coef"][..., None] * g["queries"][:, None]).reshape(n * k, -1)
      ids = jnp.concatenate([g["ids"].reshape(-1), g["shared_ids"]])
      return sparse_sgd.add_rows(v, ids, jnp.concatenate([grads, g["shared_grads"]]), step), None

    v, _ = jax.lax.scan(add_micro_batch, v, row_grads)
    return v, new_scale

  return jax.shard_map(body, mesh=mesh,
                       in_specs=(P("model"), P(), P(None, "model"), P()),
                       out_specs=(P("model"), P()), check_vma=False)


def classifier_momentum_update(mesh: jax.sharding.Mesh, weight_decay: float, beta: float):
  """(W, MomentumState, row_grads with a leading micro-batch axis A, lr, apply) ->
  (W', state'): one step of SGD with momentum beta and weight decay wd inside it (the dense
  optax chain), each shard into its own rows, O(rows touched) (sparse_momentum.py).
  apply=False: a step that changes nothing (identity transition, zero gradients)."""

  def body(w, state, row_grads, lr, apply):
    state = sparse_momentum.begin_step(state, lr, weight_decay, beta, apply)

    def add_micro_batch(carry, g):
      w, state = carry
      n, k = g["ids"].shape
      grads = (g["coef"][..., None] * g["queries"][:, None]).reshape(n * k, -1)
      ids = jnp.concatenate([g["ids"].reshape(-1), g["shared_ids"]])
      grads = jnp.concatenate([grads, g["shared_grads"]])
      return sparse_momentum.add_gradients(w, state, ids, grads, lr), None

    (w, state), _ = jax.lax.scan(add_micro_batch, (w, state), row_grads)
    return w, state

  return jax.shard_map(body, mesh=mesh,
                       in_specs=(P("model"), MOMENTUM_SPEC, P(None, "model"), P(), P()),
                       out_specs=(P("model"), MOMENTUM_SPEC), check_vma=False)


# The momentum state's layout: per-row arrays split like W, the catch-up table replicated.
MOMENTUM_SPEC = sparse_momentum.MomentumState(P("model"), P("model"), P(), P())


def shard_params(params: dict, opt_state: dict, mesh: jax.sharding.Mesh):
  """Encoder and optimizer state replicated, V (and the classifier's momentum state's
  per-row arrays) split by rows over 'model'."""
  rep = NamedSharding(mesh, P())
  params = {"encoder": jax.device_put(params["encoder"], rep),
            "classifier": jax.device_put(params["classifier"], NamedSharding(mesh, P("model")))}
  rest = {k: v for k, v in opt_state.items() if k != "momentum"}
  out = jax.device_put(rest, rep)
  if "momentum" in opt_state:
    out["momentum"] = jax.device_put(
        opt_state["momentum"], jax.tree.map(lambda spec: NamedSharding(mesh, spec),
                                            MOMENTUM_SPEC))
  return params, out


def shard_batch(batch: dict, mesh: jax.sharding.Mesh) -> dict:
  """Host arrays -> global arrays; each process only reads the slices its devices hold."""
  out = {}
  for k, v in batch.items():
    sharding = NamedSharding(mesh, batch_spec(k, v.ndim))
    out[k] = jax.make_array_from_callback(v.shape, sharding, lambda idx, v=v: v[idx])
  return out


def process_token_rows(mesh: jax.sharding.Mesh, micro_batches: int, micro_batch: int
                       ) -> np.ndarray:
  """(A, B/A) bool: the queries whose tokens this process's devices hold."""
  sharding = NamedSharding(mesh, batch_spec("input_ids", 3))
  mask = np.zeros((micro_batches, micro_batch), bool)
  for idx in sharding.addressable_devices_indices_map((micro_batches, micro_batch, 1)).values():
    mask[idx[:2]] = True
  return mask


def local_model_shards(mesh: jax.sharding.Mesh) -> list[int]:
  """The W shards ('model' indices) that live on this process's devices."""
  local = {d.id for d in jax.local_devices()}
  return [m for m in range(mesh.shape["model"])
          if any(d.id in local for d in mesh.devices[:, m])]
