"""The KnitTrans arms of ``benchmarks/transfer.py``: eager and iter (consumption-driven) delivery.

Everything is real: the admission service (``knittrans admission serve``) admits each step's trajectories as one
mini-batch and plans it; one reorg sidecar (``knittrans reorg serve``) per backbone (DP, CP) pair reads its CP
ranges and packs micro-batches into shared memory, and one encoder sidecar per encoder DP rank reads the step's
unique images once; the trainer ranks consume them through ``TrainerClient``, TP ranks sharing their sidecar.
Each DP group's ranks (CP x TP clients, plus the encoder rank the group hosts) live in one process of their own.

Per step:

1. the step's units are written to the unit store before the arm's steps run (not timed, as the TransferQueue
   arm's writes are not);
2. the metadata is reported, the last trajectory apart, and the clock starts as the last one's report goes out
   (an extra cold step reports the whole step at once inside its clock instead, this benchmark's clock before);
   a cold step is reported half a second after the step before it ended, once the service has deleted that
   step's units (TransferQueue's steps have no deletion beside them either);
   the service admits and dispatches the assignments. With ``report_ahead`` the
   next step's metadata is reported while this one trains (the rollouts run one mini-batch ahead, which the
   engine's ``max_batches_ahead`` of 1 allows), so the next mini-batch can be staged before the loop asks for
   it. It is reported once every group holds this step's micro-batch 0: a step's first micro-batch then never
   shares the machine with the next mini-batch's admission and dispatch, as TransferQueue's steps share it with
   no next step's puts (the next mini-batch's last rollout finishes at some point of a multi-second step; the
   earliest point the steady state can use is the one after the cold clock stops);
3. the group runs its micro-batches in lockstep: all its ranks must hold micro-batch i before it computes
   (simulated, ``seconds_per_token x tokens``); before micro-batch 0 every encoder rank must hold all its inputs
   (encoders run first and exchange encodings, as in the encoding-reuse helper);
4. exposed transfer on the one clock (:func:`transfer_accounting.one_clock_exposed`, the TransferQueue arms'
   definition too) starts at the later of the report and the group's loop asking for the mini-batch, and
   counts everything the loop spends outside compute; the largest group's is the step's. The first measured
   step is cold (reported while the trainer waits), and so is the extra one after it, reported whole; with
   ``report_ahead`` the later ones are the steady state.
   The earlier figure, from the moment the last consumer the group depends on had its assignment and without
   the loop's own take/release work, is kept as ``exposed_from_last_assignment_s``. The loop thread's own CPU
   for taking micro-batches (``time.thread_time``) is kept per step and group as
   ``loop_take_cpu_s_per_dp_group``, and the worst group's in a steady step as
   ``steady_loop_take_cpu_s_per_step``: the client's share of the steady state, apart from the machine's
   scheduling.

Bytes moved are what the sidecars' unit-store clients' I/O really moved (their status counters over the measured
steps, divided by their number: the counts the store's reads and transfers returned, failed attempts included);
every step also checks that every real token and every distinct image was delivered.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from process_cpu import CpuMeter, cpu_in_window, machine_busy_fraction, machine_cpu_seconds, usable_cpus
from transfer_accounting import StepMeasurement, arm_report, one_clock_exposed
from transfer_knittrans_cluster import ENCODER, Cluster, Consumer, image_cost, start_cluster
from transfer_workload import Workload, WorkloadConfig, build_workload, prompt_images, trajectory_fields

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.rollout import MultimodalInput, RolloutClient, Trajectory
from knittrans.stack_dump import STACK_DUMP_SIGNAL, dump_stacks_on_signal
from knittrans.store.factory import open_store
from knittrans.trainer import DeliveryMode, TrainerClient, TrainerSettings
from knittrans.types import TokenSpan, TrajectoryMeta, VersionSegment

logger = logging.getLogger("transfer_knittrans")

SETTLE_BEFORE_COLD_STEP_S = 0.5
STEP_TIMEOUT_S = 600.0  # a step that has not ended by then is stalled: every process's stacks are dumped


# ------------------------------------------------------------------------------------------------ data


def placeholders(config: WorkloadConfig) -> list[TokenSpan]:
    """Where each of a trajectory's images is consumed: inside the shortest possible trajectory."""
    stride = max(2, config.min_tokens // (config.images_per_prompt + 1))
    rows = max(1, stride // 2)
    return [TokenSpan(start=1 + k * stride, end=1 + k * stride + rows) for k in range(config.images_per_prompt)]


def write_step(workload: Workload, store: Any, job: str, step: int,
               version: int | None = None) -> tuple[list[TrajectoryMeta], float]:
    """Store one step's units (fresh ids: the service admits a trajectory once); returns the metadata.
    ``version``: the policy version that generated them (default ``step``; one less for a step reported ahead,
    whose rollouts ran while the step before it trained)."""
    config = workload.config
    rollout = RolloutClient(store, namespace=job)
    spans = placeholders(config)
    cost = image_cost(config)
    started = time.perf_counter()
    metas: list[TrajectoryMeta] = []
    for prompt in range(config.num_prompts):
        images = prompt_images(workload, prompt) if config.images_per_prompt else None
        batch = []
        for i in workload.trajectories_of_prompt(prompt):
            fields = trajectory_fields(workload, i)
            batch.append(Trajectory(
                trajectory_id=f"s{step}-t{i}", sample_id=f"s{step}-p{prompt}", source="bench", rollout_step=step,
                segments=(VersionSegment(version=step if version is None else version,
                                         num_tokens=workload.lengths[i]),), fields=fields,
                multimodal=tuple(MultimodalInput(data=images[k], encoder=ENCODER, cost=cost, placeholder=spans[k])
                                 for k in range(config.images_per_prompt)),
                loss_mask_field=None, finished_at=float(step),
            ))
        metas.extend(rollout.submit_many(batch))
    return metas, time.perf_counter() - started


# ------------------------------------------------------------------------------------------------ ranks


@dataclass(frozen=True, kw_only=True)
class GroupTask:
    """What one DP-group process runs: its CP x TP backbone ranks, and the encoder rank it hosts."""

    dp_rank: int
    backbone_sockets: tuple[tuple[int, int, str], ...]  # (cp rank, tp rank, socket)
    encoder_socket: str
    admission: str
    mode: str
    prefetch: int
    steps: int
    config: dict[str, Any]


@dataclass
class Sync:
    """Cross-process meeting points: every group is up, and per step encoders done (every encoder rank holds its
    inputs; the encoders run before the backbone). Nothing else holds a group between steps: it asks for the
    next mini-batch as soon as it completed one, as a training loop does."""

    ready: Any  # every group process has its clients (torch imported, prefetching started)
    encoders_done: list[Any]
    first_microbatch_held: Any  # a queue: (step, dp rank) once the group's ranks all hold micro-batch 0


def group_main(task: GroupTask, sync: Sync, results: Any) -> None:
    """A DP group's process (as each rank is a process of its own in a job): one thread advances the group's
    CP x TP iterators in lockstep, as the TransferQueue arm runs one task per group; micro-batch i computes once
    every rank of the group holds it. A second thread consumes the encoder rank this group hosts."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    dump_stacks_on_signal()  # a process of its own: the arm's stall dumps its threads' stacks to stderr
    # The group's thread shares the interpreter with its ranks' prefetch threads: hand the GIL over at a finer
    # grain than the default 5 ms, as a training process whose main thread launches kernels would want.
    sys.setswitchinterval(2e-4)
    config = WorkloadConfig.from_dict(task.config)
    mode = DeliveryMode(task.mode)

    def client(socket: str, *, tp_rank: int, global_rank: int, advance: bool) -> TrainerClient:
        return TrainerClient(TrainerSettings(
            sidecar=socket, tp_rank=tp_rank, global_rank=global_rank, mode=mode, device="cpu", prefetch=task.prefetch,
            admission=ConnectionSettings(target=task.admission), advance_version=advance,
            sidecar_timeout_seconds=30,
        ))

    clients = [client(socket, tp_rank=t, global_rank=(task.dp_rank * config.cp + c) * config.tp + t,
                      advance=(task.dp_rank, c, t) == (0, 0, 0))
               for c, t, socket in task.backbone_sockets]
    encoder = client(task.encoder_socket, tp_rank=0, global_rank=task.dp_rank, advance=False)
    encoder_records: list[dict[str, Any]] = [{} for _ in range(task.steps)]
    encoders_ready = [threading.Event() for _ in range(task.steps)]

    def encoder_loop() -> None:
        minis = encoder.mini_batches()
        for step in range(task.steps):
            mini = next(minis)
            images = sum(int(micro["inputs"].shape[0]) for micro in mini if "inputs" in micro)
            sync.encoders_done[step].wait()  # every encoder rank holds all its inputs
            encoder_records[step] = {"assigned_at": mini.descriptor.assigned_at,
                                     "published_at": mini.descriptor.published_at, "images": images,
                                     "encoders_ready": time.time()}
            encoders_ready[step].set()
            mini.complete()

    encoder_thread = threading.Thread(target=encoder_loop, daemon=True)
    encoder_thread.start()
    sync.ready.wait()
    try:
        streams = [c.mini_batches() for c in clients]
        for step in range(task.steps):
            record: dict[str, Any] = {"dp": task.dp_rank, "step": step, "ready": [], "compute_end": [],
                                      "compute_s": 0.0, "tokens": 0, "real_tokens": 0, "client_blocked": [],
                                      "take_cpu_s": 0.0, "asked": time.time()}
            minis = [next(stream) for stream in streams]
            record["assigned_at"] = [m.descriptor.assigned_at for m in minis]
            record["published_at"] = [m.descriptor.published_at for m in minis]
            encoders_ready[step].wait()
            iterators = [iter(mini) for mini in minis]
            while True:
                # The loop thread's own CPU for taking the ranks' next micro-batches and dropping the ones they
                # replace: wall-clock gaps mix it with waiting for the GIL and the CPU, this does not.
                taking = time.thread_time()
                micros = [next(iterator, None) for iterator in iterators]
                record["take_cpu_s"] += time.thread_time() - taking
                if micros[0] is None:
                    break
                record["ready"].append(time.time())
                if len(record["ready"]) == 1:
                    sync.first_microbatch_held.put((step, task.dp_rank))
                record["client_blocked"].append(max(m.waited_seconds for m in micros))
                started = time.perf_counter()
                tokens = int(micros[0]["seq_lengths"].sum()) if "seq_lengths" in micros[0] else 0
                record["real_tokens"] += sum(_real_tokens(m) for m, (_, t, _) in
                                             zip(micros, task.backbone_sockets, strict=True) if t == 0)
                time.sleep(max(0.0, config.seconds_per_token * tokens - (time.perf_counter() - started)))
                record["compute_s"] += time.perf_counter() - started
                record["compute_end"].append(time.time())
                record["tokens"] += tokens
            reporting = time.perf_counter()
            for mini in minis:
                mini.complete()  # the optimizer step: tp rank 0 reports it; global rank 0 advances the version
            record["step_end_report_s"] = time.perf_counter() - reporting
            record["encoder"] = encoder_records[step]
            results.put(record)
    except BaseException as error:
        results.put({"dp": task.dp_rank, "error": f"{type(error).__name__}: {error}"})
        for barrier in [sync.ready, *sync.encoders_done]:
            barrier.abort()
    finally:
        encoder_thread.join(timeout=5)
        for c in [*clients, encoder]:
            c.close()


def _real_tokens(micro: Any) -> int:
    """Real (non-padding) tokens of this CP rank: positions below the sequence length."""
    cu = micro["cu_seqlens"].numpy()
    lengths = micro["seq_lengths"].numpy()
    positions = micro["position_ids"].numpy()[: cu[-1]]
    return int((positions < np.repeat(lengths, np.diff(cu))).sum())


# ------------------------------------------------------------------------------------------------ arm


def measure(records: Sequence[dict[str, Any]], config: WorkloadConfig, *, reported: float,
            bytes_moved: int) -> tuple[StepMeasurement, dict[str, Any]]:
    """One step's figures from its DP groups' records.

    On the one clock (``exposed_one_clock_s``) a group's step starts at the later of ``reported`` and its loop
    asking for the mini-batch, and every second its loop spent outside compute counts
    (:func:`transfer_accounting.one_clock_exposed`).

    The earlier figure (``exposed_from_last_assignment_s``, the StepMeasurement's exposed transfer) starts when
    every consumer the group depends on held its assignment (its own backbone sidecars and every encoder
    sidecar): micro-batch 0's arrival after that, plus, for every later micro-batch, the longest time one of
    its ranks sat blocked because the micro-batch was not there yet; the loop's own per-micro-batch work
    (taking the next micro-batch, releasing the previous one) is apart, as loop overhead.
    """
    encoder_assigned = [r["encoder"]["assigned_at"] for r in records]
    by_group = sorted(records, key=lambda r: r["dp"])
    starts, waits, computes, ends, first, overhead, one_clock = [], [], [], [], [], [], []
    for record in by_group:
        start = max([*record["assigned_at"], *encoder_assigned])
        blocked_later = sum(record["client_blocked"][1:])
        previous, between = start, 0.0
        for ready, end in zip(record["ready"], record["compute_end"], strict=True):
            between += max(0.0, ready - previous)
            previous = end
        starts.append(start)
        first.append(record["ready"][0] - start)
        waits.append(first[-1] + blocked_later)
        overhead.append(between - waits[-1])
        computes.append(record["compute_s"])
        ends.append(record["compute_end"][-1])
        one_clock.append(one_clock_exposed(start=max(reported, record["asked"]), ready=record["ready"],
                                           compute_end=record["compute_end"]))
    assigned = [t for r in records for t in r["assigned_at"]] + encoder_assigned
    measurement = StepMeasurement(step_s=max(ends) - min(starts), data_wait_s=tuple(waits),
                                  compute_s=tuple(computes), bytes_moved_from_storage=bytes_moved)
    blocked = [w - f for w, f in zip(waits, first, strict=True)]
    extra = {
        "reported_at": reported,  # wall clock, to line the step up with the processes' logs or a trace
        "exposed_one_clock_s": max(one_clock),
        "exposed_one_clock_s_per_dp_group": one_clock,
        "exposed_from_last_assignment_s": measurement.exposed_transfer_s,
        "trainer_asked_after_report_s": max(r["asked"] for r in records) - reported,
        "first_microbatch_ready_s_per_dp_group": first,
        "blocked_after_first_microbatch_s_per_dp_group": blocked,
        "loop_overhead_s_per_dp_group": overhead,
        "exposed_including_loop_overhead_s": max(w + o for w, o in zip(waits, overhead, strict=True)),
        "dispatch_spread_s": max(assigned) - min(assigned),
        "report_to_dispatch_s": max(assigned) - reported,
        # the report to the group's ranks all holding micro-batch 0, plus its later waits (without loop overhead)
        "exposed_from_report_s": max(r["ready"][0] - reported + b for r, b in zip(by_group, blocked, strict=True)),
        "encoder_inputs_ready_s": max(r["encoder"]["encoders_ready"] for r in records) - min(starts),
        # The loop's report of its optimizer step (an RPC to the admission service, synchronous on the loop's
        # thread) comes after the step's last compute and before it asks for the next mini-batch: outside both
        # clocks above, shown here so that it is not hidden. In a job it overlaps the GPU's optimizer step.
        "step_end_report_s_per_dp_group": [r["step_end_report_s"] for r in by_group],
        "loop_take_cpu_s_per_dp_group": [r["take_cpu_s"] for r in by_group],
        "real_tokens_delivered": sum(r["real_tokens"] for r in records),
        "images_delivered": sum(r["encoder"]["images"] for r in records),
        "simulated_compute_tokens_per_dp_group": [r["tokens"] for r in by_group],
    }
    return measurement, extra


def _cpu_meter(cluster: Cluster, trainers: Sequence[multiprocessing.process.BaseProcess]) -> CpuMeter:
    """The run's processes in groups: the service, the sidecars by role (one process hosting every consumer is
    one group), the DP-group processes, this driver and, on Mooncake, its master and segment owner."""
    group_of_pid = {process.popen.pid: "encoder_sidecars" if consumer.role.startswith("encoder")
                    else "backbone_sidecars" for consumer, process in cluster.sidecars.items()}
    if len(group_of_pid) == 1:
        group_of_pid = dict.fromkeys(group_of_pid, "sidecars")
    sidecars: dict[str, list[int]] = {}
    for pid, group in group_of_pid.items():
        sidecars.setdefault(group, []).append(pid)
    groups: dict[str, list[int]] = {"admission": [cluster.admission.popen.pid], **sidecars,
                                    "trainer_processes": [p.pid for p in trainers if p.pid is not None],
                                    "driver": [os.getpid()]}
    if cluster.mooncake is not None:
        groups["mooncake"] = [cluster.mooncake.master.pid, cluster.mooncake.owner.pid]
    return CpuMeter.of(groups)


def _moved(cluster: Cluster, before: dict[Consumer, Any]) -> tuple[int, int, int]:
    """Bytes read, bytes the plans needed and read calls of every sidecar since ``before``."""
    after = cluster.statuses()
    return (sum(after[c].bytes_read - before[c].bytes_read for c in after),
            sum(after[c].bytes_needed - before[c].bytes_needed for c in after),
            sum(after[c].read_calls - before[c].read_calls for c in after))


def run_arm(cluster: Cluster, workload: Workload, mode: DeliveryMode, *, first_step: int, warmup_steps: int,
            steps: int, prefetch: int, report_ahead: bool = False, whole_report_cold_step: bool = False,
            step_timeout_s: float = STEP_TIMEOUT_S) -> dict[str, Any]:
    """Warm-up steps, then ``steps`` measured ones; the first measured step is cold. With
    ``whole_report_cold_step`` one more cold step follows it, its whole step reported inside its clock. With
    ``report_ahead`` every later step is reported as soon as the one before it was (the steady state; see the
    module docstring). The report's ``steps_run`` is how many steps (trajectory ids) the arm used."""
    config = workload.config
    total = warmup_steps + steps + whole_report_cold_step
    whole_report_step = warmup_steps + 1 if whole_report_cold_step else None
    last_cold_step = warmup_steps + whole_report_cold_step
    context = multiprocessing.get_context("spawn")
    sync = Sync(ready=context.Barrier(config.dp + 1), encoders_done=[context.Barrier(config.dp) for _ in range(total)],
                first_microbatch_held=context.Queue())
    results = context.Queue()
    store = open_store(cluster.store_url, job=cluster.job)
    arm = f"knittrans-{mode.value}"
    ahead = [report_ahead and last_cold_step < step for step in range(total)]
    written = [write_step(workload, store, cluster.job, first_step + step, first_step + step - ahead[step])
               for step in range(total)]
    processes = []
    for d in range(config.dp):
        task = GroupTask(
            dp_rank=d,
            backbone_sockets=tuple((c, t, cluster.socket(Consumer(role="backbone", dp_rank=d, cp_rank=c)))
                                   for c in range(config.cp) for t in range(config.tp)),
            encoder_socket=cluster.socket(Consumer(role=f"encoder:{ENCODER}", dp_rank=d)),
            admission=cluster.address, mode=mode.value, prefetch=prefetch, steps=total, config=config.to_dict(),
        )
        process = context.Process(target=group_main, args=(task, sync, results), name=f"dp-group-{d}", daemon=True)
        process.start()
        processes.append(process)
    measured: list[tuple[StepMeasurement, dict[str, Any]]] = []
    reported: dict[int, float] = {}
    in_last_report: dict[int, int] = {}
    waiting: dict[int, list[dict[str, Any]]] = {}
    before: dict[Consumer, Any] = {}
    meter = _cpu_meter(cluster, processes)
    cpu_before: dict[int, tuple[dict[str, float], tuple[float, float]]] = {}
    cpu_during: dict[int, dict[str, float]] = {}
    ended = False  # else the groups may wait on barriers or queues forever: stop them at once
    try:
        sync.ready.wait(timeout=300)  # nothing of a step is timed before the ranks are up
        with AdmissionClient(cluster.address) as admission:

            def report(step: int) -> None:
                """The clock starts as the step's last trajectory is reported, its others reported before (as
                TransferQueue's arms put every row before their clocks start); the extra cold step reports the
                whole step at once, inside its clock (this benchmark's clock before)."""
                metas = written[step][0]
                if step != whole_report_step:
                    admission.report(metas[:-1])
                    metas = metas[-1:]
                if warmup_steps <= step <= last_cold_step:
                    cpu_before[step] = meter.snapshot(), machine_cpu_seconds()
                reported[step] = time.time()
                in_last_report[step] = len(metas)
                admission.report(metas)

            held: dict[int, int] = {}

            def stalled(what: str) -> RuntimeError:
                """Every process's threads' stacks, for a step that never ended: the services' in the cluster's
                logs, the DP groups' in this process's stderr."""
                cluster.dump_stacks()
                for process in processes:
                    if process.pid is not None and process.exitcode is None:
                        os.kill(process.pid, STACK_DUMP_SIGNAL)
                time.sleep(2.0)  # the dumps are written by each process's own signal handler
                return RuntimeError(f"{what}; every process's stacks were dumped (the services' to the cluster's "
                                    f"logs in {cluster.directory}, the DP groups' to stderr)")

            def wait_first_microbatch(step: int) -> None:
                """Until every group holds micro-batch 0 of ``step`` (a group that failed has its error in
                ``results`` instead, raised below once the step's records are collected)."""
                deadline = time.monotonic() + step_timeout_s
                while held.get(step, 0) < config.dp:
                    try:
                        held_step, _ = sync.first_microbatch_held.get(timeout=min(5.0, step_timeout_s))
                    except queue.Empty:
                        if not all(process.is_alive() for process in processes):
                            return
                        if time.monotonic() > deadline:
                            raise stalled(f"{arm}: step {step}'s micro-batch 0 not held after {step_timeout_s:g} s"
                                          ) from None
                        continue
                    held[held_step] = held.get(held_step, 0) + 1

            def next_record(step: int) -> dict[str, Any]:
                """The next group's record; a group that died without one (killed, or its interpreter gone) ends
                the arm at once, naming it, rather than after the ``step_timeout_s`` a slow step may take."""
                deadline = time.monotonic() + step_timeout_s
                while True:
                    try:
                        return results.get(timeout=min(5.0, step_timeout_s))
                    except queue.Empty:
                        # A group that ended cleanly has sent every record of its steps before it ended.
                        dead = [f"{process.name} (exit code {process.exitcode})" for process in processes
                                if process.exitcode not in (None, 0)]
                        if dead:
                            raise RuntimeError(f"{arm}: step {step}: {', '.join(dead)} ended without "
                                               "a record") from None
                        if time.monotonic() > deadline:
                            raise stalled(f"{arm}: step {step} not done after {step_timeout_s:g} s") from None

            for step in range(total):
                if step == warmup_steps:
                    before = cluster.statuses()  # the warm-up's reads are over: its records are in
                if step not in reported:
                    if warmup_steps <= step:  # a measured cold step
                        # The step before it has just released its mini-batch: the service is deleting its
                        # units, and the status calls above are still closing. TransferQueue's steps start with
                        # none of that under way (its rows are cleared after its last step), so neither does this.
                        time.sleep(SETTLE_BEFORE_COLD_STEP_S)
                    report(step)
                if step in cpu_before:  # a cold step: the CPU every process used until every group held it
                    wait_first_microbatch(step)
                    processes_before, machine_before = cpu_before[step]
                    cpu_during[step] = {
                        **cpu_in_window(processes_before, meter.snapshot(), window_s=time.time() - reported[step],
                                        cpus=usable_cpus()),
                        "machine_busy_fraction": machine_busy_fraction(machine_before, machine_cpu_seconds())}
                if report_ahead and last_cold_step <= step < total - 1:
                    wait_first_microbatch(step)
                    report(step + 1)  # lands while this step trains
                while len(waiting.get(step, [])) < config.dp:
                    record = next_record(step)
                    if "error" in record:
                        raise RuntimeError(f"{arm}: a DP group failed: {record['error']}")
                    waiting.setdefault(record["step"], []).append(record)
                records = waiting.pop(step)
                measurement, extra = measure(records, config, reported=reported[step], bytes_moved=0)
                expected_tokens = sum(workload.lengths)
                expected_images = config.num_prompts * config.images_per_prompt
                if (extra["real_tokens_delivered"], extra["images_delivered"]) != (expected_tokens, expected_images):
                    raise RuntimeError(f"{arm}: delivered {extra['real_tokens_delivered']} tokens and "
                                       f"{extra['images_delivered']} images, expected {expected_tokens} and "
                                       f"{expected_images}")
                kind = ("warm-up" if step < warmup_steps else "cold" if step == warmup_steps
                        else "cold-whole-step-report" if step == whole_report_step else "steady")
                extra.update({"kind": kind, "write_s": written[step][1],
                              "trajectories_in_last_report": in_last_report[step]})
                if step in cpu_during:
                    extra["cpu_until_every_group_held_it"] = cpu_during[step]
                logger.info("[%s] step %d (%s): %.2f s, exposed on one clock %.4f s, from the last assignment "
                            "%.4f s, report to dispatch %.4f s", arm, step, kind, measurement.step_s,
                            extra["exposed_one_clock_s"], measurement.exposed_transfer_s,
                            extra["report_to_dispatch_s"])
                if step >= warmup_steps:
                    measured.append((measurement, extra))
        moved, needed, read_calls = _moved(cluster, before)
        ended = True
    finally:
        store.close()
        for process in processes:
            process.join(timeout=30 if ended else 0)
            if process.is_alive():
                process.kill()
    per_step = [dataclasses.replace(m, bytes_moved_from_storage=moved // len(measured)) for m, _ in measured]
    extras = [e for _, e in measured]
    steady_extras = extras[1 + whole_report_cold_step:]
    steady = [e["exposed_one_clock_s"] for e in steady_extras]
    report = arm_report(arm=arm, workload=workload, steps=per_step, details={
        "mode": mode.value,
        "steps_run": total,
        "readers": (f"{config.dp * config.cp} backbone sidecars (one per DP x CP, shared by its {config.tp} TP "
                    f"ranks) + {config.dp} encoder sidecars, one outstanding batched read each"),
        "ranks": "one process per DP group holding its CP x TP ranks' clients and the encoder rank it hosts",
        "report_ahead": report_ahead,
        "bytes_needed_by_plans": needed // len(measured),
        "read_calls_per_step": read_calls / len(measured),
        "exposed_one_clock_cold_s": extras[0]["exposed_one_clock_s"],
        "cold_step_cpu": extras[0]["cpu_until_every_group_held_it"],
        "cold_step_machine_busy_fraction": extras[0]["cpu_until_every_group_held_it"]["machine_busy_fraction"],
        "exposed_one_clock_cold_whole_step_report_s": (extras[1]["exposed_one_clock_s"] if whole_report_cold_step
                                                       else None),
        "exposed_one_clock_steady_s_per_step": statistics.median(steady) if steady else None,
        # The worst DP group's loop thread CPU for its takes in a steady step (the part of the steady state that
        # is the client's own work, not the machine's scheduling).
        "steady_loop_take_cpu_s_per_step": statistics.median(
            max(e["loop_take_cpu_s_per_dp_group"]) for e in steady_extras) if steady else None,
        "exposed_from_last_assignment_s_per_step": statistics.median(
            e["exposed_from_last_assignment_s"] for e in extras),
        "first_microbatch_ready_s_per_step": [max(e["first_microbatch_ready_s_per_dp_group"]) for e in extras],
        "exposed_including_loop_overhead_s_per_step": float(np.mean(
            [e["exposed_including_loop_overhead_s"] for e in extras])),
        "step_end_report_s_per_step": statistics.median(
            max(e["step_end_report_s_per_dp_group"]) for e in extras),
    })
    for step_report, extra in zip(report["steps"], extras, strict=True):
        step_report.update(extra)
    return report


STORE_MEDIA = {
    "file": "the embedded file store: one file per unit on /dev/shm, read through a shared mapping",
    "mooncake": "a Mooncake store (its master and one segment on this host), read over its TCP transfer engine",
}


class KnitTransClusters:
    """One KnitTrans cluster per unit store, kept up for the whole run so that its arms interleave with the
    TransferQueue arms; :meth:`run` runs one arm on one of them."""

    def __init__(self, config: WorkloadConfig, *, stores: Sequence[str], slots: int = 2, prefetch: int = 1,
                 encoder_microbatch_images: int = 16, node_sidecars: bool = False) -> None:
        self._workload = build_workload(config)
        self._prefetch = prefetch
        self._settings = {"ring_slots": slots, "trainer_prefetch": prefetch,
                          "encoder_microbatch_images": encoder_microbatch_images,
                          "sidecar_processes": "one hosting every consumer" if node_sidecars else "one per consumer"}
        self._clusters: dict[str, Cluster] = {}
        self._next_step: dict[str, int] = {}
        self._described: dict[str, dict[str, Any]] = {}
        try:
            for store in stores:
                directory = Path(tempfile.mkdtemp(prefix=f"kt-transfer-{store}-"))
                started = time.perf_counter()
                cluster = start_cluster(config, store=store, directory=directory, slots=slots,
                                        encoder_microbatch_images=encoder_microbatch_images,
                                        node_sidecars=node_sidecars)
                self._clusters[store] = cluster
                self._next_step[store] = 0
                self._described[store] = {"store_url": cluster.store_url, "medium": STORE_MEDIA[store],
                                          "setup_s": time.perf_counter() - started,
                                          "sidecars": len(cluster.sidecars), "logs": str(directory)}
                logger.info("KnitTrans cluster on the %s store ready (%d sidecars)", store, len(cluster.sidecars))
        except BaseException:
            self.close()
            raise

    def run(self, store: str, mode: DeliveryMode, *, warmup_steps: int, steps: int,
            report_ahead: bool = True, step_timeout_s: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        report = run_arm(self._clusters[store], self._workload, mode, first_step=self._next_step[store],
                         warmup_steps=warmup_steps, steps=steps, prefetch=self._prefetch, report_ahead=report_ahead,
                         whole_report_cold_step=True, step_timeout_s=step_timeout_s)
        self._next_step[store] += report["steps_run"]
        report.update({"arm": f"knittrans-{mode.value}-{store}", "store": store, "medium": STORE_MEDIA[store]})
        return report

    def close(self, *, keep_logs: bool = False) -> dict[str, Any]:
        """Stop every cluster, and remove its run directory unless ``keep_logs``; returns the settings and, per
        store, what it was and the shared-memory segments its sidecars left (should be none)."""
        for store, cluster in self._clusters.items():
            self._described[store]["shm_segments_left_after_shutdown"] = len(cluster.stop(keep_logs=keep_logs))
            self._described[store]["logs"] = str(cluster.directory) if keep_logs else None
        self._clusters.clear()
        return {**self._settings, "stores": self._described}


def expected_amplification_one(arm: dict[str, Any]) -> bool:
    return bool(np.isclose(arm["amplification"], 1.0, rtol=0, atol=5e-3))
