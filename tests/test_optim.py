import math

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from astra_jax.training import optim


def cfg(**kw):
  c = ml_collections.ConfigDict(
    dict(
      encoder_lr=1e-3,
      classifier_lr=0.1,
      warmup_steps=10,
      encoder_weight_decay=0.0,
      classifier_weight_decay=0.01,
      classifier_momentum=0.0,
      grad_clip_norm=0.0,
    )
  )
  c.update(kw)
  return c


def test_schedule_warmup_then_cosine():
  s = optim.schedule(1.0, warmup_steps=10, total_steps=110)
  assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
  assert float(s(10)) == pytest.approx(1.0)
  assert float(s(60)) == pytest.approx(0.5, abs=1e-6)  # half-way through the cosine
  assert float(s(110)) == pytest.approx(0.0, abs=1e-7)


def test_warmup_capped_by_the_share_of_a_short_run():
  # 500 warmup steps in a 310-step run at most 10% of it: 31 steps, so the classifier's rate
  # peaks at step 31, then follows the cosine over the remaining 279.
  c = cfg(warmup_steps=500, warmup_max_fraction=0.1)
  assert optim.warmup_steps(c, 310) == 31
  assert optim.warmup_steps(c, 10_000) == 500  # a long run keeps warmup_steps
  assert optim.warmup_steps(cfg(warmup_steps=500), 310) == 310  # no cap but the run itself
  enc, clf = optim.learning_rates(c, 310, 31)
  assert (enc, clf) == (pytest.approx(1e-3), pytest.approx(0.1))
  cosine = 0.1 * 0.5 * (1 + math.cos(math.pi * 139 / 279))
  assert optim.learning_rates(c, 310, 31 + 139)[1] == pytest.approx(cosine, rel=1e-5)


def test_encoder_weight_decay_spares_biases_and_layer_norm():
  tx = optim.encoder_optimizer(cfg(encoder_weight_decay=0.1, warmup_steps=0), total_steps=100)
  params = {"kernel": jnp.ones((2, 3)), "bias": jnp.ones((3,)), "norm_scale": jnp.ones((3,))}
  zeros = {k: jnp.zeros_like(v) for k, v in params.items()}
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], -1e-3 * 0.1 * np.ones((2, 3)), rtol=1e-6)
  assert not np.asarray(updates["bias"]).any() and not np.asarray(updates["norm_scale"]).any()


@pytest.mark.parametrize("eps", [1e-8, 1e-6])
def test_encoder_adam_eps_from_the_config(eps):
  # Adam's first bias-corrected step is lr g / (|g| + eps): for g = 1e-7 that is lr / 1.1
  # with eps = 1e-8 and lr / 11 with Renee's 1e-6. A config without the key gets 1e-8.
  c = cfg(warmup_steps=0) if eps == 1e-8 else cfg(warmup_steps=0, encoder_adam_eps=eps)
  tx = optim.encoder_optimizer(c, total_steps=100)
  params = {"kernel": jnp.ones((2, 2))}
  updates, _ = tx.update({"kernel": jnp.full((2, 2), 1e-7)}, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], -1e-3 * 1e-7 / (1e-7 + eps), rtol=1e-4)


def test_adam_for_encoder_sgd_with_decay_for_classifier():
  tx = optim.make_optimizer(cfg(), total_steps=100)
  params = {"encoder": {"a": jnp.array([1.0, -2.0])}, "classifier": jnp.array([[1.0, 2.0]])}
  grads = {"encoder": {"a": jnp.array([0.5, -4.0])}, "classifier": jnp.array([[0.3, -0.1]])}
  state = tx.init(params)
  for step in range(6):  # step 5: lr = 0.5 * peak during warm-up
    updates, state = tx.update(grads, state, params)
    if step < 5:
      continue
    # SGD + decoupled decay: -lr * (g + wd * w), lr = 0.1 * 5/10
    np.testing.assert_allclose(
      updates["classifier"],
      -0.05 * (np.array([[0.3, -0.1]]) + 0.01 * np.array([[1.0, 2.0]])),
      rtol=1e-5,
    )
    # Adam with a constant gradient: m_hat / sqrt(v_hat) = sign(g), so update = -lr * sign(g)
    np.testing.assert_allclose(updates["encoder"]["a"], -0.5e-3 * np.sign([0.5, -4.0]), rtol=1e-4)
