"""The train steps as pure functions of one typed state: (state, batch, key) -> (state, loss,
E(x) before embedding dropout).

Both steps read and write the same `TrainState`, so the loop that drives them has no branch
on which one runs. The sparse step is ASTRA's: W = scale * V (or read from V and its
momentum's velocity, sparse_momentum.py), gradients only for the rows a batch touches. The
dense step differentiates w.r.t. all of W through optax (the `uptodate` oracle, the full-L
baseline, and the reference the sparse step is tested against); its `scale` stays 1, its
`step` counts every step (it never skips) and it has no momentum state of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec as P

from astra_jax.data.batch import LabelBatch, TrainBatch
from astra_jax.training import loss_scale, table_rows
from astra_jax.xc import classifier, loss, sparse_momentum
from astra_jax.xc.sparse_momentum import MomentumState


@struct.dataclass
class TrainState:
  """Everything a step reads and writes; a pytree, donated to the step.

  encoder: the encoder's nnx.Param state.
  classifier: (L', d) V of W = scale * V (sparse) or W itself (dense); L' = L padded to a
    multiple of the mesh's model axis.
  opt: optax state: of the encoder's chain (sparse), of the whole chain over
    {"encoder", "classifier"} (dense).
  scale: () float32, W = scale * V (1 for the dense step and after a fold).
  step: () int32, the updates applied (dynamic loss scaling's skipped steps not counted).
  loss_scale: loss_scale.py's state (unused by the dense step).
  momentum: the classifier's momentum state (sparse step with momentum), else None.
  trainable: (L',) bool split over 'model' like V, the rows a step may change
    (`train.freeze_old_rows`), else None: every row.
  dense: which step's optimizer state `opt` is (static: it fixes the checkpoint layout).
  """

  encoder: Any
  classifier: jax.Array
  opt: optax.OptState
  scale: jax.Array
  step: jax.Array
  loss_scale: dict
  momentum: MomentumState | None = None
  trainable: jax.Array | None = None
  dense: bool = struct.field(pytree_node=False, default=False)

  @property
  def params(self) -> dict:
    """{"encoder", "classifier"}: the layout evaluation, export and the dense chain read."""
    return {"encoder": self.encoder, "classifier": self.classifier}


StepFn = Callable[[TrainState, TrainBatch, jax.Array], tuple[TrainState, jax.Array, jax.Array]]


class Steps(NamedTuple):
  """The jitted steps of a run. mining: the `uptodate` step that mines k_h inside the step
  (used from tau_s on, when the schedule asks for hard negatives), else None."""

  train: StepFn
  mining: StepFn | None = None

  def for_epoch(self, num_hard: int) -> StepFn:
    return self.mining if self.mining is not None and num_hard else self.train


# ------------------------------------------------------------------------------ state
def init_sparse_state(
  tx_encoder: optax.GradientTransformation,
  params: dict,
  initial_loss_scale: float = 1.0,
  momentum_period: int = 0,
  mesh: jax.sharding.Mesh | None = None,
  trainable: jax.Array | None = None,
) -> TrainState:
  """The sparse step's state.

  Args:
    tx_encoder: the encoder's optax chain (optim.encoder_optimizer).
    params: {"encoder", "classifier"}.
    initial_loss_scale: loss_scale.py's starting scale.
    momentum_period: > 0 adds the classifier's momentum state (sparse_momentum.py) whose
      periods hold that many applied steps (sparse_momentum.period_capacity(beta)).
    mesh: where the momentum's per-row arrays are born, split over 'model' like W (never
      whole on one device); None: the default device.
    trainable: the rows a step may change (TrainState.trainable), None: all.
  Returns:
    The state on the devices `params` are on (`shard_state` lays it out on the mesh).
  """
  momentum = None
  if momentum_period:
    make = functools.partial(sparse_momentum.init, *params["classifier"].shape, momentum_period)
    momentum = (
      make()
      if mesh is None
      else jax.jit(make, out_shardings=sparse_momentum.momentum_shardings(mesh))()
    )
  return TrainState(
    encoder=params["encoder"],
    classifier=params["classifier"],
    opt=tx_encoder.init(params["encoder"]),
    scale=jnp.float32(1.0),
    step=jnp.int32(0),
    loss_scale=loss_scale.init(initial_loss_scale),
    momentum=momentum,
    trainable=trainable,
  )


def init_dense_state(tx: optax.GradientTransformation, params: dict) -> TrainState:
  """The dense step's state: optax's over all of {"encoder", "classifier"}."""
  return TrainState(
    encoder=params["encoder"],
    classifier=params["classifier"],
    opt=tx.init(params),
    scale=jnp.float32(1.0),
    step=jnp.int32(0),
    loss_scale=loss_scale.init(1.0),
    momentum=None,
    dense=True,
  )


def shard_params(params: dict, opt_state: dict, mesh: jax.sharding.Mesh) -> tuple[dict, dict]:
  """Encoder and optimizer state replicated, V (and the classifier's momentum state's
  per-row arrays, and its trainable rows) split by rows over 'model'.

  Args:
    params: {"encoder", "classifier"}.
    opt_state: the optimizer state, with "momentum" (a MomentumState) and "trainable" when
      there are.
    mesh: the (data, model) mesh.
  Returns:
    (params, opt_state) placed on `mesh`.
  """
  rep = NamedSharding(mesh, P())
  params = {
    "encoder": jax.device_put(params["encoder"], rep),
    "classifier": jax.device_put(params["classifier"], NamedSharding(mesh, P("model"))),
  }
  rest = {k: v for k, v in opt_state.items() if k not in ("momentum", "trainable")}
  out = jax.device_put(rest, rep)
  if "momentum" in opt_state:
    out["momentum"] = jax.device_put(
      opt_state["momentum"], sparse_momentum.momentum_shardings(mesh)
    )
  if "trainable" in opt_state:
    out["trainable"] = jax.device_put(opt_state["trainable"], NamedSharding(mesh, P("model")))
  return params, out


def shard_state(state: TrainState, mesh) -> TrainState:
  """Encoder and optimizer state replicated, V and the momentum's per-row arrays split by
  rows over 'model' (shard_params)."""
  params, opt = shard_params(state.params, _sparse_opt_dict(state), mesh)
  return _from_sparse_opt_dict(params, opt)


def fold_classifier(state: TrainState) -> TrainState:
  """W = scale * V back into V, or every row's (w, m) out of its momentum period's
  coordinates: afterwards `state.classifier` is W itself. O(L); a no-op in value for the
  dense step (scale 1)."""
  if state.momentum is not None:
    w, momentum = sparse_momentum.fold(state.classifier, state.momentum)
    return state.replace(classifier=w, momentum=momentum)
  w, scale = classifier.fold(state.classifier, state.scale)
  return state.replace(classifier=w, scale=scale)


# ------------------------------------------------- the layout checkpoints hold
def saved_layout(state: TrainState) -> tuple[dict, Any]:
  """(params, opt_state) as checkpoint.Checkpoints saves them: the sparse step's optimizer
  state a dict {"encoder", "scale", "step", "loss_scale"[, "momentum"][, "trainable"]}, the
  dense step's optax's own state (the layout every checkpoint on disk has)."""
  return state.params, (state.opt if state.dense else _sparse_opt_dict(state))


def from_saved(like: TrainState, params: dict, opt_state: Any, global_step: int) -> TrainState:
  """The state `saved_layout` wrote, of the same step as `like`; the dense step's applied
  steps are its global steps (it never skips one)."""
  if like.dense:
    return like.replace(
      encoder=params["encoder"],
      classifier=params["classifier"],
      opt=opt_state,
      step=jnp.int32(global_step),
    )
  return _from_sparse_opt_dict(params, opt_state)


def _sparse_opt_dict(state: TrainState) -> dict:
  opt = {
    "encoder": state.opt,
    "scale": state.scale,
    "step": state.step,
    "loss_scale": state.loss_scale,
  }
  if state.momentum is not None:
    opt["momentum"] = state.momentum
  if state.trainable is not None:
    opt["trainable"] = state.trainable
  return opt


def _from_sparse_opt_dict(params: dict, opt: dict) -> TrainState:
  return TrainState(
    encoder=params["encoder"],
    classifier=params["classifier"],
    opt=opt["encoder"],
    scale=opt["scale"],
    step=opt["step"],
    loss_scale=opt["loss_scale"],
    momentum=opt.get("momentum"),
    trainable=opt.get("trainable"),
  )


# ------------------------------------------------------------------------------ steps
def mine_in_step(emb: jax.Array, w: jax.Array, labels: LabelBatch, k: int) -> LabelBatch:
  """The `uptodate` oracle: each query's k top-scoring non-positive labels under the current
  W and E(x), exact over all L (O(B L) per step: small L only). Every positive is excluded
  (labels.all_pos_ids, padded with -1), not only the k_p kept."""
  scores = jax.lax.stop_gradient(emb @ w.T)
  rows = jnp.arange(emb.shape[0])[:, None]
  pos = jnp.where(labels.all_pos_ids >= 0, labels.all_pos_ids, w.shape[0])  # -> dropped
  scores = scores.at[rows, pos].set(-jnp.inf, mode="drop")
  _, hard = jax.lax.top_k(scores, k)
  rand = labels.rand_ids if labels.per_query_random else labels.rand_ids[None]
  hit = (rand[:, :, None] == hard[:, None, :]).any(-1)
  return labels._replace(
    hard_ids=hard.astype(jnp.int32),
    hard_mask=jnp.ones_like(hard, bool),
    rand_mask=labels.rand_mask & ~hit,
  )


def encode(graphdef, enc_params, ids: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Training-mode E(x): (after the embedding dropout, before it). The pre-dropout
  embeddings are what the hard-negative refresh collects."""
  encoder = nnx.merge(graphdef, enc_params)
  pooled = encoder.pooled(ids, dropout_key=key)
  return encoder.embedding_dropout(pooled, key), pooled


def _micro_keys(key: jax.Array, n: int) -> jax.Array:
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))


def make_train_step(
  graphdef, tx: optax.GradientTransformation, uptodate_k: int = 0, full_block: int = 0
) -> StepFn:
  """The dense step (one device): autodiff w.r.t. all of W and the optax chain of optim.py.

  Batch arrays are (A, B/A, ...): the gradients of the A micro-batches are summed before
  the update.

  Args:
    graphdef: the encoder's nnx graph definition.
    tx: the optax chain over {"encoder", "classifier"} (optim.make_optimizer).
    uptodate_k: > 0: the `uptodate` oracle, k hard negatives mined in the step.
    full_block: > 0: the full-L BCE (all labels, in blocks of that many) instead of the
      estimator, over every positive of a query (labels.all_pos_ids), not only the k_p
      sampled.
  Returns:
    step(state, batch, key) -> (state, loss, E(x) before embedding dropout (B, d)), jitted,
    the state donated (with momentum, inside `MomentumPeriods`).
  """

  def loss_fn(params, batch: TrainBatch, key, num_micro):
    emb, pooled = encode(graphdef, params["encoder"], batch.input_ids, key)
    labels = batch.labels
    if full_block:
      value = loss.full_bce_chunked(
        emb, params["classifier"], labels.all_pos_ids, labels.all_pos_ids >= 0, full_block
      )
    else:
      if uptodate_k:
        labels = mine_in_step(pooled, params["classifier"], labels, uptodate_k)
      value = loss.sampled_bce(emb, params["classifier"], labels)
    return value / num_micro, pooled

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train_step(state: TrainState, batch: TrainBatch, key: jax.Array):
    params = state.params
    a = batch.input_ids.shape[0]

    def micro(acc, xs):
      mb, k = xs
      (value, pooled), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb, k, a)
      return jax.tree.map(jnp.add, acc, grads), (value, pooled)

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, (values, pooled) = jax.lax.scan(micro, zeros, (batch, _micro_keys(key, a)))
    updates, opt = tx.update(grads, state.opt, params)
    params = optax.apply_updates(params, updates)
    state = state.replace(
      encoder=params["encoder"], classifier=params["classifier"], opt=opt, step=state.step + 1
    )
    return state, values.sum(), pooled.reshape(-1, pooled.shape[-1])

  return train_step


def make_sparse_train_step(
  graphdef,
  tx_encoder: optax.GradientTransformation,
  lr_schedule,
  weight_decay: float,
  mesh,
  global_batch: int,
  loss_scaling: str = "off",
  momentum: float = 0.0,
  train_encoder: bool = True,
  lookup_table: tuple[str, ...] = (),
) -> StepFn:
  """The ASTRA step on a (data, model) mesh (1 x 1 on one device), O(rows touched) in W.

  The encoder runs data-parallel under jit's partitioning; the classifier through
  `classifier.classifier_grads` (gradients w.r.t. the gathered rows of W = scale * V, never
  the (L, d) matrix); the encoder's gradient is the VJP of its forward pass with the
  kernel's dloss/dE(x). Batch arrays are (A, B/A, ...): a scan over the A micro-batches
  sums the encoder gradients and collects the row gradients (factored: dloss/dscore and the
  embeddings, not rows x d), then one Adam step and one `classifier.classifier_update` step
  into the donated V. W is the same for all micro-batches, as in the dense step. With
  momentum, `classifier.classifier_momentum_step` adds each block of queries' gradients as
  it goes (exact: a step's gradient leaves the W it reads unchanged), except where dynamic
  loss scaling may skip the step: there the update follows the micro-batches, as without.

  Args:
    graphdef: the encoder's nnx graph definition.
    tx_encoder: the encoder's optax chain.
    lr_schedule: the classifier's learning rate by applied step.
    weight_decay: the classifier's decoupled weight decay.
    mesh: the (data, model) mesh.
    global_batch: B, the queries of a step over all devices.
    loss_scaling: off | static | dynamic (loss_scale.py); with dynamic, a step with
      non-finite gradients changes nothing but the scale.
    momentum: > 0: SGD with that momentum (decay inside it, as the dense chain), through
      `classifier.classifier_momentum_update`; W is then read from V and the velocity in
      the coordinates of a momentum period (sparse_momentum.py), not scale * V.
    train_encoder: False: the encoder is left as it is and its backward pass is skipped
      (`train.freeze_encoder`). The rows a step may change are `state.trainable`'s.
    lookup_table: the encoder's lookup table, updated only where the batch reads it
      (`optim.encoder_table_update=rows`, table_rows.py); (): all of it.
  Returns:
    step(state, batch, key) -> (state, loss, E(x) before embedding dropout (B, d)), jitted,
    the state donated (with momentum, inside `MomentumPeriods`).
  """
  # Momentum applies each block's gradients as it goes unless the step may be skipped.
  fused = bool(momentum) and loss_scaling != "dynamic"
  if fused:
    momentum_step = classifier.classifier_momentum_step(mesh, global_batch)
  else:
    grads_kernel = classifier.classifier_grads(mesh, global_batch)
    update_kernel = (
      classifier.classifier_momentum_update(mesh)
      if momentum
      else classifier.classifier_update(mesh, weight_decay)
    )

  by_rows = tuple(lookup_table) if train_encoder else ()

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train_step(state: TrainState, batch: TrainBatch, key: jax.Array):
    v, scale = state.classifier, state.scale
    s = state.loss_scale["scale"] if loss_scaling != "off" else jnp.float32(1.0)
    a = batch.input_ids.shape[0]
    enc_params, read = state.encoder, None  # with by_rows: the table cut to the batch's rows
    if by_rows:
      read, enc_params = table_rows.cut(graphdef, state.encoder, batch.input_ids, by_rows)

    def classify(w, velocity, emb, labels):
      """(loss, dloss/demb, W, velocity, row gradients left to apply) of a micro-batch; W
      and the velocity are carried through the micro-batches only where they change."""
      if fused:
        momentum_state = state.momentum._replace(velocity=velocity)
        value, d_emb, w, momentum_state = momentum_step(
          emb, w, momentum_state, labels, state.trainable
        )
        return value, d_emb, w, momentum_state.velocity, ()
      value, d_emb, row_grads = grads_kernel(emb, v, scale, labels, state.momentum)
      return value, d_emb, w, velocity, row_grads

    def micro(carry, xs):
      acc, w, velocity = carry
      mb, k, local = xs
      if not train_encoder:
        emb, pooled = encode(graphdef, state.encoder, mb.input_ids, k)
        value, _, w, velocity, row_grads = classify(w, velocity, emb, mb.labels)
        return (acc, w, velocity), (value, row_grads, pooled)
      forward = lambda p: encode(graphdef, p, mb.input_ids, k)
      if by_rows:
        forward = lambda p: table_rows.encode(graphdef, p, local[0], local[1], k)
      emb, enc_vjp, pooled = jax.vjp(forward, enc_params, has_aux=True)
      value, d_emb, w, velocity, row_grads = classify(w, velocity, emb, mb.labels)
      (g_enc,) = enc_vjp((d_emb.astype(jnp.float32) * s).astype(emb.dtype))
      return (jax.tree.map(jnp.add, acc, g_enc), w, velocity), (value, row_grads, pooled)

    zeros = jax.tree.map(jnp.zeros_like, enc_params) if train_encoder else ()
    carried = (v, state.momentum.velocity) if fused else ((), ())
    locals_ = (read.local, read.mask) if by_rows else ()
    (g_enc, *carried), (values, row_grads, pooled) = jax.lax.scan(
      micro, (zeros, *carried), (batch, _micro_keys(key, a), locals_)
    )
    if fused:
      v, velocity = carried
    g_enc = jax.tree.map(lambda g: g / s, g_enc)
    value = values.sum()
    ok = jnp.bool_(True)
    if loss_scaling == "dynamic":
      ok = loss_scale.all_finite((g_enc, row_grads)) & jnp.isfinite(value)
      # lr 0 alone would still add 0 * inf = nan to V
      row_grads = jax.tree.map(
        lambda g: jnp.where(ok, g, 0.0) if jnp.issubdtype(g.dtype, jnp.floating) else g, row_grads
      )
    encoder, enc_opt = state.encoder, state.opt
    if by_rows:  # Adam on the rows read and their moments, written back (table_rows.py)
      encoder, enc_opt = table_rows.update(tx_encoder, g_enc, enc_params, state, by_rows, read)
    elif train_encoder:
      updates, enc_opt = tx_encoder.update(g_enc, state.opt, state.encoder)
      encoder = optax.apply_updates(state.encoder, updates)
    momentum_state = state.momentum
    if fused:  # the gradients are in; the learning rates are in the period's coefficients
      momentum_state = sparse_momentum.begin_step(state.momentum._replace(velocity=velocity))
    elif momentum:
      v, momentum_state = update_kernel(v, state.momentum, row_grads, ok, state.trainable)
    else:
      lr = jnp.where(ok, lr_schedule(state.step), 0.0)
      v, scale = update_kernel(v, scale, row_grads, lr, state.trainable)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
    new_loss_scale = (
      loss_scale.adjust(state.loss_scale, ok) if loss_scaling == "dynamic" else state.loss_scale
    )
    state = state.replace(
      encoder=keep(encoder, state.encoder),
      classifier=v,
      opt=keep(enc_opt, state.opt),
      scale=scale,
      step=state.step + ok.astype(jnp.int32),
      loss_scale=new_loss_scale,
      momentum=momentum_state,
    )
    return state, value, pooled.reshape(-1, pooled.shape[-1])

  if momentum:
    return MomentumPeriods(train_step, make_begin_period(lr_schedule, weight_decay, momentum))
  return train_step


def make_begin_period(lr_schedule, weight_decay: float, beta: float) -> Callable:
  """state -> state in a new momentum period that starts at its applied step
  (sparse_momentum.begin_period), jitted with the state donated. O(L)."""

  @functools.partial(jax.jit, donate_argnums=(0,))
  def begin(state: TrainState) -> TrainState:
    w, momentum = sparse_momentum.begin_period(
      state.classifier, state.momentum, lr_schedule, state.step, weight_decay, beta
    )
    return state.replace(classifier=w, momentum=momentum)

  return begin


class MomentumPeriods:
  """The sparse step with classifier momentum, beginning a momentum period (an O(L)
  re-base, `make_begin_period`) before the steps that need one: a state outside a period
  (fresh or folded), one whose period is used up, and every `capacity` steps after.

  It counts the steps it takes on the state it returned, so the device is read only for a
  state it did not return (fresh, folded or restored from a checkpoint, whose period goes
  on where it stopped): a resumed run begins its periods at the steps an uninterrupted one
  does. A skipped step (dynamic loss scaling) counts here but not in the period, so a
  period may end a few steps early; where periods begin changes W only by float rounding."""

  def __init__(self, step: StepFn, begin: Callable):
    self.step, self.begin = step, begin
    self._last, self._left = None, 0

  def __call__(self, state: TrainState, batch, key: jax.Array):
    if state is not self._last:
      m = state.momentum
      self._left = m.capacity - int(m.period_step) if bool(m.in_period) else 0
    if self._left <= 0:
      state = self.begin(state)
      self._left = state.momentum.capacity
    state, value, pooled = self.step(state, batch, key)
    self._left -= 1
    self._last = state
    return state, value, pooled
