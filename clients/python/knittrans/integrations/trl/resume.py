"""Where a TRL job that ends and starts again resumes: its checkpoint for TRL, its restore point for KnitTrans.

A restarted job must tell its sidecars what its weights hold, or they deliver what the job needs no more, or skip
what it needs again (docs/failures.md). :func:`resume_point` reads it from the job's ``output_dir``:

- the newest ``checkpoint-<step>`` folder holding the KnitTrans step it applied (the trainer writes that file when
  TRL saves; a folder without it was cut short, or written without KnitTrans, and is passed over);
- else, if a process of this job took a mini-batch before (the trainer marks the ``output_dir`` before it takes its
  first), :data:`~knittrans.trainer.BEFORE_FIRST_STEP`: the job starts again from its initial weights, and needs
  every mini-batch again from the first;
- else nothing: a first start.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from knittrans.errors import InvalidArgument
from knittrans.steps import BEFORE_FIRST_STEP, RestorePoint, StepId

STEP_FILE = "knittrans-step.json"  # in each checkpoint folder: the last KnitTrans step the checkpoint applied
STARTED_FILE = "knittrans-started"  # in the output_dir: a process of the job is about to take its first mini-batch
_CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")  # TRL's (transformers') checkpoint folders


@dataclass(frozen=True, kw_only=True)
class ResumePoint:
    """``train(resume_from_checkpoint=checkpoint)`` and ``TrainerClient(..., restored_step=restored_step)``."""

    checkpoint: Path | None
    restored_step: StepId | RestorePoint | None

    def __post_init__(self) -> None:
        if self.checkpoint is not None and not isinstance(self.restored_step, StepId):
            raise InvalidArgument("a checkpoint resumes from the step it applied", field="restored_step")


def restored_step(checkpoint: str | os.PathLike[str]) -> StepId | None:
    """The KnitTrans step a TRL checkpoint folder applied (``TrainerClient(..., restored_step=...)`` when resuming
    from it), or None for a checkpoint written without KnitTrans."""
    path = Path(checkpoint) / STEP_FILE
    if not path.exists():
        return None
    return StepId(**json.loads(path.read_text()))  # StepId checks each field


def write_restored_step(checkpoint: Path, step: StepId) -> None:
    """Written after TRL saved the folder; renamed into place, so that a folder holds the whole file or none."""
    partial = checkpoint / f".{STEP_FILE}.partial"
    partial.write_text(json.dumps(asdict(step)))
    partial.replace(checkpoint / STEP_FILE)


def mark_started(output_dir: str | os.PathLike[str]) -> None:
    """Before a process takes its first mini-batch: from now on a start of this job is a restart."""
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STARTED_FILE).touch()


def resume_point(output_dir: str | os.PathLike[str]) -> ResumePoint:
    """Where the job writing into ``output_dir`` resumes (see the module docstring)."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return ResumePoint(checkpoint=None, restored_step=None)
    folders = sorted(((int(match.group(1)), entry) for entry in directory.iterdir()
                      if entry.is_dir() and (match := _CHECKPOINT_FOLDER.match(entry.name))), reverse=True)
    for _, folder in folders:
        step = restored_step(folder)
        if step is not None:
            return ResumePoint(checkpoint=folder, restored_step=step)
    if (directory / STARTED_FILE).exists():
        return ResumePoint(checkpoint=None, restored_step=BEFORE_FIRST_STEP)
    return ResumePoint(checkpoint=None, restored_step=None)


def next_sequence(*, last_taken: int | None, restored: StepId | RestorePoint | None, num_minibatches: int) -> int:
    """The sequence number of the mini-batch a process takes next: after the one it took last, else after the step
    it restored (a resumed process starts there, not at the job's first mini-batch)."""
    if last_taken is not None:
        return last_taken + 1
    return restored.sequence(num_minibatches) + 1 if isinstance(restored, StepId) else 1
