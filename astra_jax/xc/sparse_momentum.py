"""SGD with momentum and weight decay on the classifier, in O(rows touched) per step.

It reproduces the dense optax chain of optim.py (`add_decayed_weights(wd)` then
`sgd(lr_t, momentum=beta)`, torch's SGD with the decay inside the momentum) exactly:

    m_t = beta m_{t-1} + wd w_{t-1} + g_t,      w_t = w_{t-1} - lr_t m_t.

Each row keeps (w, m) as of the step it was last touched (`touched_at`) and is caught up
when a step reads it, through the product of the 2 x 2 transitions of the steps since, kept
for every possible last step in one table (`to_now`); a fold at epoch ends catches every
row up in O(L). Why a table of products and not prefix products (nothing divides, so long
gaps stay exact), and the memory it takes: see docs/DESIGN.md, section 3.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


class MomentumState(NamedTuple):
  """The classifier's momentum state next to W (rows split over 'model' like W).

  velocity: (L, d) m of each row as of its touched_at step.
  touched_at: (L,) int32, the step (since the last fold) the row's W and velocity hold.
  to_now: (C + 1, 2, 2) float32, entry s = Phi(period_step, s) (the identity for
    s >= period_step).
  period_step: () int32, steps since the last fold.
  """

  velocity: jax.Array
  touched_at: jax.Array
  to_now: jax.Array
  period_step: jax.Array


# The state's layout on the mesh: per-row arrays split like W, the catch-up table replicated.
MOMENTUM_SPEC = MomentumState(P("model"), P("model"), P(), P())


def momentum_shardings(mesh: jax.sharding.Mesh) -> MomentumState:
  """MOMENTUM_SPEC as shardings on `mesh`."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), MOMENTUM_SPEC)


def _identities(n: int) -> jax.Array:
  return jnp.broadcast_to(jnp.eye(2, dtype=jnp.float32), (n, 2, 2))


def init(rows: int, dim: int, steps_between_folds: int, dtype=jnp.float32) -> MomentumState:
  """Zero velocity, every row current at step 0, an identity table for
  `steps_between_folds` steps (at least 1)."""
  return MomentumState(
    jnp.zeros((rows, dim), dtype),
    jnp.zeros((rows,), jnp.int32),
    _identities(max(1, int(steps_between_folds)) + 1),
    jnp.int32(0),
  )


def step_matrix(
  lr: jax.Array, weight_decay: float, beta: float, apply: jax.Array | bool = True
) -> jax.Array:
  """A_t of docs/DESIGN.md, section 3; the identity where `apply` is False (a skipped step)."""
  lr = jnp.asarray(lr, jnp.float32)
  a = jnp.stack(
    [
      jnp.stack([1.0 - lr * weight_decay, -lr * beta]),
      jnp.stack([jnp.float32(weight_decay), jnp.float32(beta)]),
    ]
  )
  return jnp.where(apply, a, jnp.eye(2, dtype=jnp.float32))


def advance(to_now: jax.Array, period_step: jax.Array, a: jax.Array) -> jax.Array:
  """The table one step later: entries s <= period_step become a @ entry (entry
  period_step, the identity, becomes a); later ones stay the identity. Written out
  element-wise: (C + 1) x 8 multiply-adds, no batched dot."""
  product = (
    a[None, :, 0, None] * to_now[:, None, 0, :] + a[None, :, 1, None] * to_now[:, None, 1, :]
  )
  earlier = jnp.arange(to_now.shape[0]) <= period_step
  return jnp.where(earlier[:, None, None], product, to_now)


def _catch_up(
  state: MomentumState, w_old: jax.Array, m_old: jax.Array, ids: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(w, m) of rows `ids` (n,) at period_step from their values (n, d) as of touched_at."""
  phi = state.to_now[state.touched_at[ids]]
  w_now = phi[:, 0, 0, None] * w_old + phi[:, 0, 1, None] * m_old
  m_now = phi[:, 1, 0, None] * w_old + phi[:, 1, 1, None] * m_old
  return w_now, m_now


def current_rows(w: jax.Array, state: MomentumState, ids: jax.Array) -> jax.Array:
  """W's rows `ids` (any shape, in range) at period_step, caught up from touched_at."""
  flat = ids.reshape(-1)
  phi = state.to_now[state.touched_at[flat]]
  rows = phi[:, 0, 0, None] * w[flat].astype(jnp.float32) + phi[:, 0, 1, None] * state.velocity[
    flat
  ].astype(jnp.float32)
  return rows.reshape(*ids.shape, w.shape[-1])


def begin_step(
  state: MomentumState,
  lr: jax.Array,
  weight_decay: float,
  beta: float,
  apply: jax.Array | bool = True,
) -> MomentumState:
  """Applies this step's A_t (identity if not `apply`) to the table and advances
  period_step: rows are then caught up to the step's end, before its gradient."""
  a = step_matrix(lr, weight_decay, beta, apply)
  return state._replace(
    to_now=advance(state.to_now, state.period_step, a), period_step=state.period_step + 1
  )


def add_gradients(
  w: jax.Array, state: MomentumState, ids: jax.Array, grads: jax.Array, lr: jax.Array
) -> tuple[jax.Array, MomentumState]:
  """After `begin_step`: catches rows `ids` (n,) up to period_step, then adds their
  gradients grads (n, d): m += g, w -= lr g (duplicates add up). Ids out of range (another
  shard's rows, padding) are dropped. Rows already current (touched earlier in the same
  step) get Phi = I: calling this once per micro-batch accumulates exactly."""
  rows = w.shape[0]
  safe = jnp.clip(ids, 0, rows - 1)
  w_old = w[safe].astype(jnp.float32)
  m_old = state.velocity[safe].astype(jnp.float32)
  w_now, m_now = _catch_up(state, w_old, m_old, safe)
  # One scatter-add per array, as the plain update does: a `set` of the caught-up rows
  # followed by an `add` of the gradients made XLA copy W and the velocity (O(L) per
  # step). The catch-up enters as a delta from one occurrence of each row only (every
  # duplicate computes the same caught-up value).
  first, marked = _first_occurrence(state.touched_at, ids, safe)
  grads = grads.astype(jnp.float32)
  w_delta = jnp.where(first[:, None], w_now - w_old, 0.0) - lr * grads
  m_delta = jnp.where(first[:, None], m_now - m_old, 0.0) + grads
  w = w.at[ids].add(w_delta.astype(w.dtype), mode="drop")
  m = state.velocity.at[ids].add(m_delta.astype(state.velocity.dtype), mode="drop")
  touched = marked.at[ids].set(state.period_step, mode="drop")
  return w, state._replace(velocity=m, touched_at=touched)


def _first_occurrence(
  touched_at: jax.Array, ids: jax.Array, safe: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(n,) bool, ids[i] is the first occurrence of its row, and touched_at with rows `ids`
  overwritten by markers (every touched row must be set afterwards).

  The marker of occurrence i is i - n < 0 <= any step, so a scatter-min into touched_at
  leaves each row holding its first occurrence's marker: O(n) and in place, where an
  argsort of the ids cost more than the rest of the update."""
  n = ids.shape[0]
  marker = jnp.arange(n, dtype=jnp.int32) - n
  marked = touched_at.at[ids].min(marker, mode="drop")
  return marked[safe] == marker, marked


def catch_up_all(w: jax.Array, state: MomentumState) -> tuple[jax.Array, MomentumState]:
  """Every row at period_step, touched_at = 0 and an identity table: the true W and
  velocity (O(L)). Shard-local: works on one shard's rows as on all of them."""
  w_now, m_now = _catch_up(
    state, w.astype(jnp.float32), state.velocity.astype(jnp.float32), jnp.arange(w.shape[0])
  )
  return w_now.astype(w.dtype), MomentumState(
    m_now.astype(state.velocity.dtype),
    jnp.zeros_like(state.touched_at),
    _identities(state.to_now.shape[0]),
    jnp.zeros_like(state.period_step),
  )


@functools.partial(jax.jit, donate_argnums=(0, 1))
def fold(w: jax.Array, state: MomentumState) -> tuple[jax.Array, MomentumState]:
  """`catch_up_all`, jitted with W and the state donated (rows keep their sharding)."""
  return catch_up_all(w, state)
