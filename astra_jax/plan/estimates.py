"""Memory plan of a training run: what each device, process, node and disk must hold.

Per device: W's shard, the classifier's optimizer state, the encoder's parameters, Adam
moments and gradients, the encoder's activations for one micro-batch, the classifier step's
temporaries; compared with what XLA can use (90% of the GPU's memory; set
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, JAX's default is 0.75), with fixes when it does not fit.
Per node (one process per GPU as launch/slurm.sbatch runs, or 1 as launch/single_node.sh):
the peak of preparation (label parse, tokenization: one builder per node, from the per-row
costs benchmarks/data_scale.py measured); every training process's and every refresh
worker's resident memory, with the files a node maps (label cache, token memmaps) counted
once and each process's own memmaps (negatives in use, negatives being mined) once per
process, the collected query embeddings once (one file every process reads); and disk for
every file the run writes (caches, refresh inputs, negatives generations, checkpoints x
keep, export).

Nothing here imports jax or the model code: sizes come from the config, the encoder's
config.json (or the tiny-BERT fields), the tokenizer's vocabulary, the header of
trn_X_Y.txt when the data is on disk, else `config.data.num_labels` / `num_train` (the
paper's table for the dataset configs). The numbers are estimates of what the arrays need
(XLA's buffer assignment can differ by tens of percent on activations); byte counts of
parameters, optimizer state and W are exact (tests/test_plan.py checks them against jax).
"""

from __future__ import annotations

import copy
import dataclasses

from astra_jax.plan.choice_time import CAP_ROWS, choice_note, choice_time
from astra_jax.plan.device_memory import device_items
from astra_jax.plan.disk import disk_items, layout_notes, preparation
from astra_jax.plan.host_memory import host_items
from astra_jax.plan.inputs import (
  data_size,
  encoder_note,
)
from astra_jax.plan.quantities import quantities
from astra_jax.plan.records import GPUS, USABLE_FRACTION, DataSize, GiB, NodeLayout, Plan
from astra_jax.plan.refresh_time import refresh_times
from astra_jax.plan.score_extras import score_extras
from astra_jax.plan.vote_time import vote_time
from astra_jax.plan.warm_start import warm_start_cost
from astra_jax.runtime.errors import InputError


def make_plan(
  config,
  gpu: str,
  data: DataSize | None = None,
  config_name: str = "",
  layout: NodeLayout | None = None,
  host_cores_per_node: int = 0,
  train_queries_per_s: float = 0.0,
) -> Plan:
  """The plan for `config` as it stands (mesh included).

  Args:
    config: the experiment config, its mesh set.
    gpu: a key of GPUS.
    data: the dataset's size (default: data_size(config)).
    config_name: the name printed.
    layout: nodes and processes (default: one node, one process per device).
    host_cores_per_node, train_queries_per_s: the refresh's timing inputs
      (refresh_time.refresh_times; 0: its defaults).
  Returns:
    The Plan."""
  data = data or data_size(config)
  q, layout = quantities(config, data, layout)
  host = host_items(q, config.data)
  devices = device_items(config, q)
  # What training leaves free on a GPU (its activations included: a conservative bound).
  room = int(GPUS[gpu] * USABLE_FRACTION) - sum(i.bytes for i in devices) if gpu in GPUS else None
  processes = layout.nodes * layout.processes_per_node
  extras = score_extras(config, q, data.num_train, processes, device_room=room)
  prep = preparation(q)
  notes = host.notes + layout_notes(config, q, layout)
  if ec_note := encoder_note(config, q.enc_source):
    notes.append(ec_note)
  votes = vote_time(extras.vote_search, q, gpu, layout, host_cores_per_node, train_queries_per_s)
  if votes is not None and not extras.vote_search.scann and votes.search_s > 3600:
    notes.append(
      f"the vote's exact search takes ~{votes.search_s / 3600:.1f} h on {votes.search_on} here; "
      "scoring.neighbour_search=scann searches through a ScaNN index instead, its recall "
      "at this size unmeasured (docs/results/vote_search.md)"
    )
  times = (layout, host_cores_per_node, train_queries_per_s)
  choice = choice_time(config, q, gpu, *times)
  if choice is not None:
    capped = choice_time(config, q, gpu, *times, validation_rows=CAP_ROWS)
    if note := choice_note(choice, capped):
      notes.append(note)
  warm = warm_start_cost(config, q, gpu, train_queries_per_s)
  if warm and warm.epoch_s * warm.epochs > 24 * 3600:
    notes.append(
      f"the warm start takes ~{warm.epoch_s * warm.epochs / 3600:,.0f} h "
      f"({warm.epochs} epochs of {warm.pairs_per_epoch:,} pairs on {warm.gpus} GPU(s)); "
      "warmstart.pairs_per_epoch bounds an epoch's pairs"
    )
  enc = q.enc
  return Plan(
    config_name=config_name or config.data.get("name", ""),
    data=data,
    encoder={
      "source": q.enc_source,
      "model_type": enc.model_type,
      "params": q.P,
      "hidden": enc.hidden_size,
      "layers": getattr(enc, "num_layers", None),
      "heads": getattr(enc, "num_heads", None),
      "ffn": getattr(enc, "intermediate_size", None),
      "vocab": getattr(enc, "vocab_size", None),
      "d": q.d,
      "dtype": enc.dtype,
    },
    mesh={"data": q.D, "model": q.M, "devices": q.G},
    batch={
      "global": q.B,
      "grad_accum_steps": q.A,
      "micro_batch": q.micro,
      "encoder_queries_per_device": q.b_enc,
      "classifier_queries_per_device": q.b_clf,
      "max_len": q.T,
    },
    negatives={
      "k_p": q.k_p,
      "k_h_per_shard": q.k_h,
      "k_r_per_shard": q.k_r,
      "shards": q.M,
      "random_draws": config.negatives.random_draws,
      "index": q.index_kind,
      "dense_update": q.dense,
    },
    gpu=gpu,
    device_items=devices,
    worker_items=host.worker,
    trainer_items=host.trainer,
    disk_items=disk_items(config, q) + extras.disk,
    notes=notes,
    node={**dataclasses.asdict(layout), "nodes": layout.nodes, "shards_per_process": q.S},
    prep_items=prep.items,
    node_items=host.node,
    prep_seconds=prep.seconds,
    refresh=refresh_times(
      q,
      config.negatives.index,
      gpu,
      layout.gpus_per_node,
      host_cores_per_node,
      train_queries_per_s,
    ),
    score_items=extras.items,
    score_device_items=extras.device,
    vote_search=extras.vote_search,
    vote_time=votes,
    warm_start=warm,
    choice_time=choice,
  )


# ------------------------------------------------------------------------- suggestions
def suggest(config, gpu: str, data: DataSize) -> list[str]:
  """Changes that make a plan fit, tried one kind at a time on copies of the config."""
  out = []
  D, M = config.mesh.data, config.mesh.model
  G, B = D * M, config.train.batch_size
  A = max(1, config.train.get("grad_accum_steps", 1))

  def fits(**changes) -> Plan | None:
    c = copy.deepcopy(config)
    with c.unlocked():
      for key, value in changes.items():
        section, field = key.split("__")
        c[section][field] = value
    p = make_plan(c, gpu, data)
    return p if p.fits else None

  for a in range(A + 1, B // G + 1):
    if B % (a * G) == 0 and (p := fits(train__grad_accum_steps=a)):
      out.append(
        f"gradient accumulation: --config.train.grad_accum_steps={a} "
        f"({p.device_total / GiB:.1f} GiB per device)"
      )
      break
  m = M * 2
  while m <= 1024:
    if G % m == 0 and (p := fits(mesh__data=G // m, mesh__model=m)):
      out.append(
        f"more W shards on the same {G} devices: --mesh={G // m}x{m} "
        f"({p.device_total / GiB:.1f} GiB per device)"
      )
      break
    if G % m and (p := fits(mesh__data=1, mesh__model=m)):
      out.append(
        f"more devices for W's shards: --num_gpus={m} --mesh=1x{m} "
        f"({p.device_total / GiB:.1f} GiB per device)"
      )
      break
    m *= 2
  if not config.encoder.bottleneck_dim and (p := fits(encoder__bottleneck_dim=64)):
    out.append(
      f"a bottleneck to d=64 (as the paper does for very large L): "
      f"--config.encoder.bottleneck_dim=64 ({p.device_total / GiB:.1f} GiB per device)"
    )
  if config.encoder.dtype == "float32":
    low = "float16" if gpu.startswith("v100") else "bfloat16"
    if p := fits(encoder__dtype=low):
      out.append(
        f"{low} compute: --config.encoder.dtype={low} ({p.device_total / GiB:.1f} GiB per device)"
      )
  return out or ["nothing single fits: combine the above, or add GPUs"]


# ------------------------------------------------------------------------- the mesh
def resolve_mesh(config, mesh: str, num_gpus: int) -> tuple[int, int]:
  """--mesh DATAxMODEL and --num_gpus against config.mesh (data=-1: every device)."""
  data, model = config.mesh.data, config.mesh.model
  if mesh:
    try:
      data, model = (int(x) for x in mesh.lower().split("x"))
    except ValueError:
      raise InputError(f"--mesh={mesh!r}: expected DATAxMODEL, e.g. 1x8") from None
  if num_gpus:
    if data == -1 or not mesh:
      if num_gpus % model:
        raise InputError(f"--num_gpus={num_gpus} is not a multiple of mesh.model={model}")
      data = num_gpus // model
    elif data * model != num_gpus:
      raise InputError(f"--mesh={mesh} is {data * model} devices, --num_gpus={num_gpus}")
  elif data == -1:
    raise InputError("config.mesh.data=-1 takes every device: say how many with --num_gpus=N")
  if data < 1 or model < 1:
    raise InputError(f"mesh {data}x{model}: both axes must be >= 1")
  return data, model


def resolve_layout(devices: int, gpus_per_node: int, processes_per_node: int) -> NodeLayout:
  """--gpus_per_node (default: every device on one node) and --processes_per_node (default:
  one per GPU, as launch/slurm.sbatch starts them)."""
  g = gpus_per_node or devices
  if devices % g:
    raise InputError(f"--gpus_per_node={g} does not divide the {devices} devices")
  p = processes_per_node or g
  if g % p:
    raise InputError(f"--processes_per_node={p} does not divide --gpus_per_node={g}")
  return NodeLayout(devices, g, p)


def plan_config(
  config,
  gpu: str,
  mesh: str = "",
  num_gpus: int = 0,
  name: str = "",
  gpus_per_node: int = 0,
  processes_per_node: int = 0,
  host_cores_per_node: int = 0,
  train_queries_per_s: float = 0.0,
) -> Plan:
  """Applies the mesh to (a copy of) the config, plans, and adds suggestions if needed.

  Args:
    config: the experiment config.
    gpu: a key of GPUS.
    mesh, num_gpus: see resolve_mesh.
    name: the name printed.
    gpus_per_node, processes_per_node: see resolve_layout (0: the defaults).
    host_cores_per_node, train_queries_per_s: the refresh's timing inputs (make_plan).
  Returns:
    The Plan."""
  if gpu not in GPUS:
    raise InputError(f"--gpu={gpu!r}: choose from {', '.join(GPUS)}")
  config = copy.deepcopy(config)
  data, model = resolve_mesh(config, mesh, num_gpus)
  with config.unlocked():
    config.mesh.data, config.mesh.model = data, model  # per-shard k_h/k_r follow (refs)
  layout = resolve_layout(data * model, gpus_per_node, processes_per_node)
  size = data_size(config)
  p = make_plan(config, gpu, size, name, layout, host_cores_per_node, train_queries_per_s)
  if not p.fits:
    p.suggestions = suggest(config, gpu, size)
  return p
