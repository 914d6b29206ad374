"""Run the demo under chaos (``knittrans demo --chaos SEED``) and judge it from the outside.

The stack is the demo's (:class:`~knittrans.demo.stack.run.DemoStack`) on Redis state and a Mooncake store, with
the admission service on a fixed port so that a restarted one keeps its address. Once every process is up, the
injector plays the seed's schedule while the supervisor restarts what dies; when every trainer rank and rollout
worker has finished, everything is stopped and :func:`~knittrans.demo.chaos.oracle.judge` reads the clients' logs.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc

from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.demo.chaos.acks import read_acked
from knittrans.demo.chaos.injector import Injector, Supervisor
from knittrans.demo.chaos.oracle import ChaosVerdict, Leftovers, judge, read_events
from knittrans.demo.chaos.schedule import FaultTarget
from knittrans.demo.stack.run import DEMO_LEASE_TTL_MS, DemoStack, claim_out_directory, new_job_id
from knittrans.demo.stack.settings import SOURCES, DemoSettings
from knittrans.launch.ports import free_port
from knittrans.shm import list_segments
from knittrans.stack.progress import Progress
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc
from knittrans.wire import consumer_to_proto

POLL_SECONDS = 0.2


@dataclass(frozen=True, kw_only=True)
class ChaosReport:
    job: str
    out: str
    seed: int
    targets: tuple[str, ...]
    faults: tuple[dict, ...]
    restarts: dict[str, int]
    verdict: ChaosVerdict
    wall_seconds: float

    def summary(self) -> dict:
        injected = [f for f in self.faults if not f["skipped"]]
        return {
            "job": self.job, "out": self.out, "seed": self.seed, "targets": list(self.targets),
            "passed": self.verdict.passed, "faults_injected": len(injected),
            "faults_by_target": dict(Counter(f"{f['target']}:{f['action']}" for f in injected)),
            "restarts": self.restarts, "wall_seconds": round(self.wall_seconds, 1),
            "checks": self.verdict.to_dict(),
        }

    def line(self) -> str:
        verdict = self.verdict
        failed = [name for name in ("trained_exactly_once", "no_partial_step", "quotas_held", "finished",
                                    "nothing_left_behind") if not getattr(verdict, name)]
        summary = self.summary()
        return (f"chaos seed {self.seed}: {'PASSED' if verdict.passed else 'FAILED (' + ', '.join(failed) + ')'}; "
                f"{summary['faults_injected']} faults injected ({', '.join(self.targets)}), "
                f"{verdict.details.get('trained', 0)} trajectories trained in "
                f"{verdict.details.get('applied_steps', 0)} steps, in {self.wall_seconds:.0f}s")


class AdmissionWatcher:
    """Records every admitted mini-batch (sequence -> trajectory ids), reconnecting across service restarts."""

    def __init__(self, address: str) -> None:
        self._address = address
        self.admitted: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="admission-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        consumer = consumer_to_proto(ConsumerId(role="backbone", dp_rank=0))
        while not self._stop.is_set():
            channel = open_channel(ConnectionSettings(target=self._address))
            try:
                stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
                after = max(self.admitted, default=0)
                # Assignments carry the mini-batch's trajectory ids only when asked to.
                self._call = stub.WatchAssignments(pb.WatchAssignmentsRequest(consumer=consumer, after_sequence=after,
                                                                              include_trajectory_ids=True))
                for response in self._call:
                    self.admitted[response.sequence] = list(response.admission.trajectory_ids)
            except grpc.RpcError:
                self._stop.wait(POLL_SECONDS)  # the service is restarting
            finally:
                channel.close()


def _ancestors() -> set[int]:
    """This process and those that started it (a shell or `timeout` whose command line names the output)."""
    found = set()
    pid = os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes (other than this one and its ancestors) that mention ``marker``."""
    found = []
    mine = _ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command:
            found.append(command)
    return found


def run_chaos_demo(settings: DemoSettings) -> ChaosReport:
    job = settings.job or new_job_id()
    out_lease = claim_out_directory(settings, job)
    try:
        return _run_holding(settings, job, out_lease.path.parent)
    finally:
        out_lease.release()


def _start_backends(stack: DemoStack) -> tuple[str, object, object]:
    """Redis and a Mooncake master and store, each held apart so that the supervisor can restart it."""
    from knittrans.launch.mooncake import MooncakeClusterConfig, start_master, start_segment_owner
    from knittrans.launch.redis import start_redis

    redis = start_redis(stack.out / "redis")
    stack.extras.append(redis)
    stack.state_url = redis.url  # the admission service journals here, so that it survives its kills
    config = MooncakeClusterConfig(lease_ttl_ms=DEMO_LEASE_TTL_MS)
    master = start_master(config, log_dir=stack.out / "logs")
    stack.extras.append(master)
    stack.mooncake_master = master
    owner = start_segment_owner(master.address, segment_size=config.segment_size, log_dir=stack.out / "logs",
                                start_timeout_s=config.start_timeout_s)
    stack.extras.append(owner)
    stack.store_url = owner.store_url
    return redis.url, redis, owner


def _run_holding(settings: DemoSettings, job: str, out: Path) -> ChaosReport:
    chaos = settings.chaos
    assert chaos.seed is not None
    print(f"knittrans demo: job {job}, writing to {out}; chaos seed {chaos.seed} on "
          f"{', '.join(t.value for t in chaos.targets)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    progress = Progress(sys.stderr)
    stack = DemoStack(settings, out, progress, job=job)
    stack.admission_port = free_port()
    injector: Injector | None = None
    watcher: AdmissionWatcher | None = None
    supervisor: Supervisor | None = None
    finished = False
    store_units = 0
    try:
        state, redis, owner = _start_backends(stack)
        stack.start_admission(stack.admission_config(state))
        stack.start_sidecars(stack.consumers())
        supervisor = Supervisor(stack.group, out / "run.json", redis=redis, store_owner=owner)
        stack.group.supervisor = supervisor.handle
        watcher = AdmissionWatcher(stack.admission_address)
        watcher.start()
        stack.start_trainers()
        stack.start_rollout()

        def instances(target: FaultTarget) -> list[tuple[str, int]]:
            if target is FaultTarget.REDIS:
                processes = [("redis", redis.process)]
            elif target is FaultTarget.MOONCAKE_STORE:
                processes = [("mooncake-store", owner.process)]
            else:
                prefix = {FaultTarget.ADMISSION: "admission", FaultTarget.SIDECAR: "reorg-",
                          FaultTarget.TRAINER: "trainer-rank", FaultTarget.ROLLOUT: "rollout-"}[target]
                processes = [(m.name, m.process) for m in stack.group.processes if m.name.startswith(prefix)]
            return [(name, p.pid) for name, p in processes if p.poll() is None]

        injector = Injector(chaos, instances, out / "chaos-faults.jsonl")
        injector.start()
        workers = [m for m in stack.group.processes if m.name.startswith(("trainer", "rollout"))]
        deadline = time.monotonic() + settings.timeout_seconds
        while time.monotonic() < deadline:
            stack.group.check()
            supervisor.poll()
            if all(m.process.poll() == 0 for m in workers):
                finished = True
                break
            progress.show(f"[{time.monotonic() - started:6.1f}s] step {stack.steps_done()}/{settings.num_steps}"
                          f"  faults {len(injector.injected())}  restarts {sum(supervisor.restarts.values())}",
                          key=(stack.steps_done(), len(injector.injected())))
            time.sleep(POLL_SECONDS)
        injector.stop()
        progress.end_line()
        # Released units leave after their read leases; a job that did not finish has units it will never release.
        store_units = (stack.wait_store_empty() if finished else stack.mooncake_master.key_count()) or 0
    finally:
        if injector is not None:
            injector.stop()
        if watcher is not None:
            watcher.stop()
        stack.stop()
    leftovers = Leftovers(
        processes=tuple(processes_mentioning(str(out)))
        + tuple(type(e).__name__ for e in stack.extras if e.process.poll() is None),
        segments=tuple(list_segments(f"knittrans-{job}")), store_units=store_units,
    )
    acked = read_acked(sorted(out.glob("acked-*.jsonl")))
    histories = {rank: read_events((out / f"applied-rank{rank}.jsonl").read_text().splitlines())
                 for rank in range(settings.world_size) if (out / f"applied-rank{rank}.jsonl").exists()}
    verdict = judge(acked=acked, histories=histories, admitted=dict(watcher.admitted) if watcher else {},
                    quotas=dict.fromkeys(SOURCES, settings.train_batch_size // len(SOURCES)),
                    num_steps=settings.num_steps, job_finished=finished, leftovers=leftovers)
    report = ChaosReport(job=job, out=str(out), seed=chaos.seed, targets=tuple(t.value for t in chaos.targets),
                         faults=tuple(injector.faults if injector else ()),
                         restarts=dict(supervisor.restarts) if supervisor else {}, verdict=verdict,
                         wall_seconds=time.monotonic() - started)
    (out / "chaos-report.json").write_text(json.dumps(report.summary(), indent=2))
    return report
