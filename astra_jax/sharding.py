"""Device mesh and the model-parallel classifier kernel.

Mesh axes: 'data' (the batch and the encoder's gradient are split over it; encoder
parameters are replicated) and 'model' (W's rows are split over it: shard s holds global rows
[s L_s, (s+1) L_s)). Inside `jax.shard_map` each device gathers only the sampled rows it
owns (others contribute zeros), partial scores are summed over 'model' (one psum of
B x (k_p + k_h + k_r) numbers), the loss gradient w.r.t. the scores is taken locally, and
every shard scatter-adds the row gradients of its own rows into its donated slice of V
(W = scale * V, see sparse_sgd.py). Row gradients are all-gathered over 'data' first, so all
data replicas of a shard apply the same update. Nothing in a step is O(L).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from astra_jax import loss, sparse_sgd

BATCH_SPECS = {"input_ids": P("data"), "pos_ids": P("data"), "pos_mask": P("data"),
               "hard_ids": P("data"), "hard_mask": P("data"), "rand_ids": P(),
               "rand_mask": P("data"), "rand_weight": P()}


def make_mesh(data: int, model: int) -> jax.sharding.Mesh:
  """A (data, model) mesh; data=-1 takes the devices model leaves over."""
  n = jax.device_count()
  if data == -1:
    data = n // model
  if data * model != n:
    raise ValueError(f"mesh {data} x {model} needs {data * model} devices, have {n}")
  return jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def padded_rows(num_labels: int, mesh: jax.sharding.Mesh) -> int:
  """Rows of W after padding to a multiple of the 'model' axis (padded rows are never
  sampled: the sampler draws from [0, L))."""
  m = mesh.shape["model"]
  return -(-num_labels // m) * m


def classifier_kernel(mesh: jax.sharding.Mesh, global_batch: int, weight_decay: float):
  """(emb, V, scale, batch, lr) -> (loss, dloss/demb, V', scale') over the mesh."""

  def body(emb, v, scale, batch, lr):
    rows_per_shard = v.shape[0]
    offset = jax.lax.axis_index("model") * rows_per_shard

    def local(ids):
      lid = ids - offset
      mine = (lid >= 0) & (lid < rows_per_shard)
      rows = jnp.where(mine[..., None], v[jnp.clip(lid, 0, rows_per_shard - 1)], 0.0)
      return jnp.where(mine, lid, rows_per_shard), scale * rows.astype(jnp.float32)

    (pos_l, pos_r), (hard_l, hard_r), (rand_l, rand_r) = (
        local(batch[k]) for k in ("pos_ids", "hard_ids", "rand_ids"))
    scores = jax.lax.psum(loss.scores_from_rows(emb, pos_r, hard_r, rand_r), "model")

    def summed(s):
      return loss.sampled_bce_per_query(s[0], batch["pos_mask"], s[1], batch["hard_mask"],
                                        s[2], batch["rand_mask"],
                                        batch["rand_weight"]).sum() / global_batch

    value, (d_pos, d_hard, d_rand) = jax.value_and_grad(summed)(scores)
    value = jax.lax.psum(value, "data")
    d_emb = jax.lax.psum(jnp.einsum("bk,bkd->bd", d_pos, pos_r) +
                         jnp.einsum("bk,bkd->bd", d_hard, hard_r) + d_rand @ rand_r, "model")
    emb32 = emb.astype(jnp.float32)
    g_pos = jax.lax.all_gather(d_pos[..., None] * emb32[:, None], "data", tiled=True)
    g_hard = jax.lax.all_gather(d_hard[..., None] * emb32[:, None], "data", tiled=True)
    g_rand = jax.lax.psum(d_rand.T @ emb32, "data")
    ids = jnp.concatenate([jax.lax.all_gather(pos_l, "data", tiled=True).reshape(-1),
                           jax.lax.all_gather(hard_l, "data", tiled=True).reshape(-1), rand_l])
    d = emb.shape[-1]
    grads = jnp.concatenate([g_pos.reshape(-1, d), g_hard.reshape(-1, d), g_rand])
    v, scale = sparse_sgd.sgd_update(v, scale, ids, grads, lr, weight_decay)
    return value, d_emb, v, scale

  specs = {k: BATCH_SPECS[k] for k in BATCH_SPECS if k != "input_ids"}
  return jax.shard_map(body, mesh=mesh,
                       in_specs=(P("data"), P("model"), P(), specs, P()),
                       out_specs=(P(), P("data"), P("model"), P()),
                       # all_gather results are identical across data replicas, which the
                       # vma checker cannot infer; the mesh-equivalence tests check it.
                       check_vma=False)


def shard_params(params: dict, opt_state: dict, mesh: jax.sharding.Mesh):
  """Encoder and optimizer state replicated, V split by rows over 'model'."""
  rep = NamedSharding(mesh, P())
  params = {"encoder": jax.device_put(params["encoder"], rep),
            "classifier": jax.device_put(params["classifier"], NamedSharding(mesh, P("model")))}
  return params, jax.device_put(opt_state, rep)


def shard_batch(batch: dict, mesh: jax.sharding.Mesh) -> dict:
  return {k: jax.device_put(v, NamedSharding(mesh, BATCH_SPECS[k])) for k, v in batch.items()}
