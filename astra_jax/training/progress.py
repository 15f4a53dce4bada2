"""The progress record a checkpoint carries beside the arrays: where training resumes and
what it has measured so far. Versioned, so that a checkpoint written before a field existed
still resumes.

Versions:
  0  no "version" key (checkpoints written before the record had one): the fields of 1,
     "phases" and "degraded" possibly missing.
  1  every field of `Progress` and "version".
"""

from __future__ import annotations

import dataclasses
import json

from astra_jax.runtime.degraded import Degraded
from astra_jax.runtime.errors import InputError

VERSION = 1


@dataclasses.dataclass
class Progress:
  """Where a run stands; the trainer updates it in place as it goes.

  epoch, step: the run resumes at this step of this epoch (step 0: before the epoch starts,
    its negatives not yet swapped in).
  global_step: the steps run so far (skipped ones included).
  train_seconds: the training loop's time so far (evaluations excluded).
  evals: the evaluations so far, each a results.json "evaluations" entry.
  negatives_per_epoch: per epoch, the hard and random negatives it trained with.
  step_times: per whole epoch, its seconds per step.
  phases: step_profile.StepProfiler.phases (None: not recorded, keep the profiler's own).
  hard_negatives: the refresh manager's HardNegatives.state_dict().
  degraded: the fallbacks so far (degraded.py).
  """

  epoch: int = 0
  step: int = 0
  global_step: int = 0
  train_seconds: float = 0.0
  evals: list[dict] = dataclasses.field(default_factory=list)
  negatives_per_epoch: list[dict] = dataclasses.field(default_factory=list)
  step_times: list[float] = dataclasses.field(default_factory=list)
  phases: dict[str, list[float]] | None = None
  hard_negatives: dict = dataclasses.field(default_factory=dict)
  degraded: Degraded = dataclasses.field(default_factory=Degraded)

  def to_json(self) -> dict:
    """A JSON record that shares nothing with this object (the save is asynchronous and
    the loop goes on appending to the lists)."""
    record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    record["degraded"] = self.degraded.to_json()
    return {"version": VERSION, **json.loads(json.dumps(record))}

  @classmethod
  def from_json(cls, record: dict) -> Progress:
    """The record `to_json` (or an older version, module docstring) wrote.

    Raises:
      InputError: a record of a newer version than this code reads.
    """
    version = record.get("version", 0)
    if version > VERSION:
      raise InputError(
        f"checkpoint progress record version {version} is newer than this "
        f"code's {VERSION}: resume it with the code that wrote it"
      )
    known = {f.name for f in dataclasses.fields(cls)} - {"degraded"}
    return cls(
      **{k: v for k, v in record.items() if k in known},
      degraded=Degraded.from_json(record.get("degraded")),
    )
