"""The TransferQueue (sample-level storage) arms: writing the step, running it, measuring it.

Entered through ``benchmarks/transferqueue_arm.py``, which prepares the process environment first. It starts
TransferQueue once and then runs the arms its commands name, one JSON line per command (:func:`serve`), so that
``benchmarks/transfer.py`` can interleave them with the KnitTrans arms. Besides the layouts below it runs
TransferQueue's own streaming loader (``tq/streaming.py``).

One step, per layout (see ``tq/layout.py``):

- ``a``: each of the dp*tp*cp ranks reads whole rows (token fields and images) of its DP group's
  trajectories.
- ``b``: each rank reads the token fields of its DP group's trajectories; the TP-rank-0/CP-rank-0 rank of each
  DP group also reads the images of the prompts its group needs, once each, and redistributes them to the
  other ranks of the group (a real loopback transfer, timed and counted).
- ``b-tp-shared`` (not in the issue; on request): like ``b``, but only TP rank 0 of each (DP, CP) pair reads
  the token fields and redistributes them to its TP peers.

The ranks' reads run in a pool of ``reader_concurrency`` reader processes, each with its own TransferQueue
client and one read at a time (``tq/reader_pool.py``); the ranks themselves are tasks of this process, which
also writes the step and simulates compute. A rank issues its reads in order. A DP group starts its
micro-batches when all its ranks hold their data (TP/CP collectives need every rank), so its data wait is that
of its slowest rank; its compute is one simulated sleep per micro-batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import transfer_queue as tq
from process_cpu import machine_busy_fraction, machine_cpu_seconds
from transfer_accounting import StepMeasurement, arm_report, compute_seconds
from transfer_placement import DpAssignment, MicroBatch, assign_dp, plan_micro_batches
from transfer_workload import (
    RankCoord,
    Workload,
    WorkloadConfig,
    add_workload_arguments,
    build_workload,
    config_from_arguments,
)

from tq.layout import IMAGE_PARTITION, IMAGES_FIELD, TRAJECTORY_PARTITION, Layout, StoredStep, clear_step, write_step
from tq.reader_pool import ReaderPool, ReadOutcome, ReadRequest
from tq.runtime import loopback_transferqueue
from tq.streaming import CONTROLLER_SETTINGS, StreamingArm

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GroupOutcome:
    data_wait_s: float
    compute_s: float
    bytes_moved_from_storage: int
    redistribution_bytes: int
    redistribution_s: float


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    workload: Workload
    assignment: DpAssignment
    micro_batches: tuple[tuple[MicroBatch, ...], ...]


def rank_reads(plan: StepPlan, stored: StoredStep, rank: RankCoord) -> tuple[ReadRequest, ...]:
    """The reads one rank performs in a step of ``stored.layout``, in order."""
    workload = plan.workload
    config = workload.config
    layout = stored.layout
    trajectories = plan.assignment.groups[rank.dp]
    requests: list[ReadRequest] = []
    if layout is not Layout.IMAGES_ONCE_TP_SHARED or rank.tp == 0:
        tp_shared = layout is Layout.IMAGES_ONCE_TP_SHARED
        rows = tuple(stored.rows[i] for i in trajectories)
        requests.append(
            ReadRequest(
                keys=tuple(row.key for row in rows),
                partition=TRAJECTORY_PARTITION,
                fields=tuple(stored.row_fields),
                rows=rows,
                routing_width=config.routing_width,
                forward_fields=stored.token_fields if tp_shared else (),
                forward_peers=config.tp - 1 if tp_shared else 0,
            )
        )
    if not layout.rows_carry_images and rank.reads_non_sequence_data and stored.images:
        entries = tuple(stored.images[p] for p in sorted({workload.prompt_of(i) for i in trajectories}))
        requests.append(
            ReadRequest(
                keys=tuple(entry.key for entry in entries),
                partition=IMAGE_PARTITION,
                fields=(IMAGES_FIELD,),
                images=entries,
                forward_fields=(IMAGES_FIELD,),
                forward_peers=len(config.topology.ranks_of_dp_group(rank.dp)) - 1,
            )
        )
    return tuple(requests)


class SampleLevelStep:
    """Runs steps of one layout against the rows :func:`tq.layout.write_step` stored."""

    def __init__(self, plan: StepPlan, stored: StoredStep, readers: ReaderPool) -> None:
        self._plan = plan
        self._stored = stored
        self._readers = readers
        self._machine_at_data: list[tuple[float, float]] = []
        self.data_wait_machine_busy_fraction = 0.0  # the last step's, until its last group held its data

    async def run(self) -> StepMeasurement:
        machine_at_start = machine_cpu_seconds()
        self._machine_at_data = []
        started = time.time()
        config = self._plan.workload.config
        outcomes = await asyncio.gather(*(self._run_dp_group(dp_rank, started) for dp_rank in range(config.dp)))
        step_s = time.time() - started
        self.data_wait_machine_busy_fraction = machine_busy_fraction(
            machine_at_start, max(self._machine_at_data, key=lambda sample: sample[1]))
        return StepMeasurement(
            step_s=step_s,
            data_wait_s=tuple(outcome.data_wait_s for outcome in outcomes),
            compute_s=tuple(outcome.compute_s for outcome in outcomes),
            bytes_moved_from_storage=sum(outcome.bytes_moved_from_storage for outcome in outcomes),
            redistribution_bytes=sum(outcome.redistribution_bytes for outcome in outcomes),
            redistribution_s=tuple(outcome.redistribution_s for outcome in outcomes),
        )

    async def _run_dp_group(self, dp_rank: int, started: float) -> GroupOutcome:
        config = self._plan.workload.config
        ranks = config.topology.ranks_of_dp_group(dp_rank)
        per_rank = await asyncio.gather(*(self._read_rank(rank) for rank in ranks))
        self._machine_at_data.append(machine_cpu_seconds())
        outcomes = [outcome for rank_outcomes in per_rank for outcome in rank_outcomes]
        # A rank that reads nothing (b-tp-shared, TP rank 1) is ready when its peer's forwarding is done.
        data_wait_s = max(outcome.ready_at for outcome in outcomes) - started
        compute_s = 0.0
        for micro_batch in self._plan.micro_batches[dp_rank]:
            slept_from = time.monotonic()
            await asyncio.sleep(compute_seconds(config, micro_batch))
            compute_s += time.monotonic() - slept_from
        return GroupOutcome(
            data_wait_s=data_wait_s,
            compute_s=compute_s,
            bytes_moved_from_storage=sum(outcome.bytes_moved_from_storage for outcome in outcomes),
            redistribution_bytes=sum(outcome.redistribution_bytes for outcome in outcomes),
            redistribution_s=max(outcome.redistribution_s for outcome in outcomes),
        )

    async def _read_rank(self, rank: RankCoord) -> list[ReadOutcome]:
        return [await self._readers.read(request) for request in rank_reads(self._plan, self._stored, rank)]


def expected_bytes_moved(plan: StepPlan, layout: Layout) -> int:
    """What the layout's read rules move out of storage per step, computed from the workload alone."""
    workload = plan.workload
    config = workload.config
    total = 0
    for group in plan.assignment.groups:
        token_bytes = sum(workload.trajectory_token_bytes(i) for i in group)
        row_image_bytes = len(group) * workload.prompt_image_bytes() if layout.rows_carry_images else 0
        token_readers = config.cp if layout is Layout.IMAGES_ONCE_TP_SHARED else config.tp * config.cp
        total += token_readers * token_bytes + config.tp * config.cp * row_image_bytes
        if not layout.rows_carry_images:
            total += len({workload.prompt_of(i) for i in group}) * workload.prompt_image_bytes()
    return total


async def run_layout(
    plan: StepPlan, layout: Layout, readers: ReaderPool, *, warmup_steps: int, steps: int
) -> dict[str, Any]:
    config = plan.workload.config
    logger.info("[%s] writing %d trajectories", layout.arm_name, plan.workload.num_trajectories)
    stored = await write_step(plan.workload, layout)
    logger.info("[%s] written in %.1f s", layout.arm_name, stored.write_s)
    runner = SampleLevelStep(plan, stored, readers)
    measured: list[StepMeasurement] = []
    busy_fractions: list[float] = []
    try:
        for step in range(warmup_steps + steps):
            measurement = await runner.run()
            busy_fractions.append(runner.data_wait_machine_busy_fraction)
            kind = "warm-up" if step < warmup_steps else "measured"
            logger.info(
                "[%s] step %d (%s): %.2f s, exposed transfer %.2f s, %.1f MB moved",
                layout.arm_name,
                step,
                kind,
                measurement.step_s,
                measurement.exposed_transfer_s,
                measurement.bytes_moved_from_storage / 1e6,
            )
            if step >= warmup_steps:
                measured.append(measurement)
    finally:
        await clear_step(stored)
    expected = expected_bytes_moved(plan, layout)
    if any(m.bytes_moved_from_storage != expected for m in measured):
        raise RuntimeError(f"{layout.arm_name}: bytes moved differ from the layout's read rules ({expected})")
    return arm_report(
        arm=layout.arm_name,
        workload=plan.workload,
        steps=measured,
        details={
            "layout": layout.value,
            "medium": MEDIUM,
            # The rows were put before the step and the reads start when it does: the later of the last put and
            # the loop asking is the step's start, so the data wait is the one-clock figure; these arms have no
            # per-micro-batch take/release work (the whole mini-batch is in memory before micro-batch 0).
            "exposed_one_clock_cold_s": measured[0].exposed_transfer_s,
            # the whole machine's, from the step's start until its last DP group held its data
            "cold_step_machine_busy_fraction": busy_fractions[warmup_steps],
            "exposed_one_clock_steady_s_per_step": None,
            "exposed_from_plan_known_s_per_step": float(np.median([m.exposed_transfer_s for m in measured])),
            "write_s": stored.write_s,
            "reader_concurrency": config.reader_concurrency,
            "readers": _describe_readers(layout),
        },
    )


def _describe_readers(layout: Layout) -> str:
    return {
        Layout.ROWS_WITH_IMAGES: "every rank reads whole rows (token fields + images) of its DP group",
        Layout.IMAGES_ONCE: (
            "every rank reads the token fields of its DP group; TP0/CP0 of each DP group reads its prompts' "
            "images once and sends them to the other ranks of the group"
        ),
        Layout.IMAGES_ONCE_TP_SHARED: (
            "TP0 of each (DP, CP) reads the token fields and sends them to its TP peers; TP0/CP0 of each DP "
            "group reads its prompts' images once and sends them to the other ranks of the group"
        ),
    }[layout]


MEDIUM = "TransferQueue SimpleStorage: in-memory storage units (Ray actors), loopback ZMQ"


async def serve(config: WorkloadConfig, *, storage_units: int, commands: TextIO, replies: TextIO) -> None:
    """Start TransferQueue once, then run the arm each command line names, and answer each with one JSON line.

    A command is ``{"arm": "a" | "b" | "b-tp-shared" | "streaming", "warmup_steps": N, "steps": N}``; an empty
    line or end of input ends the session. The first reply describes the session.
    """
    workload = build_workload(config)
    assignment = assign_dp(workload)
    plan = StepPlan(workload=workload, assignment=assignment, micro_batches=plan_micro_batches(workload, assignment))
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    with loopback_transferqueue(storage_units=storage_units, controller=CONTROLLER_SETTINGS) as tq_config:
        readers = ReaderPool(processes=config.reader_concurrency, controller_info=tq_config.controller.zmq_info,
                             storage_config=tq_config.backend.SimpleStorage)
        streaming = None
        try:
            logger.info("%d reader processes ready", await readers.warm_up())
            streaming = StreamingArm(workload, tq_config, planned_micro_batches=len(plan.micro_batches[0]))
            replies.write(json.dumps({
                "transferqueue_version": tq.__version__, "storage_backend": MEDIUM, "storage_units": storage_units,
                "reader_concurrency": config.reader_concurrency, "setup_s": time.perf_counter() - started}) + "\n")
            replies.flush()
            while line := (await loop.run_in_executor(None, commands.readline)).strip():
                command = json.loads(line)
                warmup, steps = int(command["warmup_steps"]), int(command["steps"])
                if command["arm"] == "streaming":
                    report = await streaming.run(warmup_steps=warmup, steps=steps)
                else:
                    report = await run_layout(plan, Layout(command["arm"]), readers, warmup_steps=warmup, steps=steps)
                replies.write(json.dumps(report) + "\n")
                replies.flush()
        finally:
            if streaming is not None:
                streaming.close()
            readers.close()


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--workload-json", help="the whole workload config as JSON (overrides workload flags)")
    parser.add_argument("--storage-units", type=int, default=2, help="SimpleStorage units (TransferQueue default 2)")
    parser.add_argument("--reply-fd", type=int, help="write the replies to this inherited descriptor (default stdout)")
    parser.add_argument("--tq-log-level", default="ERROR", help="TransferQueue's log level (read at start-up)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    if arguments.workload_json:
        config = WorkloadConfig.from_dict(json.loads(arguments.workload_json))
    else:
        config = config_from_arguments(arguments)
    if arguments.storage_units < 1:
        raise SystemExit("--storage-units must be >= 1")
    replies = os.fdopen(arguments.reply_fd, "w") if arguments.reply_fd is not None else sys.stdout
    with replies:
        asyncio.run(serve(config, storage_units=arguments.storage_units, commands=sys.stdin, replies=replies))
    return 0
