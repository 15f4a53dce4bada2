"""The lexical pairs' kernel weights (evaluation/weight_reads.py) against the score they
stand for."""

import numpy as np
import pytest

from astra_jax.evaluation import weight_reads


@pytest.mark.parametrize("beta,a", [(0.3, 0.5), (0.0, 0.9), (0.5, 0.0), (0.0, 0.0)])
def test_lexical_rows_give_the_lexical_score(beta, a):
  """For each (g, h), the kernel's (1 - a') P + a' (c_m V + c_t T + c_u U) with the row's
  (a', c_m, c_t, c_u) is (1 - g - h)((1 - a) P + a V) + g T + h U, on random terms."""
  rng = np.random.default_rng(0)
  P, V, T, U = rng.uniform(size=(4, 6, 9))
  pairs = [(0.0, 0.0), (0.1, 0.0), (0.0, 0.5), (0.3, 0.3), (0.5, 0.4)]
  rows = weight_reads.lexical_rows(beta, a, pairs)
  assert rows.shape == (len(pairs), 5) and (rows[:, 0] == np.float32(beta)).all()
  for (g, h), (_, folded, c_m, c_t, c_u) in zip(pairs, rows):
    kernel = (1 - folded) * P + folded * (c_m * V + c_t * T + c_u * U)
    score = (1 - g - h) * ((1 - a) * P + a * V) + g * T + h * U
    np.testing.assert_allclose(kernel, score, rtol=1e-6, atol=1e-6)
