"""A demo rollout worker: plays the synthetic workload at rollout speed and writes through ``RolloutClient``.

Each worker takes every ``num_workers``-th sample of the job's sample sequence. It keeps ``concurrency``
samples "generating" at once, like an inference engine with many requests in flight: every trajectory of a
started sample finishes after its source's (jittered, ``time_scale``-scaled) duration, and is submitted at that
moment. ``submit()`` writes the units to the store and hands the metadata to a :class:`BatchingReporter`, which
reports to the admission service in batches.

Policy versions: a sample is generated under the policy version the admission service reports when the
sample starts (``rollout_step`` is that version too). With ``max_versions_ahead`` the worker does not start a
sample meant for train batch k (by its index) before the policy version reaches ``initial_version + k −
max_versions_ahead``, which bounds staleness as an asynchronous RL loop with bounded off-policyness does.

Run one from the command line with ``python -m knittrans.demo.rollout_worker --help``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.client.reporter import BatchingReporter
from knittrans.demo.workload import (
    LABEL_ALIGNED_FIELDS,
    GeneratedSample,
    GeneratedTrajectory,
    WorkloadSpec,
    generate_sample,
    source_sequence,
)
from knittrans.errors import Conflict, InvalidArgument
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import TrajectoryMeta, VersionSegment

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RolloutWorkerSettings:
    admission: ConnectionSettings | str
    store: str  # a unit-store URL, e.g. file:///dev/shm/knittrans-demo/units
    num_samples: int  # samples of the whole job, over all workers
    worker_index: int = 0
    num_workers: int = 1
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    namespace: str = ""  # the store keys' prefix; empty: the job's (keys are then the job's alone)
    job: str = "demo"
    concurrency: int = 4  # samples generating at once in this worker
    time_scale: float = 1.0  # multiplies every rollout duration
    train_batch_size: int = 0  # trajectories per train batch; > 0 enables the version throttle
    max_versions_ahead: int = 1
    initial_version: int = 0
    poll_seconds: float = 0.1  # how often a throttled worker asks for the policy version
    image_cost: float = 0.0  # encoder cost per image; 0: its rows (placeholder tokens)

    def __post_init__(self) -> None:
        if self.num_samples < 0:
            raise InvalidArgument("must not be negative", field="num_samples")
        if self.num_workers < 1 or not 0 <= self.worker_index < self.num_workers:
            raise InvalidArgument(
                f"needs 0 <= worker_index < num_workers, got {self.worker_index} of {self.num_workers}",
                field="worker_index",
            )
        if self.concurrency < 1:
            raise InvalidArgument("must be positive", field="concurrency")
        if not self.time_scale >= 0:
            raise InvalidArgument("must not be negative", field="time_scale")
        if self.train_batch_size < 0 or self.max_versions_ahead < 0:
            raise InvalidArgument("must not be negative", field="train_batch_size")
        if self.poll_seconds <= 0:
            raise InvalidArgument("must be positive", field="poll_seconds")

    @property
    def sample_indices(self) -> range:
        return range(self.worker_index, self.num_samples, self.num_workers)

    def train_batch_of(self, sample_index: int) -> int:
        """The train batch that sample ``sample_index`` is generated for (by position in the sequence)."""
        return sample_index * self.workload.group_size // self.train_batch_size if self.train_batch_size else 0


@dataclass
class RolloutWorkerReport:
    worker_index: int
    trajectories: list[TrajectoryMeta] = field(default_factory=list)
    samples: int = 0
    bytes_written: int = 0  # unique units (a sample's image once)
    throttled_seconds: float = 0.0
    wall_seconds: float = 0.0
    stopped: bool = False

    def source_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for meta in self.trajectories:
            counts[meta.source] = counts.get(meta.source, 0) + 1
        return counts

    def manifest(self) -> dict:
        """What was written, for checking what was trained: per trajectory its units' keys and hashes."""
        return {
            "worker_index": self.worker_index,
            "samples": self.samples,
            "bytes_written": self.bytes_written,
            "throttled_seconds": round(self.throttled_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "stopped": self.stopped,
            "trajectories": {
                meta.trajectory_id: {
                    "sample_id": meta.sample_id,
                    "source": meta.source,
                    "version": meta.oldest_version,
                    "num_tokens": meta.num_tokens,
                    "num_loss_tokens": meta.num_loss_tokens,
                    "units": {
                        u.key: {"field": u.field_name, "hash": u.header.content_hash, "bytes": u.header.byte_length}
                        for u in meta.units
                    },
                    "multimodal": {
                        m.key: {"hash": m.header.content_hash, "bytes": m.header.byte_length}
                        for m in meta.multimodal
                        if m.header is not None
                    },
                }
                for meta in self.trajectories
            },
        }


def submit_trajectory(
    rollout: RolloutClient,
    sample: GeneratedSample,
    trajectory: GeneratedTrajectory,
    *,
    version: int,
    workload: WorkloadSpec,
    image_cost: float = 0.0,
    finished_at: float | None = None,
) -> TrajectoryMeta:
    """Store one generated trajectory (its image shared by the sample) and report it if the client reports."""
    return rollout.submit(
        trajectory.fields,
        trajectory_id=trajectory.trajectory_id,
        sample_id=sample.sample_id,
        source=sample.source,
        rollout_step=version,
        segments=(VersionSegment(version=version, num_tokens=trajectory.generated_tokens),),
        multimodal=(
            MultimodalInput(
                data=sample.image,
                encoder=workload.encoder,
                cost=image_cost or float(workload.rows_per_image),
                placeholder=sample.placeholder,
            ),
        ),
        scalars={"reward": trajectory.reward, "advantage": trajectory.advantage},
        finished_at=finished_at,
        # The workload's mask and log-probs are label-aligned (see knittrans.demo.workload); say so, since
        # RolloutClient takes a loss mask as token-aligned (verl's convention) unless told otherwise.
        field_alignment=LABEL_ALIGNED_FIELDS,
    )


def _written_bytes(meta: TrajectoryMeta, seen_multimodal: set[str]) -> int:
    total = sum(u.header.byte_length for u in meta.units)
    for ref in meta.multimodal:
        if ref.key not in seen_multimodal and ref.header is not None:
            seen_multimodal.add(ref.key)
            total += ref.header.byte_length
    return total


class _VersionWatch:
    """The admission service's policy version, asked for at most every ``poll_seconds``."""

    def __init__(self, client: AdmissionClient, poll_seconds: float, initial: int) -> None:
        self._client = client
        self._poll = poll_seconds
        self._version = initial
        self._asked = -float("inf")

    def current(self, *, fresh: bool = False) -> int:
        now = time.monotonic()
        if fresh or now - self._asked >= self._poll:
            self._version = self._client.status().policy_version
            self._asked = now
        return self._version


def play_samples(
    settings: RolloutWorkerSettings,
    rollout: RolloutClient,
    version_of: Callable[[bool], int],
    *,
    stop: threading.Event | None = None,
    on_submit: Callable[[TrajectoryMeta], None] | None = None,
    already_acked: frozenset[str] = frozenset(),
) -> RolloutWorkerReport:
    """The worker's loop over its samples (see the module docstring); ``version_of(fresh)`` returns the policy
    version (``fresh``: ask now). Returns when every trajectory is submitted, or as soon as ``stop`` is set.
    Trajectories in ``already_acked`` (a restarted worker's, acknowledged before it died) are not submitted again."""
    stop = stop or threading.Event()
    report = RolloutWorkerReport(worker_index=settings.worker_index)
    sources = source_sequence(settings.workload, settings.num_samples)
    pending = list(settings.sample_indices)[::-1]
    in_flight: list[tuple[float, int, int]] = []  # (finish time, sample index, member)
    active: dict[int, tuple[GeneratedSample, int, int]] = {}  # sample index -> (sample, version, left)
    seen_multimodal: set[str] = set()
    started = time.monotonic()

    def may_start(index: int) -> bool:
        if not settings.train_batch_size:
            return True
        needed = settings.initial_version + settings.train_batch_of(index) - settings.max_versions_ahead
        return needed <= settings.initial_version or version_of(False) >= needed

    while (pending or in_flight) and not stop.is_set():
        throttled = False
        while pending and len(active) < settings.concurrency:
            index = pending[-1]
            if not may_start(index):
                throttled = True
                break
            pending.pop()
            version = version_of(True)
            sample = generate_sample(settings.workload, index, sources[index])
            now = time.monotonic()
            active[index] = (sample, version, len(sample.trajectories))
            for trajectory in sample.trajectories:
                finish = now + trajectory.duration_seconds * settings.time_scale
                heapq.heappush(in_flight, (finish, index, trajectory.member))
        now = time.monotonic()
        if in_flight and in_flight[0][0] <= now:
            _, index, member = heapq.heappop(in_flight)
            sample, version, left = active[index]
            if sample.trajectories[member].trajectory_id in already_acked:
                if left == 1:
                    del active[index]
                    report.samples += 1
                else:
                    active[index] = (sample, version, left - 1)
                continue
            try:
                meta: TrajectoryMeta | None = submit_trajectory(
                    rollout,
                    sample,
                    sample.trajectories[member],
                    version=version,
                    workload=settings.workload,
                    image_cost=settings.image_cost,
                )
            except Conflict as conflict:  # (maybe an earlier submit's) id acknowledged before, by a predecessor
                logger.warning("keeping what the service acknowledged before: %s", conflict)
                meta = None
            if left == 1:
                del active[index]
                report.samples += 1
            else:
                active[index] = (sample, version, left - 1)
            if meta is not None:
                report.trajectories.append(meta)
                report.bytes_written += _written_bytes(meta, seen_multimodal)
                if on_submit is not None:
                    on_submit(meta)
            continue
        wait = in_flight[0][0] - now if in_flight else settings.poll_seconds
        if throttled:
            wait = min(wait, settings.poll_seconds)
            if not in_flight:  # idle only because training has not caught up
                report.throttled_seconds += wait
        stop.wait(max(wait, 0.0))
    report.stopped = stop.is_set()
    report.wall_seconds = time.monotonic() - started
    return report


def run_rollout_worker(
    settings: RolloutWorkerSettings,
    *,
    stop: threading.Event | None = None,
    on_submit: Callable[[TrajectoryMeta], None] | None = None,
    acked_log: Path | None = None,
) -> RolloutWorkerReport:
    """Play this worker's samples against a live admission service and unit store; every report is
    acknowledged before it returns (unless stopped). With ``acked_log`` (the chaos run), every acknowledged
    trajectory is appended there, and those it already holds (a restarted worker's) are not submitted again."""
    from knittrans.demo.chaos.acks import AckRecordingClient, read_acked

    already_acked = frozenset(read_acked([acked_log])) if acked_log is not None else frozenset()
    store = open_store(settings.store, job=settings.job)
    try:
        with AdmissionClient(settings.admission) as client:
            recording = AckRecordingClient(client, acked_log) if acked_log is not None else None
            reporter = BatchingReporter(recording if recording is not None else client)  # type: ignore[arg-type]
            try:
                rollout = RolloutClient(store, namespace=settings.namespace or settings.job, reporter=reporter)
                watch = _VersionWatch(client, settings.poll_seconds, settings.initial_version)
                report = play_samples(
                    settings, rollout, lambda fresh: watch.current(fresh=fresh), stop=stop, on_submit=on_submit,
                    already_acked=already_acked,
                )
            finally:
                reporter.close()
                if recording is not None:
                    recording.close()
    finally:
        store.close()
    logger.info(
        "rollout worker %d submitted %d trajectories of %d samples (%d bytes) in %.1fs",
        settings.worker_index,
        len(report.trajectories),
        report.samples,
        report.bytes_written,
        report.wall_seconds,
    )
    return report


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m knittrans.demo.rollout_worker", description=__doc__.split("\n")[0])
    parser.add_argument("--admission", required=True, help="admission service address, host:port")
    parser.add_argument("--store", required=True, help="unit store URL")
    parser.add_argument("--num-samples", type=int, required=True)
    parser.add_argument("--worker-index", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--namespace", default="", help="store key prefix (default: the job)")
    parser.add_argument("--job", default="demo")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rows-per-image", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--id-prefix", default="demo")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--train-batch-size", type=int, default=0, help="> 0: hold samples back for training")
    parser.add_argument("--max-versions-ahead", type=int, default=1)
    parser.add_argument("--poll-seconds", type=float, default=0.1)
    parser.add_argument("--token", default="", help="bearer token of the admission service")
    parser.add_argument("--manifest", type=Path, help="write what was written here, as JSON")
    parser.add_argument("--acked-log", type=Path,
                        help="append acknowledged trajectories here, and skip those it already holds (chaos run)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rollout-{args.worker_index} %(message)s")
    settings = RolloutWorkerSettings(
        admission=ConnectionSettings(target=args.admission, token=args.token),
        store=args.store,
        num_samples=args.num_samples,
        worker_index=args.worker_index,
        num_workers=args.num_workers,
        workload=WorkloadSpec(
            group_size=args.group_size, rows_per_image=args.rows_per_image, seed=args.seed, id_prefix=args.id_prefix
        ),
        namespace=args.namespace,
        job=args.job,
        concurrency=args.concurrency,
        time_scale=args.time_scale,
        train_batch_size=args.train_batch_size,
        max_versions_ahead=args.max_versions_ahead,
        poll_seconds=args.poll_seconds,
    )
    report = run_rollout_worker(settings, acked_log=args.acked_log)
    if args.manifest is not None:
        args.manifest.write_text(json.dumps(report.manifest()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
