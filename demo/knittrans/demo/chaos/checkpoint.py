"""A trainer rank's checkpoints and its append-only history of applied steps, for the chaos run.

After each optimizer step (or a mini-batch that came as a typed error) a rank appends a ``step`` (``failed``)
event to ``applied-rank<r>.jsonl`` (the oracle's record of what it trained), then saves its model, optimizer, the
mini-batch's sequence and its ``mini.step`` to ``checkpoints/rank<r>-seq<s>.pt`` (written aside and renamed, so a
kill -9 never leaves half a checkpoint). In that order: a kill between the two leaves a step event newer than the
checkpoint, which the next start's ``restore`` event voids, and the step is redone. The last two checkpoints are
kept: a kill during a step can leave the ranks one step apart, and they restart together from the newest step all
of them hold. The restored ``StepId`` goes to every ``TrainerClient`` of the rank (``restored_step``), so its
sidecars deliver exactly the mini-batches after it again; a restart before the first checkpoint passes
``BEFORE_FIRST_STEP``, and gets every mini-batch again from the first.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

from knittrans.steps import BEFORE_FIRST_STEP, RestorePoint, StepId

KEEP_CHECKPOINTS = 2
_NAME = re.compile(r"^rank(\d+)-seq(\d+)\.pt$")


class RankHistory:
    """One rank's checkpoints and applied-step log under the run's output directory."""

    def __init__(self, out: Path, rank: int) -> None:
        self.rank = rank
        self.directory = out / "checkpoints"
        self.directory.mkdir(parents=True, exist_ok=True)
        log = out / f"applied-rank{rank}.jsonl"
        # An earlier process of this rank logged its restore at least: this one is a restart.
        self._restarted = log.exists() and log.stat().st_size > 0
        self._log: TextIO = open(log, "a")

    def sequences(self) -> list[int]:
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match and int(match.group(1)) == self.rank:
                found.append(int(match.group(2)))
        return sorted(found)

    def restore(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, distributed: bool
    ) -> tuple[int | None, StepId | RestorePoint | None, int]:
        """Load the newest checkpoint every rank holds (a collective when ``distributed``); log a restore event.
        Returns (the restored step's sequence, None without a checkpoint; what to pass ``TrainerClient`` as
        ``restored_step``: the checkpoint's ``StepId``, ``BEFORE_FIRST_STEP`` for a restart without one, None for
        the run's first start; the number of mini-batches done).

        A restart without a checkpoint must say so: the processes before it may have taken mini-batches to their
        last micro-batch (a failure raised partway, then a crash) that no checkpoint holds, and only a restore
        gets those again."""
        held = self.sequences()
        newest = torch.tensor([held[-1] if held else -1], dtype=torch.int64)
        restarted = torch.tensor([int(self._restarted)], dtype=torch.int64)
        if distributed:
            dist.all_reduce(newest, op=dist.ReduceOp.MIN)
            dist.all_reduce(restarted, op=dist.ReduceOp.MAX)  # the world restarts as one
        sequence = int(newest.item())
        applied = 0
        step: StepId | RestorePoint | None = BEFORE_FIRST_STEP if restarted.item() else None
        if sequence >= 0:
            state = torch.load(self.directory / f"rank{self.rank}-seq{sequence}.pt", weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            applied = state["applied"]
            step = StepId(**state["step"])
        restored = sequence if sequence >= 0 else None
        self.append({"event": "restore", "rank": self.rank, "sequence": restored, "applied": applied})
        return restored, step, applied

    def append(self, event: dict[str, Any]) -> None:
        self._log.write(json.dumps(event) + "\n")
        self._log.flush()

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, sequence: int, step: StepId,
             applied: int) -> None:
        path = self.directory / f"rank{self.rank}-seq{sequence}.pt"
        partial = path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sequence": sequence,
                    "step": {"train_batch_index": step.train_batch_index, "minibatch_index": step.minibatch_index,
                             "train_version": step.train_version},
                    "applied": applied}, partial)
        os.replace(partial, path)
        for old in self.sequences()[:-KEEP_CHECKPOINTS]:
            (self.directory / f"rank{self.rank}-seq{old}.pt").unlink(missing_ok=True)

    def close(self) -> None:
        self._log.close()


def any_rank_failed(mini: Any, encoder_mini: Any) -> bool:
    """Whether any rank's mini-batch came as a typed error (a unit it cannot read); a collective, so that every
    rank skips the step together rather than some waiting in its collectives for ranks that gave up."""
    failed = mini.descriptor.failure is not None or (encoder_mini is not None
                                                     and encoder_mini.descriptor.failure is not None)
    flag = torch.tensor([1 if failed else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def commit_checkpoint(history: RankHistory, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, mini: Any,
                      applied: int, report: Callable[[StepId], Any] | None) -> None:
    """Save this rank's checkpoint after ``mini``, wait until every rank saved its own (a collective), then report
    it to the admission service (``report``: global rank 0's ``AdmissionClient.report_checkpoint``).

    The barrier comes before the mini-batch is completed (its optimizer step reported): so no sidecar moves past a
    mini-batch that some rank's checkpoint does not hold, and the newest checkpoint every rank holds is never older
    than what the admission service released (retention releases only steps a reported checkpoint covers)."""
    history.save(model, optimizer, sequence=mini.sequence, step=mini.step, applied=applied)
    dist.barrier()
    if report is not None:
        report(mini.step)
