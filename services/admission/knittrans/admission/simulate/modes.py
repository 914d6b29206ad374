"""Colocated and disaggregated execution: what differs between the two modes of the model.

Both modes launch prompts by the same rules (slots, ``rollout_ahead``, ``next_step_after``), so that they
differ only in placement, as the paper's comparison requires ("the same staleness-control settings").

Disaggregated: rollout and training run at the same time on separate pools. Admission runs
``max_batches_ahead`` train batches ahead of training; after a sync, in-flight trajectories go on and their
later tokens carry the new version.

Colocated: one pool alternates. Rollout runs until the train batch is admitted (train batch k only once
version k is current), then the whole train batch trains and syncs while rollout stands still; unfinished
trajectories are paused and resumed under the new version (``partial_rollout``) or discarded.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from knittrans.admission.simulate.config import SimConfig


class Mode(StrEnum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"


# The order of the output: the pipelined mode first, its colocated reference second.
MODES = (Mode.DISAGGREGATED, Mode.COLOCATED)


@dataclass(frozen=True, kw_only=True)
class ModeRules:
    mode: Mode
    max_batches_ahead: int | None  # the engine's bound on admission ahead of training
    shares_pool: bool  # rollout stands still while training runs
    discards_unfinished: bool  # at the end of a colocated rollout phase, without partial rollout

    @classmethod
    def of(cls, mode: Mode, config: SimConfig) -> ModeRules:
        if mode is Mode.DISAGGREGATED:
            return cls(
                mode=mode,
                max_batches_ahead=config.max_batches_ahead,
                shares_pool=False,
                discards_unfinished=False,
            )
        return cls(
            mode=mode,
            max_batches_ahead=0,
            shares_pool=True,
            discards_unfinished=not config.partial_rollout,
        )
