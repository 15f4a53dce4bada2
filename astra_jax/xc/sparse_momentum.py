"""SGD with momentum and weight decay on the classifier, in O(rows touched) per step.

It reproduces the dense optax chain of optim.py (`add_decayed_weights(wd)` then
`sgd(lr_t, momentum=beta)`, torch's SGD with the decay inside the momentum) exactly:

    m_t = beta m_{t-1} + wd w_{t-1} + g_t,      w_t = w_{t-1} - lr_t m_t.

Within a period of steps each row is kept as two stored vectors (q in W's array, r in the
velocity's), and its (w, m) at step j of the period is the same linear function of them for
every row: four scalars per step, a row of `coefficients`. A row the batch does not touch
keeps its stored vectors and still moves; a touched row gets its gradient times two more
scalars added to each. So the kernel reads a row as a q + b r (two gathers) and the update
is two scatter-adds, with nothing per row but the two vectors. The coordinates are the
step's slow and fast modes, following the learning-rate schedule, so that nothing cancels;
`begin_period` re-bases every row (O(L)) when a period's `capacity` steps are used up, and
`fold` turns rows back into (w, m) for readers outside the step. The derivation, and why
the slow mode needs the schedule's next steps: docs/DESIGN.md, section 3.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

# Columns of `coefficients`: w = a q + b r and m = c q + e r at the row's period step; the
# gradient g of the step that ends there adds f g to q and h g to r.
A, B, C, E, F, H = range(6)

# The fast coordinate is stored divided by its decay since the period began (about
# beta^j), so a period ends before that falls below this: float32 keeps gradients up to
# ~1e8 finite.
_SMALLEST_DECAY = 1e-30
# The slow mode is found by running the step back from this many steps past the period:
# the error of its start shrinks by about beta per step.
_HORIZON_ERROR = 1e-9
_MOST_STEPS_PER_PERIOD = 4096


class MomentumState(NamedTuple):
  """The classifier's momentum state next to W (rows split over 'model' like W).

  velocity: (L, d) each row's fast coordinate r in a period (its velocity m when not in
    one); W's array holds the slow coordinate q.
  period_step: () int32, the applied steps since the period began.
  coefficients: (capacity + 2, 6) float32, row j: the columns A..H above at period step j
    (row 0: no gradient); row capacity + 1 is NaN, so a step past the period poisons W
    rather than being silently wrong. Outside a period: the identity reading at row 0.
  in_period: () bool, False after `init` and `fold` (the arrays hold W and m themselves).
  """

  velocity: jax.Array
  period_step: jax.Array
  coefficients: jax.Array
  in_period: jax.Array

  @property
  def capacity(self) -> int:
    """The applied steps a period holds."""
    return self.coefficients.shape[0] - 2


# The state's layout on the mesh: the velocity split like W, the scalars replicated.
MOMENTUM_SPEC = MomentumState(P("model"), P(), P(), P())


def momentum_shardings(mesh: jax.sharding.Mesh) -> MomentumState:
  """MOMENTUM_SPEC as shardings on `mesh`."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), MOMENTUM_SPEC)


def period_capacity(beta: float) -> int:
  """The applied steps of a period for momentum `beta` (0 < beta < 1): the fast mode decays
  about beta per step and must stay above _SMALLEST_DECAY (655 steps at beta = 0.9)."""
  return max(1, min(_MOST_STEPS_PER_PERIOD, int(math.log(_SMALLEST_DECAY) / math.log(beta))))


def _horizon(beta: float) -> int:
  return max(1, math.ceil(math.log(_HORIZON_ERROR) / math.log(beta)))


def _outside_coefficients(capacity: int) -> jax.Array:
  """Row 0 reads (w, m) as they are; every later row is NaN."""
  nan = jnp.full((capacity + 2, 6), jnp.nan, jnp.float32)
  return nan.at[0].set(jnp.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], jnp.float32))


def init(rows: int, dim: int, capacity: int) -> MomentumState:
  """Zero velocity (float32, like W: the fast coordinate is stored scaled by up to
  1 / _SMALLEST_DECAY), outside a period of `capacity` steps (at least 1)."""
  return MomentumState(
    jnp.zeros((rows, dim), jnp.float32),
    jnp.int32(0),
    _outside_coefficients(max(1, int(capacity))),
    jnp.bool_(False),
  )


def period_coefficients(
  lrs: jax.Array, capacity: int, weight_decay: float, beta: float
) -> jax.Array:
  """The (capacity + 2, 6) `coefficients` of a period whose step j uses lr lrs[j - 1].

  lrs: (n,) with n > capacity; the steps past the capacity only steer the slow mode.

  In the coordinates q = w - s_j m, r = m - p_j q, the step's 2 x 2 map (w, m) -> (w', m')
  becomes diag(mu_j, nu_j) when s_{j-1} = beta (lr_j + s_j) / mu_j with mu_j = 1 - wd (lr_j
  + s_j), and p_j = (wd + nu_j p_{j-1}) / mu_j with nu_j = beta + wd s_{j-1}. s runs
  backwards from the horizon (stable: the slow mode), p forwards from 0 (stable: the fast
  one). Any s, p that satisfy these are exact; these keep q near w and r near m. The modes
  are real while lr wd <= (1 - sqrt(beta))^2 for every lr; past that the coefficients are
  NaN."""
  wd = jnp.float32(weight_decay)

  def back(s, lr):
    x = lr + s
    mu = 1.0 - wd * x
    return beta * x / mu, (s, mu)

  s0, (s, mu) = jax.lax.scan(back, jnp.float32(0.0), lrs.astype(jnp.float32), reverse=True)
  s, mu, lrs = s[:capacity], mu[:capacity], lrs[:capacity].astype(jnp.float32)
  s_before = jnp.concatenate([s0[None], s[:-1]])

  def forward(carry, x):
    p, m_decay, r_decay = carry
    s_prev, mu_j = x
    nu = beta + wd * s_prev
    p = (wd + nu * p) / mu_j
    carry = (p, m_decay * mu_j, r_decay * nu)
    return carry, carry

  one = jnp.float32(1.0)
  _, (p, md, rd) = jax.lax.scan(forward, (jnp.float32(0.0), one, one), (s_before, mu))
  step = lrs + s
  later = jnp.stack(
    [(1.0 + s * p) * md, s * rd, p * md, rd, -step / md, (1.0 + p * step) / rd], axis=1
  )
  # Period step 0: q = w - s_0 m, r = m, no decay yet and no gradient.
  first = jnp.stack([one, s0, 0.0 * one, one, 0.0 * one, 0.0 * one])
  rows = jnp.concatenate([first[None], later])
  # Past lr wd = (1 - sqrt(beta))^2 the step's modes are complex and s has no fixed point:
  # what would then be inaccurate is NaN instead (config/training.py refuses such configs).
  real = (mu > 0).all() & (s >= 0).all()
  rows = jnp.where(real, rows, jnp.nan)
  return jnp.concatenate([rows, jnp.full((1, 6), jnp.nan, jnp.float32)])


def _read(coef: jax.Array, q: jax.Array, r: jax.Array) -> tuple[jax.Array, jax.Array]:
  return coef[A] * q + coef[B] * r, coef[C] * q + coef[E] * r


def current_rows(w: jax.Array, state: MomentumState, ids: jax.Array) -> jax.Array:
  """W's rows `ids` (any shape, in range) at period_step."""
  coef = state.coefficients[state.period_step]
  flat = ids.reshape(-1)
  rows = coef[A] * w[flat].astype(jnp.float32) + coef[B] * state.velocity[flat].astype(jnp.float32)
  return rows.reshape(*ids.shape, w.shape[-1])


def begin_step(state: MomentumState, apply: jax.Array | bool = True) -> MomentumState:
  """The state one applied step later (unchanged where `apply` is False, a skipped step:
  the schedule's step does not advance either)."""
  return state._replace(period_step=state.period_step + jnp.asarray(apply, jnp.int32))


def add_gradients(
  w: jax.Array,
  state: MomentumState,
  ids: jax.Array,
  grads: jax.Array,
  apply: jax.Array | bool = True,
) -> tuple[jax.Array, MomentumState]:
  """After `begin_step`: adds rows `ids`' (n,) gradients grads (n, d) (duplicates add up;
  ids out of range, another shard's rows or padding, are dropped). Calling it once per
  block of a step's gradients accumulates exactly; nothing where `apply` is False (with
  finite gradients)."""
  # Two scalars, not the gradients, are zeroed for a skipped step: the train step already
  # zeroes a skipped step's (non-finite) gradients.
  to_q, to_r = jnp.where(apply, state.coefficients[state.period_step, F:], 0.0)
  grads = grads.astype(jnp.float32)
  w = w.at[ids].add((to_q * grads).astype(w.dtype), mode="drop")
  m = state.velocity.at[ids].add((to_r * grads).astype(state.velocity.dtype), mode="drop")
  return w, state._replace(velocity=m)


def leave_period(w: jax.Array, state: MomentumState) -> tuple[jax.Array, MomentumState]:
  """Every row's (w, m) at period_step, outside a period: the true W and velocity (O(L)).
  Shard-local: works on one shard's rows as on all of them."""
  w_now, m_now = _read(
    state.coefficients[state.period_step],
    w.astype(jnp.float32),
    state.velocity.astype(jnp.float32),
  )
  return w_now.astype(w.dtype), MomentumState(
    m_now.astype(state.velocity.dtype),
    jnp.zeros_like(state.period_step),
    _outside_coefficients(state.capacity),
    jnp.bool_(False),
  )


def enter_period(
  w: jax.Array, state: MomentumState, coefficients: jax.Array
) -> tuple[jax.Array, MomentumState]:
  """From outside a period (`leave_period`'s output) into one with `coefficients`: each
  row's (w, m) in the coordinates of its step 0 (O(L))."""
  c = coefficients[0]
  det = c[A] * c[E] - c[B] * c[C]
  w32, m32 = w.astype(jnp.float32), state.velocity.astype(jnp.float32)
  q = (c[E] * w32 - c[B] * m32) / det
  r = (c[A] * m32 - c[C] * w32) / det
  return q.astype(w.dtype), MomentumState(
    r.astype(state.velocity.dtype), jnp.zeros_like(state.period_step), coefficients, jnp.bool_(True)
  )


def begin_period(
  w: jax.Array,
  state: MomentumState,
  lr_schedule: Callable[[jax.Array], jax.Array],
  first_step: jax.Array,
  weight_decay: float,
  beta: float,
) -> tuple[jax.Array, MomentumState]:
  """A new period from where the state is (in a period or not): its steps use
  lr_schedule(first_step + j - 1) at period step j, as the train step does at applied step
  first_step + j - 1. O(L)."""
  capacity = state.capacity
  lrs = jax.vmap(lr_schedule)(first_step + jnp.arange(capacity + _horizon(beta)))
  coefficients = period_coefficients(lrs, capacity, weight_decay, beta)
  return enter_period(*leave_period(w, state), coefficients)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def fold(w: jax.Array, state: MomentumState) -> tuple[jax.Array, MomentumState]:
  """`leave_period`, jitted with W and the state donated (rows keep their sharding)."""
  return leave_period(w, state)
