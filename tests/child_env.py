"""The environment of a training run a test starts in a subprocess: CPU devices, this
checkout on the path, and none of the caller's launcher (SLURM_*) or jax (JAX_*) settings
but the compilation cache the test session shares."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Single-threaded Eigen inside an XLA op: two pytest workers (and the runs they start)
# already keep the 2 cores busy, and each process's intra-op thread pool only adds threads
# that spin on them (test_sharding.py alone: 8% less CPU). And LLVM's optimisation level 0
# for the CPU code XLA emits: compiling is most of a test's time from an empty cache (a
# step-equivalence test: 45 s cold, 11 s warm) while the programs run on tiny shapes, and a
# test checks what a program computes, never how fast (docs/results/running.md).
TEST_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0"


def cpu_child_env(devices: int, **extra: str) -> dict[str, str]:
  """os.environ for a child with `devices` fake CPU devices; `extra` variables added."""
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("JAX_", "SLURM_"))
    or k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
  }
  env.update(
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}",
    PYTHONPATH=REPO,
    JAX_PLATFORMS="cpu",
    **extra,
  )
  return env


def main_command(*args: str) -> list[str]:
  """`python -m astra_jax.main ARGS` under this interpreter."""
  return [sys.executable, "-m", "astra_jax.main", *args]


def demo_command_line(workdir, data_dir) -> list[str]:
  """A small demo run's argument list: 300 labels, 3 epochs of batches of 64, a refresh
  every epoch from epoch 2, a checkpoint every 5 steps (the resume tests' run and
  benchmarks/faults.py's)."""
  return main_command(
    "--config=experiments/demo.py",
    f"--workdir={workdir}",
    f"--config.data.dir={data_dir}",
    "--config.data.synthetic.num_labels=300",
    "--config.data.synthetic.num_train=1500",
    "--config.data.synthetic.num_test=300",
    "--config.train.epochs=3",
    "--config.train.batch_size=64",
    "--config.train.profile_steps=0",
    "--config.optim.warmup_steps=20",
    "--config.negatives.tau_s=2",
    "--config.negatives.tau_r=1",
    "--config.checkpoint.every_steps=5",
  )
