"""The strategy registry: records are checked for consistency, names resolve (or name the
config field), and a strategy registered here, in the test alone, trains end to end."""

import dataclasses

import pytest

from astra_jax.config import base as config_base
from astra_jax.negatives import strategies
from astra_jax.negatives.schedule import NegativeSchedule
from astra_jax.negatives.strategies import HardShare, IndexOver, Strategy
from astra_jax.runtime.errors import InputError
from astra_jax.training import steps, train


def test_unknown_name_names_the_field_and_the_choices():
  with pytest.raises(
    InputError,
    match=r"config.negatives.strategy: unknown strategy 'nope'; "
    r"choose from random, random\+w_hard, ",
  ):
    strategies.get("nope")


def test_a_name_is_registered_once():
  with pytest.raises(ValueError, match="already registered"):
    strategies.register(Strategy("random", "a second random"))


@pytest.mark.parametrize(
  "fields,problem",
  [
    (dict(index_over=IndexOver.CLASSIFIER), "a hard-negative source but no hard negatives"),
    (dict(hard_share=HardShare.FIXED), "hard negatives but no source"),
    (
      dict(
        hard_share=HardShare.ALL,
        mined_in_step=True,
        dense_update_only=True,
        needs_all_positives=True,
      ),
      "fixed k_h hard",
    ),
    (
      dict(
        index_over=IndexOver.CLASSIFIER,
        hard_share=HardShare.FIXED,
        mined_in_step=True,
        dense_update_only=True,
        needs_all_positives=True,
      ),
      "from an index",
    ),
    (dict(full_loss=True, needs_all_positives=True), "only the dense step"),
    (dict(full_loss=True, dense_update_only=True), "without every positive"),
    (dict(allows_hard_only=True), "k_r = 0 without hard negatives"),
  ],
)
def test_inconsistent_records_are_refused(fields, problem):
  with pytest.raises(ValueError, match=problem):
    Strategy("broken", "inconsistent", **fields)


def test_every_built_in_record_is_consistent_and_named_by_its_key():
  for name in strategies.names():
    record = strategies.get(name)
    assert record.name == name
    assert dataclasses.replace(record) == record  # __post_init__ accepts it again


@pytest.fixture
def label_text_dense():
  """A strategy the code base does not have: hard negatives from an index over the label
  texts' embeddings, trained with the dense update only (registered for this test)."""
  record = strategies.register(
    Strategy(
      "test_label_text_dense",
      "k_h hard from E(z_l) + k_r random, dense update",
      index_over=IndexOver.LABEL_TEXT,
      hard_share=HardShare.FIXED,
      dense_update_only=True,
    )
  )
  try:
    yield record
  finally:
    strategies.unregister(record.name)


def test_a_registered_strategy_is_validated_and_scheduled_from_its_fields(
  label_text_dense, small_synthetic
):
  c = small_synthetic(strategy=label_text_dense.name, tau_s=1, tau_r=1)
  c.train.epochs = 3
  config_base.validate(c)
  schedule = NegativeSchedule.from_config(c)
  assert schedule.refresh_epochs == [1, 2]
  assert [schedule.split(e, True) for e in range(3)] == [(0, 272), (16, 256), (16, 256)]
  c.encoder.dtype = "float16"  # loss scaling exists only in the sparse step
  with pytest.raises(InputError, match=r"float16 needs loss scaling.*test_label_text_dense"):
    config_base.validate(c)
  c.encoder.dtype, c.negatives.k_r = "float32", 0  # not allows_hard_only
  with pytest.raises(InputError, match=r"config.negatives.k_r: must be >= 1"):
    config_base.validate(c)


@pytest.mark.slow
def test_a_strategy_registered_in_the_test_trains_end_to_end(
  label_text_dense, small_synthetic, tmp_path, monkeypatch
):
  """The new record trains as its fields say: the same run, metric for metric, as the
  built-in `random+e_hard` (the same index and split) with the dense update asked for in
  the config; and the sparse step is never built."""

  def configured(strategy, update):
    c = small_synthetic(strategy=strategy, tau_s=1, tau_r=1)
    c.train.epochs, c.train.batch_size = 2, 128
    c.optim.classifier_update = update
    c.checkpoint.enabled = False  # resuming is not what this test is about
    return c

  reference = train.train_and_evaluate(
    configured("random+e_hard", "dense"), str(tmp_path / "reference")
  )

  def no_sparse_step(*args, **kwargs):
    raise AssertionError("a dense-only strategy built the sparse step")

  monkeypatch.setattr(steps, "make_sparse_train_step", no_sparse_step)
  # classifier_update=sparse (the default): the record's dense_update_only overrides it.
  r = train.train_and_evaluate(configured(label_text_dense.name, "sparse"), str(tmp_path / "new"))
  assert r["strategy"] == r["negatives"]["strategy"] == label_text_dense.name
  assert [(e["hard"], e["random"], e["source"]) for e in r["negatives"]["per_epoch"]] == [
    (0, 272, None),
    (16, 256, 1),
  ]
  assert [x["epoch"] for x in r["negatives"]["refreshes"] if x["ok"]] == [1]
  assert r["metrics"] == reference["metrics"]
  assert r["P@1"] > r["popularity_baseline"]["P@1"]
