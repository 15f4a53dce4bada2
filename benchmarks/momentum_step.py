"""Sparse classifier step, plain vs momentum (1 x 1 mesh), classifier_bench's shapes:
`python benchmarks/momentum_step.py L` prints the median ms of each (interleaved)."""
import functools, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
from astra_jax import sharding, sparse_momentum
from astra_jax.classifier_bench import B, D, LR, WD, make_batch

L, STEPS_PER_EPOCH = int(float(sys.argv[1])), 2000
mesh = sharding.make_mesh(1, 1)
grads = sharding.classifier_grads(mesh, B)
plain_update = sharding.classifier_update(mesh, WD)
mom_update = sharding.classifier_momentum_update(mesh, WD, 0.9)

@functools.partial(jax.jit, donate_argnums=(0, 1))
def plain(v, scale, emb, batch):
  _, d_emb, rg = grads(emb, v, scale, batch)
  v, scale = plain_update(v, scale, jax.tree.map(lambda x: x[None], rg), jnp.float32(LR))
  return v, scale, d_emb

@functools.partial(jax.jit, donate_argnums=(0, 1))
def momentum(v, state, emb, batch):
  _, d_emb, rg = grads(emb, v, jnp.float32(1.0), batch, state)
  v, state = mom_update(v, state, jax.tree.map(lambda x: x[None], rg), jnp.float32(LR), True)
  return v, state, d_emb

rng = np.random.default_rng(0)
emb = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
batch = make_batch(L, rng)
sp = [0.02 * jax.random.normal(jax.random.key(0), (L, D)), jnp.float32(1.0)]
sm = [0.02 * jax.random.normal(jax.random.key(0), (L, D)), sparse_momentum.init(L, D, STEPS_PER_EPOCH)]
times = {"plain": [], "momentum": []}
for it in range(120):
  for name, fn, st in (("plain", plain, sp), ("momentum", momentum, sm)):
    t = time.perf_counter()
    st[0], st[1], d = fn(st[0], st[1], emb, batch)
    jax.block_until_ready((st[0], d))
    if it >= 20:
      times[name].append(1e3 * (time.perf_counter() - t))
print(L, {k: round(statistics.median(v), 2) for k, v in times.items()})
