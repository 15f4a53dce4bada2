"""The memory plan as text: what `python -m astra_jax.plan` prints without --json."""

from __future__ import annotations

from astra_jax.plan.records import (
  GPUS,
  USABLE_FRACTION,
  GiB,
  Plan,
  VoteSearchCost,
  VoteTime,
  resident,
)


def _gib(n: int) -> str:
  return f"{n / GiB:8.2f}"


def format_plan(p: Plan) -> str:
  e, m, b, n = p.encoder, p.mesh, p.batch, p.negatives
  lines = [
    f"memory plan: {p.config_name}",
    f"  data: L = {p.data.num_labels:,} labels, N = {p.data.rows:,} training rows "
    f"({p.data.num_train:,} + label texts)"
    if p.data.rows != p.data.num_train
    else f"  data: L = {p.data.num_labels:,} labels, N = {p.data.rows:,} training rows",
    f"        from {p.data.source}",
    f"  encoder: {e['model_type']}, {e['params'] / 1e6:.1f}M parameters (hidden {e['hidden']}"
    + (f", {e['layers']} layers x {e['heads']} heads, ffn {e['ffn']}" if e["layers"] else "")
    + f"), d = {e['d']}, compute {e['dtype']}",
    f"        from {e['source']}",
    f"  mesh: {m['data']} data x {m['model']} model = {m['devices']} "
    f"device{'s' if m['devices'] > 1 else ''}, {p.gpu} "
    f"({GPUS[p.gpu] / GiB:.0f} GiB, {p.usable / GiB:.1f} GiB usable at "
    f"{USABLE_FRACTION:.0%})",
    f"  batch: {b['global']}"
    + (
      f" = {b['grad_accum_steps']} micro-batches of {b['micro_batch']}"
      if b["grad_accum_steps"] > 1
      else " (no accumulation)"
    )
    + "; "
    f"encoder {b['encoder_queries_per_device']} queries per device, classifier "
    f"{b['classifier_queries_per_device']}; {b['max_len']} tokens",
    f"  negatives per query: {n['k_p']} positives (padded), {n['shards']} x {n['k_h_per_shard']} "
    f"hard, {n['shards']} x {n['k_r_per_shard']} random columns (per W shard x shards; "
    f"{n['random_draws'].replace('_', ' ')} draws); index {n['index']}",
    "",
    f"  {'GPU memory per device':<74}{'GiB':>8}",
  ]
  lines += [f"    {i.name:<72}{_gib(i.bytes)}" for i in p.device_items]
  verdict = (
    f"FITS, {(p.usable - p.device_total) / GiB:.2f} GiB headroom"
    if p.fits
    else f"DOES NOT FIT: {(p.device_total - p.usable) / GiB:.2f} GiB over"
  )
  lines.append(f"    {'total':<72}{_gib(p.device_total)}   {verdict}")
  nd = p.node
  where = (
    f"{nd['nodes']} node{'s' if nd['nodes'] > 1 else ''} x {nd['gpus_per_node']} GPUs, "
    f"{nd['processes_per_node']} process{'es' if nd['processes_per_node'] > 1 else ''} "
    f"per node, {nd['shards_per_process']} W shard(s) per process"
  )
  lines += ["", f"  host, per node: {where}"]
  ps = p.prep_seconds
  for title, items, total in (
    (
      "preparation, one builder per node (phases in turn: the peak)",
      p.prep_items,
      ("peak", p.prep_peak),
    ),
    ("host RAM, each process in the warm start (before W)", _warm_items(p), None),
    ("host RAM, each refresh worker", p.worker_items, None),
    ("host RAM, each training process", p.trainer_items, None),
    ("host RAM, the node in training", p.node_items, ("total, every memmap hot", p.node_total)),
    ("host RAM, each process after training: the score beyond W", p.score_items, None),
    ("each GPU after training, beside the trained state", p.score_device_items, None),
    ("disk, every file the run writes", p.disk_items, ("total", p.disk_total)),
  ):
    if not items and total is None:
      continue  # a section the config does not have (the score beyond W)
    lines += ["", f"  {title:<74}{'GiB':>8}"]
    lines += [f"    {i.name + (' (memmap)' if i.paged else ''):<72}{_gib(i.bytes)}" for i in items]
    if total:
      lines.append(f"    {total[0]:<72}{_gib(total[1])}")
    if items is p.prep_items and ps:
      lines.append(
        f"    {ps['label_text_bytes'] / 1e9:.1f} GB of label text: "
        f"~{ps['parse_cpu_s'] / 60:.0f} CPU min to parse; {ps['tokenize_rows']:,} "
        f"texts: ~{ps['tokenize_cpu_s'] / 60:.0f} CPU min to tokenize"
      )
    if items is not p.prep_items and "disk" not in title:
      paged = sum(i.bytes for i in items if i.paged)
      label = "resident" + (", + the memmaps in the page cache when hot" if paged else "")
      lines.append(f"    {label:<72}{_gib(resident(items))}")
    if items is p.score_items and p.vote_search:
      lines += _vote_search_lines(p.vote_search, p.vote_time)
    if p.warm_start and items and items[0] is p.warm_start.items[0]:
      lines += _warm_start_lines(p.warm_start)
  lines += refresh_lines(p)
  lines += choice_lines(p)
  if p.notes:
    lines += [""] + [f"  note: {x}" for x in p.notes]
  if p.suggestions:
    lines += ["", "  to make it fit:"] + [f"    - {x}" for x in p.suggestions]
  return "\n".join(lines)


def _warm_items(p: Plan) -> list:
  return p.warm_start.items if p.warm_start else []


def _warm_start_lines(w) -> list[str]:
  """The warm start's pairs and hours (warm_start.WarmStartCost) in the plan's words."""
  lines = [f"    {w.pairs:,} (query, label) pairs; an epoch takes {w.pairs_per_epoch:,}"]
  if w.epoch_s:
    lines.append(
      f"    {'estimated' if w.estimated else 'at the given rate'}: {w.pairs_per_s:,.0f} pairs/s "
      f"on {w.gpus} GPU{'s' if w.gpus > 1 else ''}, {w.epoch_s / 3600:,.2f} h an epoch, "
      f"{w.epochs * w.epoch_s / 3600:,.2f} h for {w.epochs}"
    )
  return lines


def _vote_search_lines(v: VoteSearchCost, t: VoteTime | None) -> list[str]:
  """The vote's search (records.VoteSearchCost) and its seconds (records.VoteTime, or None)
  in the plan's words."""
  if not v.scann:
    lines = [
      f"    the vote's exact search, (test + validation rows) x memory rows x 2 d: "
      f"{v.search_flop:.2e} flop"
    ]
  else:
    lines = [
      f"    the vote's ScaNN search, (test + validation rows) x {v.rows_per_query:,} rows "
      f"and leaf centres x 2 d: {v.search_flop:.2e} flop",
      f"    its index's build, memory rows x leaves x 2 d to assign them: {v.build_flop:.2e} flop",
    ]
  if t is not None:
    if v.scann:
      whose = "each process's search (its share of the test and validation rows)"
    elif v.on_devices:
      whose = "the search (the memory split over the GPUs)"
    else:
      whose = "each process's search (its share of the memory, every test and validation row)"
    lines += [
      f"    estimated: the memory's encoding over every GPU {t.encode_s / 3600:.2f} h; {whose}",
      f"      on {t.search_on} {t.search_s / 3600:.2f} h"
      + (f", its two index builds {t.build_s / 3600:.2f} h" if v.scann else ""),
    ]
  return lines


def choice_lines(p: Plan) -> list[str]:
  """The score choice's passes and hours (choice_time.py); nothing without a choice."""
  t = p.choice_time
  if t is None:
    return []
  lines = [
    "",
    f"  {'the score choice after training, each pass over all labels (choice_time.py)':<74}"
    f"{'hours':>8}",
    f"    {t.validation_rows:,} validation rows a pass, on {t.runs_on}",
  ]
  for x in t.passes:
    parts = (
      f"encode {x.encode_s / 3600:.2f} h, products {x.product_s / 3600:.2f} h, "
      f"mix and top-k {x.mix_s / 3600:.2f} h"
    )
    if x.host_s:
      parts += f", host TF-IDF {x.host_s / 3600:.2f} h"
    lines.append(f"    {f'{x.name}, {x.weight_rows} weight rows':<72}{_hours(x.total_s)}")
    lines.append(f"      {parts}")
  lines.append(f"    {'total (estimated: assumed device rates)':<72}{_hours(t.total_s)}")
  return lines


def _hours(seconds: float) -> str:
  return f"{seconds / 3600:8.2f}"


def refresh_lines(p: Plan) -> list[str]:
  """The refresh's hours by each backend against an epoch's (refresh_time.py), and when
  training waits; nothing where the GPU kind has no rates or nothing is mined."""
  r = p.refresh
  if not r:
    return []
  speed = "estimated from a V100's, not measured" if r["step_speed_estimated"] else "given"
  rows = (
    (f"epoch: {r['train_queries_per_s_per_gpu']:,.0f} queries/s per GPU ({speed})", "epoch_s"),
    (
      f"host (ScaNN): {r['rows_scored_per_query']:,} rows scored per query, "
      f"{r['host_cores_per_node']} host cores",
      "host_s",
    ),
    (
      f"device (exact): {r['device_flops']:.2e} flops per device, half the peak (assumed)",
      "device_s",
    ),
  )
  lines = ["", f"  {'time per refresh, one node (refresh_time.py)':<74}{'hours':>8}"]
  lines += [f"    {label:<72}{_hours(r[key])}" for label, key in rows]
  for name, wait in (("host", r["host_wait_s"]), ("device", r["device_wait_s"])):
    verdict = (
      f"training waits {wait / 3600:.2f} h per refresh"
      if wait > 0
      else "within the epoch: training does not wait"
    )
    lines.append(f"    {name} backend: {verdict}")
  return lines
