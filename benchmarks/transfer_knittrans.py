"""The KnitTrans arms of ``benchmarks/transfer.py``: eager and iter (consumption-driven) delivery.

Everything is real: the admission service (``knittrans admission serve``) admits each step's trajectories as one
mini-batch and plans it; one reorg sidecar (``knittrans reorg serve``) per backbone (DP, CP) pair reads its CP
ranges and packs micro-batches into shared memory, and one encoder sidecar per encoder DP rank reads the step's
unique images once; the trainer ranks consume them through ``TrainerClient``, TP ranks sharing their sidecar.
Each DP group's ranks (CP x TP clients, plus the encoder rank the group hosts) live in one process of their own.

Per step:

1. the step's units are written to the unit store (not timed, as the TransferQueue arm's writes are not);
2. the metadata is reported; the service admits and dispatches the assignments;
3. a DP group's step starts when every consumer it depends on holds its assignment (its backbone sidecars and
   every encoder sidecar; ``assigned_at`` of the descriptors); the control plane's report-to-dispatch latency
   is reported separately;
4. the group runs its micro-batches in lockstep: all its ranks must hold micro-batch i before it computes
   (simulated, ``seconds_per_token x tokens``); before micro-batch 0 every encoder rank must hold all its inputs
   (encoders run first and exchange encodings, as in the encoding-reuse helper);
5. its data wait is micro-batch 0's arrival after the start, plus every later micro-batch's wait while it was
   not staged yet. The loop's own per-micro-batch work (taking the next micro-batch, releasing the previous
   one) is reported separately as loop overhead. Exposed transfer is the largest group's wait, as in
   :mod:`transfer_workload`.

Bytes moved are what the sidecars' unit-store clients' I/O really moved (their status counters, per step: the
counts the store's reads and transfers returned, failed attempts included); every step also
checks that every real token and every distinct image was delivered.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transfer_accounting import StepMeasurement, arm_report
from transfer_knittrans_cluster import ENCODER, Cluster, Consumer, image_cost, start_cluster
from transfer_workload import Workload, WorkloadConfig, build_workload, prompt_images, trajectory_fields

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.rollout import MultimodalInput, RolloutClient, Trajectory
from knittrans.store.factory import open_store
from knittrans.trainer import DeliveryMode, TrainerClient, TrainerSettings
from knittrans.types import TokenSpan, TrajectoryMeta, VersionSegment

logger = logging.getLogger("transfer_knittrans")


# ------------------------------------------------------------------------------------------------ data


def placeholders(config: WorkloadConfig) -> list[TokenSpan]:
    """Where each of a trajectory's images is consumed: inside the shortest possible trajectory."""
    stride = max(2, config.min_tokens // (config.images_per_prompt + 1))
    rows = max(1, stride // 2)
    return [TokenSpan(start=1 + k * stride, end=1 + k * stride + rows) for k in range(config.images_per_prompt)]


def write_step(workload: Workload, store: Any, job: str, step: int) -> tuple[list[TrajectoryMeta], float]:
    """Store one step's units (fresh ids: the service admits a trajectory once); returns the metadata."""
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
                segments=(VersionSegment(version=step, num_tokens=workload.lengths[i]),), fields=fields,
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
    """Cross-process meeting points, one per step: encoders done (every encoder rank holds its inputs; the
    encoders run before the backbone), and step done (every group finished, the main process reads results)."""

    ready: Any  # every group process has its clients (torch imported, prefetching started)
    encoders_done: list[Any]
    step_done: list[Any]


def group_main(task: GroupTask, sync: Sync, results: Any) -> None:
    """A DP group's process (as each rank is a process of its own in a job): one thread advances the group's
    CP x TP iterators in lockstep, as the TransferQueue arm runs one task per group; micro-batch i computes once
    every rank of the group holds it. A second thread consumes the encoder rank this group hosts."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
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
            record: dict[str, Any] = {"dp": task.dp_rank, "ready": [], "compute_end": [], "compute_s": 0.0,
                                      "tokens": 0, "real_tokens": 0, "client_blocked": []}
            minis = [next(stream) for stream in streams]
            record["assigned_at"] = [m.descriptor.assigned_at for m in minis]
            record["published_at"] = [m.descriptor.published_at for m in minis]
            encoders_ready[step].wait()
            iterators = [iter(mini) for mini in minis]
            while True:
                micros = [next(iterator, None) for iterator in iterators]
                if micros[0] is None:
                    break
                record["ready"].append(time.time())
                record["client_blocked"].append(max(m.waited_seconds for m in micros))
                started = time.perf_counter()
                tokens = int(micros[0]["seq_lengths"].sum()) if "seq_lengths" in micros[0] else 0
                record["real_tokens"] += sum(_real_tokens(m) for m, (_, t, _) in
                                             zip(micros, task.backbone_sockets, strict=True) if t == 0)
                time.sleep(max(0.0, config.seconds_per_token * tokens - (time.perf_counter() - started)))
                record["compute_s"] += time.perf_counter() - started
                record["compute_end"].append(time.time())
                record["tokens"] += tokens
            for mini in minis:
                mini.complete()  # the optimizer step: tp rank 0 reports it; global rank 0 advances the version
            record["encoder"] = encoder_records[step]
            results.put(record)
            sync.step_done[step].wait()
    except BaseException as error:
        results.put({"dp": task.dp_rank, "error": f"{type(error).__name__}: {error}"})
        for barrier in [sync.ready, *sync.encoders_done, *sync.step_done]:
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


def measure(records: Sequence[dict[str, Any]], config: WorkloadConfig,
            bytes_moved: int) -> tuple[StepMeasurement, dict[str, Any]]:
    """A DP group's step starts when every consumer it depends on holds its assignment (its own backbone
    sidecars and every encoder sidecar), as the TransferQueue arm's starts with the plan known to every rank;
    the control plane's report-to-dispatch latency is reported apart.

    Its data wait is micro-batch 0's arrival at all its ranks after that start, plus, for every later
    micro-batch, the longest time one of its ranks sat blocked because the micro-batch was not there yet. The
    rest of the time between two computes is the training loop's own per-micro-batch work (taking the next
    micro-batch, releasing the previous one); it is reported apart as loop overhead.
    """
    encoder_assigned = [r["encoder"]["assigned_at"] for r in records]
    by_group = sorted(records, key=lambda r: r["dp"])
    starts, waits, computes, ends, first, overhead = [], [], [], [], [], []
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
    assigned = [t for r in records for t in r["assigned_at"]] + encoder_assigned
    measurement = StepMeasurement(step_s=max(ends) - min(starts), data_wait_s=tuple(waits),
                                  compute_s=tuple(computes), bytes_moved_from_storage=bytes_moved)
    extra = {
        "first_microbatch_ready_s_per_dp_group": first,
        "blocked_after_first_microbatch_s_per_dp_group": [w - f for w, f in zip(waits, first, strict=True)],
        "loop_overhead_s_per_dp_group": overhead,
        "exposed_including_loop_overhead_s": max(w + o for w, o in zip(waits, overhead, strict=True)),
        "dispatch_spread_s": max(assigned) - min(assigned),
        "encoder_inputs_ready_s": max(r["encoder"]["encoders_ready"] for r in records) - min(starts),
        "real_tokens_delivered": sum(r["real_tokens"] for r in records),
        "images_delivered": sum(r["encoder"]["images"] for r in records),
        "simulated_compute_tokens_per_dp_group": [r["tokens"] for r in by_group],
    }
    return measurement, extra


def run_arm(cluster: Cluster, workload: Workload, mode: DeliveryMode, *, first_step: int, warmup_steps: int,
            steps: int, prefetch: int) -> dict[str, Any]:
    config = workload.config
    total = warmup_steps + steps
    context = multiprocessing.get_context("spawn")
    sync = Sync(ready=context.Barrier(config.dp + 1),
                encoders_done=[context.Barrier(config.dp) for _ in range(total)],
                step_done=[context.Barrier(config.dp + 1) for _ in range(total)])
    results = context.Queue()
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
    sync.ready.wait(timeout=300)  # nothing of a step is timed before the ranks are up
    store = open_store(cluster.store_url, job=cluster.job)
    arm = f"knittrans-{mode.value}"
    measured: list[StepMeasurement] = []
    extras: list[dict[str, Any]] = []
    try:
        with AdmissionClient(cluster.address) as admission:
            for step in range(total):
                metas, write_s = write_step(workload, store, cluster.job, first_step + step)
                before = cluster.statuses()
                reported = time.time()
                admission.report(metas)
                records = [results.get(timeout=600) for _ in range(config.dp)]
                failed = [r["error"] for r in records if "error" in r]
                if failed:
                    raise RuntimeError(f"{arm}: a DP group failed: {failed[0]}")
                sync.step_done[step].wait(timeout=60)
                after = cluster.statuses()
                moved = sum(after[c].bytes_read - before[c].bytes_read for c in after)
                needed = sum(after[c].bytes_needed - before[c].bytes_needed for c in after)
                measurement, extra = measure(records, config, moved)
                expected_tokens = sum(workload.lengths)
                expected_images = config.num_prompts * config.images_per_prompt
                if (extra["real_tokens_delivered"], extra["images_delivered"]) != (expected_tokens, expected_images):
                    raise RuntimeError(f"{arm}: delivered {extra['real_tokens_delivered']} tokens and "
                                       f"{extra['images_delivered']} images, expected {expected_tokens} and "
                                       f"{expected_images}")
                last_dispatch = max([t for r in records for t in r["assigned_at"]]
                                    + [r["encoder"]["assigned_at"] for r in records])
                blocked = dict(zip(sorted(r["dp"] for r in records),
                                   extra["blocked_after_first_microbatch_s_per_dp_group"], strict=True))
                extra.update({"bytes_needed_by_plan": needed, "write_s": write_s,
                              "report_to_dispatch_s": last_dispatch - reported,
                              # the report to the group's ranks all holding micro-batch 0, plus its later waits
                              "exposed_from_report_s": max(r["ready"][0] - reported + blocked[r["dp"]]
                                                           for r in records),
                              "read_calls": sum(after[c].read_calls - before[c].read_calls for c in after)})
                kind = "warm-up" if step < warmup_steps else "measured"
                logger.info("[%s] step %d (%s): %.2f s, exposed transfer %.4f s, first micro-batch %.4f s, "
                            "%.1f MB moved", arm, step, kind, measurement.step_s, measurement.exposed_transfer_s,
                            max(extra["first_microbatch_ready_s_per_dp_group"]), moved / 1e6)
                if step >= warmup_steps:
                    measured.append(measurement)
                    extras.append(extra)
    finally:
        store.close()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    report = arm_report(arm=arm, workload=workload, steps=measured, details={
        "mode": mode.value,
        "readers": (f"{config.dp * config.cp} backbone sidecars (one per DP x CP, shared by its {config.tp} TP "
                    f"ranks) + {config.dp} encoder sidecars, one outstanding batched read each"),
        "ranks": "one process per DP group holding its CP x TP ranks' clients and the encoder rank it hosts",
        "first_microbatch_ready_s_per_step": [max(e["first_microbatch_ready_s_per_dp_group"]) for e in extras],
        "exposed_including_loop_overhead_s_per_step": float(np.mean(
            [e["exposed_including_loop_overhead_s"] for e in extras])),
    })
    for step_report, extra in zip(report["steps"], extras, strict=True):
        step_report.update(extra)
    return report


def run_knittrans_arms(config: WorkloadConfig, *, modes: Sequence[DeliveryMode], warmup_steps: int, steps: int,
                       store: str = "file", slots: int = 2, prefetch: int = 1,
                       encoder_microbatch_images: int = 16) -> dict[str, Any]:
    workload = build_workload(config)
    directory = Path(tempfile.mkdtemp(prefix="kt-transfer-"))
    started = time.perf_counter()
    cluster = start_cluster(config, store=store, directory=directory, slots=slots,
                            encoder_microbatch_images=encoder_microbatch_images)
    setup_s = time.perf_counter() - started
    logger.info("KnitTrans cluster ready in %.1f s (%d sidecars, store %s)", setup_s, len(cluster.sidecars),
                cluster.store_url)
    arms = []
    left: list[str] = []
    try:
        first_step = 0
        for mode in modes:
            arms.append(run_arm(cluster, workload, mode, first_step=first_step, warmup_steps=warmup_steps,
                                steps=steps, prefetch=prefetch))
            first_step += warmup_steps + steps
    finally:
        left = cluster.stop()
    return {
        "store": store,
        "store_url": cluster.store_url,
        "ring_slots": slots,
        "trainer_prefetch": prefetch,
        "encoder_microbatch_images": encoder_microbatch_images,
        "setup_s": setup_s,
        "sidecars": len(cluster.sidecars),
        "shm_segments_left_after_shutdown": len(left),
        "logs": str(directory),
        "arms": arms,
    }


def expected_amplification_one(arm: dict[str, Any]) -> bool:
    return bool(np.isclose(arm["amplification"], 1.0, rtol=0, atol=5e-3))
