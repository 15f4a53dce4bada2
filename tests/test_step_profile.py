"""The iteration-time break-up's arithmetic and which steps it profiles."""

import pytest

from astra_jax.training.step_profile import PHASES, StepProfiler


def test_breakup_medians_and_backward_by_difference():
  p = StepProfiler(None, steps_per_epoch=10, epochs=3, profile_steps=3)
  # seconds per phase over 3 profiled steps; medians 2, 1, 4, 3, 1, 12 ms
  times = {
    "data_prep": [0.002, 0.001, 0.003],
    "host_to_device": [0.001, 0.001, 0.005],
    "encoder_forward": [0.004, 0.004, 0.004],
    "classifier_forward": [0.003, 0.002, 0.009],
    "loss": [0.001, 0.001, 0.001],
    "step": [0.012, 0.011, 0.020],
  }
  p.phases = {k: times[k] for k in PHASES}
  b = p.breakup(step_times=[0.03, 0.01, 0.02, 0.05], batch_size=128)
  assert b["data_prep"] == 2.0 and b["host_to_device"] == 1.0
  assert b["encoder_forward"] == 4.0 and b["classifier_forward"] == 3.0 and b["loss"] == 1.0
  assert b["step"] == 12.0 and b["backward_update"] == pytest.approx(12 - (4 + 3 + 1))
  assert b["mean_step_wall_ms"] == 25.0 and b["steps_profiled"] == 3 and b["batch_size"] == 128


def test_nothing_profiled_gives_nulls():
  b = StepProfiler(None, 10, 3, 0).breakup([], 64)
  assert b["step"] is None and "backward_update" not in b and b["mean_step_wall_ms"] is None


def test_profiles_warm_steps_of_the_second_epoch():
  p = StepProfiler(None, steps_per_epoch=10, epochs=3, profile_steps=2)
  assert [s for s in range(30) if p.wants(s)] == [12, 13]
  one_epoch = StepProfiler(None, steps_per_epoch=10, epochs=1, profile_steps=2)
  assert [s for s in range(10) if one_epoch.wants(s)] == [3, 4]
