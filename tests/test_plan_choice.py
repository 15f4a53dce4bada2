"""The score choice's passes (config/choice_reads.py) and what the planner prices for them
(plan/choice_time.py), by hand; `data.validation_max_rows` in the plan's split."""

import os

import pytest
from test_plan import timed_small_plan

from astra_jax import plan
from astra_jax.config import base as config_base, choice_reads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _recipe():
  return config_base.load_config(os.path.join(REPO, "experiments/xc_text.py"), "ngram")


def test_the_recipes_passes_counted_by_hand():
  c = _recipe()
  passes = choice_reads.choice_passes(c.scoring)
  # Three shapes at the four label-text weights above 0 (0.1, 0.3, 0.5, 0.7) in one pass;
  # the 5 x 5 weight pairs together; the lexical pairs of (0, 0.1, 0.3) x (0, 0.1, 0.3,
  # 0.5), every sum below 1.
  assert [(p.name, p.weight_rows) for p in passes] == [
    ("label-text shapes x weights", 12),
    ("label-text x neighbour weights", 25),
    ("lexical weights", 12),
  ]
  assert all(p.label_texts for p in passes)
  assert [p.votes for p in passes] == [False, True, True]
  assert [p.lexical for p in passes] == [False, False, True]


def test_passes_one_list_at_a_time_and_what_is_not_read():
  c = _recipe()
  sc = c.scoring
  sc.choose_jointly = False
  sc.label_text_shape_choices = ()
  sc.lexical_label_text_weight_choices = (0.6, 0.9)
  sc.lexical_neighbour_weight_choices = (0.0, 0.4)
  # One pass per list; lexical pairs with g + h >= 1 are not read (0.6 + 0.4, 0.9 + 0.4).
  assert [(p.name, p.weight_rows) for p in choice_reads.choice_passes(sc)] == [
    ("label-text weights", 5),
    ("neighbour weights", 5),
    ("lexical weights", 2),
  ]
  # Shapes with no label-text weight above 0 to read them at are not read; label texts
  # weighed by no candidate take no product.
  sc.label_text_shape_choices = ((5.0, 0.0),)
  sc.label_text_weight, sc.label_text_weight_choices = 0.0, (0.0,)
  sc.neighbour_weight_choices = ()
  sc.lexical_label_text_weight_choices = sc.lexical_neighbour_weight_choices = ()
  passes = choice_reads.choice_passes(sc)
  assert [(p.name, p.weight_rows, p.label_texts) for p in passes] == [
    ("label-text weights", 1, False)
  ]
  sc.label_text_weight_choices = ()
  assert choice_reads.choice_passes(sc) == []


def _small_choice_config():
  """5,000 synthetic rows (1,000 labels, d = 64) on 8 GPUs, a 10% split, two shapes at two
  weights and the two weights' 2 x 2 pairs, and 2 lexical pairs."""
  c = config_base.base_config()
  c.data.dir = "/unused"
  c.data.synthetic.enabled = True
  c.data.synthetic.num_labels, c.data.synthetic.num_train = 1000, 5000
  c.mesh.data, c.mesh.model = 2, 4
  c.train.batch_size = 64
  c.data.validation_fraction = 0.1
  sc = c.scoring
  sc.label_text_weight_choices, sc.neighbour_weight_choices = (0.2, 0.5), (0.0, 0.5)
  sc.label_text_shape_choices = ((5.0, 0.0), (10.0, 0.5))
  sc.choose_jointly = True
  sc.lexical_label_text_weight_choices, sc.lexical_neighbour_weight_choices = (0.0, 0.1), ()
  return c


def test_the_choice_is_priced_by_hand():
  c = _small_choice_config()
  t = timed_small_plan(c).choice_time
  # 500 validation rows against 1,000 labels over 8 V100s: encoded at 3 x 100 queries/s a
  # GPU; W's and E(z_l)'s products, 2 x 500 x 1,000 x 64 flop each, at half of 15.7
  # TFLOP/s; 20 B a score and weight row at 900 GB/s.
  v, scores = 500, 500 * 1000
  encode = v / (3 * 100.0 * 8)
  product = 2 * 2.0 * scores * 64 / (8 * 15.7e12 * 0.5)
  mix = lambda rows: rows * scores * 20 / (8 * 900e9)
  assert t.validation_rows == v and t.runs_on == "all 8 GPUs, 5 host cores a process"
  assert [(p.name, p.weight_rows) for p in t.passes] == [
    ("label-text shapes x weights", 4),
    ("label-text x neighbour weights", 4),
    ("lexical weights", 2),
  ]
  for p in t.passes:
    assert p.encode_s == pytest.approx(encode)
    assert p.product_s == pytest.approx(product)
    assert p.mix_s == pytest.approx(mix(p.weight_rows))
  # The lexical pass: every process takes the 500 rows' TF-IDF products against the 1,000
  # label texts and the 4,500 training rows, 36.4M pairs in 3.2 core-seconds, on its 5 cores.
  assert [p.host_s for p in t.passes[:2]] == [0.0] * 2
  assert t.passes[2].host_s == pytest.approx(500 * 5500 * 3.2 / 36.4e6 / 5)
  assert t.total_s == pytest.approx(
    3 * (encode + product) + mix(10) + 500 * 5500 * 3.2 / 36.4e6 / 5
  )
  assert "the score choice after training" in plan.format_plan(timed_small_plan(c))


def test_the_cap_holds_out_fewer_rows_everywhere_the_plan_counts_them():
  c = _small_choice_config()
  c.data.validation_max_rows = 120  # below the fraction's 500
  p = timed_small_plan(c)
  assert p.choice_time.validation_rows == 120
  # W trains on the other 4,880 rows: their ids in the training process.
  ids = [i.bytes for i in p.trainer_items if i.name.startswith("validation split: the kept")]
  assert ids == [4880 * 8]
  # Without choices or without a split nothing is priced.
  c.data.validation_fraction = 0.0
  assert timed_small_plan(c).choice_time is None


def test_a_long_choice_names_the_cap():
  """At SS-20M's sizes the recipe's 10% would be 14.6M rows a pass; the note prices the
  10^5-row cap the recipe sets."""
  c = _recipe()
  c.data.num_labels, c.data.num_train = 19_049_952, 146_000_000
  c.scoring.lexical_label_text_weight_choices = c.scoring.lexical_neighbour_weight_choices = ()
  capped = plan.plan_config(c, "v100-32gb")
  assert capped.choice_time.validation_rows == 100_000
  c.data.validation_max_rows = 0
  uncapped = plan.plan_config(c, "v100-32gb")
  assert uncapped.choice_time.validation_rows == 14_600_000
  # Every second of a pass is linear in its rows.
  assert uncapped.choice_time.total_s == pytest.approx(capped.choice_time.total_s * 146)
  (note,) = [n for n in uncapped.notes if n.startswith("the score choice reads")]
  assert "data.validation_max_rows=100000 reads 100,000 rows" in note
