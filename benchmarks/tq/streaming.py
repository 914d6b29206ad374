"""TransferQueue's own best practice as an arm: every rank pulls its micro-batches through a
``StreamingDataLoader`` with prefetch.

How TransferQueue 0.1.11 means it to be used (``transfer_queue.dataloader``): each rank iterates a
``StreamingDataLoader`` over a ``StreamingDataset`` of one partition; the controller's ``RankAwareSampler``
hands the ranks of one DP group the same samples (the first rank of the group to ask for batch ``i`` samples
the ready rows, the others get the same ones); a loader worker process (its own client) fetches batches ahead,
``prefetch_factor`` of them. The controller runs in polling mode (an empty answer while too few rows are ready;
the dataset then sleeps a second and asks again), the mode the loader needs. Here a fetched batch is one
micro-batch (``batch_size == micro_batch_size``), so micro-batch 0 is not held back behind the rest.

What differs from the other arms, by TransferQueue's design: the sampler takes ready rows first come, first
served, and micro-batches are a fixed number of rows, not the workload's token-balanced plan; a rank receives
whole rows (no CP split). The rows carry the token fields only: the images (layout ``b``'s separate rows) are
not read by this arm, which favours TransferQueue.

Per step the step's rows are put under fresh keys into one streaming partition; the clock of a DP group starts
at the later of the last put returning and the group's loop asking for the step, as for every arm
(:func:`transfer_accounting.one_clock_exposed`). This arm has no cold step: a worker prefetches past the end of
its group's share, and the sampler serves ready rows first come, first served to whichever DP group asks, so a
group's prefetch takes rows another group needs for the current step. With only the current step's rows put,
that starves a group until the next step's rows arrive (seen in smoke runs: the loaders kept polling forever).
The arm therefore keeps ``lead`` steps of rows put ahead (enough to cover every worker's prefetch), which is the
steady state, and reports that figure only.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import transfer_queue as tq
from tensordict import TensorDict
from transfer_accounting import StepMeasurement, arm_report, one_clock_exposed
from transfer_queue.dataloader import StreamingDataLoader, StreamingDataset
from transfer_workload import Workload, trajectory_fields

from tq.layout import jagged
from tq.reads import field_rows, payload_bytes

logger = logging.getLogger(__name__)

ARM = "transferqueue-streaming-prefetch"
STREAM_PARTITION = "stream"
TASK = "train"
PREFETCH_FACTOR = 2  # TransferQueue's own example's value
# The controller settings the loader needs; every other arm reads by key and is unaffected by them.
CONTROLLER_SETTINGS = {"sampler": "RankAwareSampler", "polling_mode": True}


def rows_per_micro_batch(per_group: int, planned_micro_batches: int) -> int:
    """The smallest row count that divides a DP group's rows into at most the plan's number of micro-batches
    (a fetch of fewer ready rows than asked never returns, so every fetch must be full)."""
    for rows in range(1, per_group + 1):
        if per_group % rows == 0 and per_group // rows <= planned_micro_batches:
            return rows
    return per_group


class StreamingArm:
    """One loader per rank (``dp * cp * tp``), each with one worker process, alive for the whole session."""

    def __init__(self, workload: Workload, tq_config: Any, *, planned_micro_batches: int) -> None:
        config = workload.config
        self._workload = workload
        self._fields = [spec.name for spec in config.token_fields]
        per_group = workload.num_trajectories // config.dp
        if per_group * config.dp != workload.num_trajectories:
            raise ValueError("num_prompts x rollouts_per_prompt must be a multiple of dp for this arm")
        self.rows = rows_per_micro_batch(per_group, planned_micro_batches)
        self.micro_batches = per_group // self.rows
        self._next_step = 0  # the next step to consume, session-wide
        self._put_through = 0  # steps put so far, session-wide
        self._put_at: dict[int, float] = {}
        self._iterators: dict[tuple[int, int, int], Iterator[Any]] = {}
        for rank in config.topology.ranks():
            dataset = StreamingDataset(config=tq_config, batch_size=self.rows, micro_batch_size=self.rows,
                                       data_fields=self._fields, partition_id=STREAM_PARTITION, task_name=TASK,
                                       dp_rank=rank.dp)
            loader = StreamingDataLoader(dataset, num_workers=1, prefetch_factor=PREFETCH_FACTOR,
                                         multiprocessing_context="spawn", persistent_workers=True)
            self._iterators[(rank.dp, rank.cp, rank.tp)] = iter(loader)

    async def _put(self, step: int) -> float:
        """Put one step's rows under fresh keys, prompt by prompt; returns when the last put returned."""
        workload = self._workload
        for prompt in range(workload.config.num_prompts):
            members = list(workload.trajectories_of_prompt(prompt))
            per_trajectory = [trajectory_fields(workload, i) for i in members]
            columns = {name: jagged([f[name] for f in per_trajectory]) for name in self._fields}
            await tq.async_kv_batch_put(keys=[f"s{step}-traj-{i:06d}" for i in members],
                                        partition_id=STREAM_PARTITION,
                                        fields=TensorDict(columns, batch_size=len(members)))
        return time.time()

    def _group(self, dp_rank: int, steps: int, records: list[list[dict[str, Any]]], failed: list[str]) -> None:
        config = self._workload.config
        iterators = [it for (d, _, _), it in self._iterators.items() if d == dp_rank]
        try:
            for step in range(steps):
                record: dict[str, Any] = {"asked": time.time(), "ready": [], "compute_end": [], "bytes": 0,
                                          "rows": 0, "compute_s": 0.0}
                for _ in range(self.micro_batches):
                    micros = [next(iterator)[0] for iterator in iterators]
                    record["ready"].append(time.time())
                    tokens = sum(int(row.shape[0]) for row in field_rows(micros[0], "input_ids"))
                    record["bytes"] += sum(payload_bytes(micro) for micro in micros)
                    record["rows"] += sum(int(micro.batch_size[0]) for micro in micros)
                    slept = time.perf_counter()
                    time.sleep(config.seconds_per_token * tokens)
                    record["compute_s"] += time.perf_counter() - slept
                    record["compute_end"].append(time.time())
                records[step][dp_rank] = record
        except BaseException as error:  # the arm fails with it once the other groups are done
            failed.append(f"DP group {dp_rank}: {type(error).__name__}: {error}")

    async def run(self, *, warmup_steps: int, steps: int) -> dict[str, Any]:
        config = self._workload.config
        total = warmup_steps + steps
        first = self._next_step
        self._next_step += total
        # Rows put ahead must cover every worker's prefetch beyond the current step (see the module docstring).
        lead = -(-PREFETCH_FACTOR // self.micro_batches)
        records: list[list[dict[str, Any]]] = [[{} for _ in range(config.dp)] for _ in range(total)]
        failed: list[str] = []
        groups = [threading.Thread(target=self._group, args=(d, total, records, failed), daemon=True)
                  for d in range(config.dp)]
        for group in groups:
            group.start()
        for step in range(total):
            while self._put_through <= first + step + lead:  # session-wide: a later run goes on from here
                self._put_at[self._put_through] = await self._put(self._put_through)
                self._put_through += 1
            while not failed and not all(records[step]) and any(g.is_alive() for g in groups):
                await asyncio.sleep(0.005)
            if failed or not all(records[step]):
                raise RuntimeError(f"{ARM}: {failed[0] if failed else 'a DP group stopped'}")
            start = self._put_at.pop(first + step)
            exposed = [one_clock_exposed(start=max(start, r["asked"]), ready=r["ready"],
                                         compute_end=r["compute_end"]) for r in records[step]]
            kind = "warm-up" if step < warmup_steps else "steady"
            logger.info("[%s] step %d (%s): exposed on one clock %.4f s", ARM, step, kind, max(exposed))
            records[step][0]["exposed"] = exposed
        for group in groups:
            group.join(timeout=60)
        measured = records[warmup_steps:]
        rows_each = self._workload.num_trajectories * config.cp * config.tp
        if sum(r["rows"] for step in measured for r in step) != rows_each * len(measured):
            raise RuntimeError(f"{ARM}: the ranks did not receive a step's rows {config.cp * config.tp} times")
        steps_out = [StepMeasurement(step_s=max(r["compute_end"][-1] for r in step) - min(r["asked"] for r in step),
                                     data_wait_s=tuple(step[0]["exposed"]),
                                     compute_s=tuple(r["compute_s"] for r in step),
                                     bytes_moved_from_storage=sum(r["bytes"] for r in step)) for step in measured]
        one_clock = [max(step[0]["exposed"]) for step in measured]
        report = arm_report(arm=ARM, workload=self._workload, steps=steps_out, details={
            "layout": "streaming",
            "medium": "TransferQueue SimpleStorage: in-memory storage units (Ray actors), loopback ZMQ",
            "readers": (f"one StreamingDataLoader per rank ({config.dp * config.cp * config.tp}), one worker process "
                        f"each, prefetch_factor {PREFETCH_FACTOR}; {self.micro_batches} micro-batches of "
                        f"{self.rows} rows per DP group, rows sampled first come first served"),
            "images": "not read by this arm (favours TransferQueue)",
            "steps_put_ahead": lead,
            "exposed_one_clock_cold_s": None,
            "exposed_one_clock_steady_s_per_step": statistics.median(one_clock),
        })
        for step_report, value in zip(report["steps"], one_clock, strict=True):
            step_report.update({"exposed_one_clock_s": value, "kind": "steady"})
        return report

    def close(self) -> None:
        for iterator in self._iterators.values():
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._iterators.clear()

