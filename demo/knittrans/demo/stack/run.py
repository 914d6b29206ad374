"""Start the whole KnitTrans stack as local processes, run the RL job, collect the results, stop everything.

Processes: the admission service; one reorg sidecar per (role, dp, cp); dp × cp trainer ranks; rollout
workers; optionally a real Redis (journaled state) and a real Mooncake master and store. Every process is
stopped on exit, on Ctrl-C and when any of them fails (that one is named, with the last lines of its log).

Given ``nodes`` (see :mod:`knittrans.demo.stack.cluster`), the same stack runs on three network hosts: node0 the
admission service, Redis and the Mooncake master (and this driver); node1 the rollout workers and a Mooncake
segment; node2 a Mooncake segment, the sidecars and the trainer ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import grpc

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings, open_channel
from knittrans.demo.reference_rank import reference_records_path
from knittrans.demo.stack.namespaces import Node
from knittrans.demo.stack.report import (
    DemoReport,
    build_rows,
    check_reference,
    check_run,
    format_table,
    load_manifests,
    plot,
    read_jsonl,
)
from knittrans.demo.stack.roles import reference_consumers, with_reference_role
from knittrans.demo.stack.settings import DEFAULT_OUT, SOURCES, DemoSettings, StoreKind
from knittrans.job import FileLease, JobLeaseHeld
from knittrans.launch.mooncake import SHORT_LEASE_TTL_MS
from knittrans.launch.ports import free_port
from knittrans.reorg.settings import default_socket_path
from knittrans.stack.local import LocalStack
from knittrans.stack.progress import Progress
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import admission_service_pb2_grpc
from knittrans.wire import consumer_to_proto

ENCODER = "vision"
ENCODER_COST_PER_MICROBATCH = 64
# A read lease that outlasts a cross-node get (knittrans.launch.mooncake), so released units leave memory soon
# after their last read on one machine and on several alike.
DEMO_LEASE_TTL_MS = SHORT_LEASE_TTL_MS
CLUSTER_SEGMENT_SIZE = 256 << 20  # each node's Mooncake segment in the multi-node layout
STORE_EMPTY_TIMEOUT_SECONDS = 60.0
OUT_LEASE = ".demo.lease"  # in the output directory: the run that writes there


class DemoStack(LocalStack):
    """The processes of one demo run, started in dependency order: :class:`LocalStack`'s services, then the
    trainer ranks and the rollout workers."""

    def __init__(self, settings: DemoSettings, out: Path, progress: Progress, nodes: Sequence[Node] = (), *,
                 job: str) -> None:
        # Its processes die with this driver, even when it is killed (as ``knittrans up``'s do).
        super().__init__(job=job, work_dir=out, stop_with_parent=True)
        self.settings = settings
        self.nodes = tuple(nodes)  # empty: everything on this machine, on loopback
        self.out = out
        self.progress = progress
        self.mooncake_master = None  # the master, where the driver can count its keys (multi-node layout)
        self.started_at = time.time()
        self.admissions: dict[int, dict] = {}
        self._admission_stream = None
        self._admission_watcher: threading.Thread | None = None

    # -- placement: which node runs what (nothing to do on one machine) ---------------------------------

    def _node(self, index: int) -> Node | None:
        return self.nodes[index] if self.nodes else None

    def _on(self, index: int, argv: Sequence[str]) -> list[str]:
        node = self._node(index)
        return node.command(argv) if node is not None else list(argv)

    def _host(self, index: int) -> str:
        node = self._node(index)
        return node.address if node is not None else "127.0.0.1"

    def _store_url_on(self, index: int) -> str:
        """The store URL a process of node ``index`` uses: Mooncake clients name their own node's address."""
        node = self._node(index)
        return self.store_url if node is None else f"{self.store_url}&local_hostname={node.address}"

    def _sidecar_env(self) -> dict[str, str] | None:
        # The driver scrapes the sidecars' bytes from its own node.
        return {**os.environ, "KNITTRANS_SERVER__METRICS__HOST": self._host(2)} if self.nodes else None

    # -- starting ----------------------------------------------------------------------------------------

    def start_backends(self) -> str:
        settings = self.settings
        state = self.start_state(settings.state)
        if settings.store is StoreKind.MOONCAKE and self.nodes:
            self.start_cluster_store()
        else:
            self.start_store(settings.store, lease_ttl_ms=DEMO_LEASE_TTL_MS)
        return state

    def start_cluster_store(self) -> None:
        """The master on node0 (this driver's node), a segment on node1 and on node2, each advertised by its node's
        address: the master places units in either segment, so every node reads from both."""
        from knittrans.launch.mooncake import MooncakeClusterConfig, start_master, start_segment_owner

        config = MooncakeClusterConfig(lease_ttl_ms=DEMO_LEASE_TTL_MS, segment_size=CLUSTER_SEGMENT_SIZE)
        master = start_master(config, bind_host=self._host(0), log_dir=self.out / "logs")
        self.extras.append(master)
        self.mooncake_master = master
        for index in (1, 2):
            owner = start_segment_owner(
                master.address, segment_size=CLUSTER_SEGMENT_SIZE, bind_host=self._host(index),
                log_dir=self.out / "logs", log_name=f"segment-node{index}.log",
                command_prefix=self.nodes[index].enter(),
            )
            self.extras.append(owner)
        self.store_url = f"mooncake://{master.address}?max_unit_size={CLUSTER_SEGMENT_SIZE}"

    def admission_config(self, state: str) -> dict:
        """The admission service's config (:meth:`LocalStack.start_admission` adds the job, store and port)."""
        settings = self.settings
        config = {
            "state": state,
            "engine": {
                "train_batch_size": settings.train_batch_size,
                "num_minibatches": settings.num_minibatches,
                "sources": {source: 1 / len(SOURCES) for source in SOURCES},
                "policy": settings.policy.value,
            },
            "topology": {
                "backbone": {"dp": settings.dp, "cp": settings.cp, "tp": 1,
                             "max_tokens_per_microbatch": settings.max_tokens_per_microbatch},
                "encoders": [{"name": ENCODER, "dp": settings.encoder_dp,
                              "max_cost_per_microbatch": ENCODER_COST_PER_MICROBATCH}],
            },
        }
        if settings.chaos.enabled:
            # Chaos trainer ranks restore checkpoints and get the mini-batches after them again: the units stay
            # until a reported checkpoint covers their step (global rank 0 reports one after every step).
            config["retain_until_checkpoint"] = True
        return with_reference_role(config, settings) if settings.with_reference else config

    def consumers(self) -> list[ConsumerId]:
        settings = self.settings
        backbone = [ConsumerId(role="backbone", dp_rank=d, cp_rank=c) for d in range(settings.dp)
                    for c in range(settings.cp)]
        encoders = [ConsumerId(role=f"encoder:{ENCODER}", dp_rank=d) for d in range(settings.encoder_dp)]
        return backbone + encoders + reference_consumers(settings)  # the backbone's first: global rank order

    def start_trainers(self) -> None:
        settings = self.settings
        run = {
            "admission": self.admission_address,
            "master_port": free_port(),
            "dp": settings.dp,
            "cp": settings.cp,
            "encoder_dp": settings.encoder_dp,
            "steps": settings.num_steps,
            "learning_rate": settings.learning_rate,
            "seed": settings.seed,
            "backbone_sockets": [
                f"unix:{default_socket_path(self.job, backbone)}"
                for backbone in self.consumers()[: settings.world_size]  # global rank = dp_rank · cp + cp_rank
            ],
            "encoder_sockets": [
                f"unix:{default_socket_path(self.job, ConsumerId(role=f'encoder:{ENCODER}', dp_rank=d))}"
                for d in range(settings.encoder_dp)
            ],
            "out": str(self.out),
            "chaos": settings.chaos.enabled,
            "kl_coefficient": settings.kl_coefficient if settings.with_reference else 0.0,
        }
        path = self.out / "run.json"
        path.write_text(json.dumps(run, indent=2))
        for rank in range(settings.world_size):
            self.group.start(f"trainer-rank{rank}", self._on(2, [self.python, "-m", "knittrans.demo.trainer_rank",
                                                                 str(path), str(rank)]), service=False)

    def start_references(self) -> None:
        """One reference rank per reference DP rank, each on its ``role:reference`` sidecar (none without it)."""
        for consumer in reference_consumers(self.settings):
            self.group.start(f"reference-rank{consumer.dp_rank}", self._on(2, [
                self.python, "-m", "knittrans.demo.reference_rank", "--admission", self.admission_address,
                "--sidecar", f"unix:{default_socket_path(self.job, consumer)}", "--store", self._store_url_on(2),
                "--namespace", self.job, "--dp-rank", str(consumer.dp_rank), "--seed", str(self.settings.seed),
                "--steps", str(self.settings.num_steps), "--out", str(self.out)]), service=False)

    def start_rollout(self) -> None:
        settings = self.settings
        for worker in range(settings.rollout_workers):
            self.group.start(f"rollout-{worker}", self._on(1, [
                self.python, "-m", "knittrans.demo.rollout_worker", "--admission", self.admission_address,
                "--store", self._store_url_on(1), "--job", self.job, "--num-samples", str(settings.num_samples),
                "--worker-index", str(worker), "--num-workers", str(settings.rollout_workers),
                "--group-size", str(settings.group_size), "--seed", str(settings.seed),
                "--concurrency", str(settings.rollout_concurrency), "--time-scale", str(settings.time_scale),
                "--train-batch-size", str(settings.train_batch_size),
                "--manifest", str(self.out / f"manifest-{worker}.json"),
                *(["--acked-log", str(self.out / f"acked-{worker}.jsonl")] if settings.chaos.enabled else [])]),
                service=False)

    # -- watching ----------------------------------------------------------------------------------------

    def steps_done(self) -> int:
        return len(read_jsonl(self.out / "steps-rank0.jsonl"))

    def show_progress(self, client: AdmissionClient) -> None:
        status = client.status()
        steps = self.steps_done()
        line = (
            f"step {steps}/{self.settings.num_steps}  train batch {status.train_batch_index} "
            f"mini-batch {status.minibatch_index}/{status.num_minibatches}  pool {status.pool_size}  "
            f"admitted {status.admitted_total}  version {status.policy_version}  waiting: {status.blocking_reason}"
        )
        # A log gets a line per step and per change of what admission waits for, not per pool change.
        key = (steps, status.train_batch_index, status.minibatch_index, status.blocking_reason)
        self.progress.show(f"[{time.time() - self.started_at:6.1f}s] {line}", key=key)

    def watch_admissions(self) -> None:
        """Record every admitted mini-batch as it is admitted (released ones are forgotten by the service)."""
        channel = open_channel(ConnectionSettings(target=self.admission_address))
        stub = admission_service_pb2_grpc.AdmissionServiceStub(channel)
        request = pb.WatchAssignmentsRequest(consumer=consumer_to_proto(ConsumerId(role="backbone", dp_rank=0)),
                                             include_trajectory_ids=True)
        self._admission_stream = stub.WatchAssignments(request)

        def record() -> None:
            try:
                for response in self._admission_stream:
                    a = response.admission
                    self.admissions[response.sequence] = {
                        "train_batch_index": a.train_batch_index, "minibatch_index": a.minibatch_index,
                        "train_version": a.train_version, "admitted_at": a.admitted_at,
                        "trajectory_ids": list(a.trajectory_ids),
                    }
            except grpc.RpcError:
                pass  # cancelled when the stack stops
            finally:
                channel.close()

        self._admission_watcher = threading.Thread(target=record, name="admissions", daemon=True)
        self._admission_watcher.start()

    def sidecar_bytes(self) -> tuple[int, int]:
        read = needed = 0
        for url in self.sidecar_metrics:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            for line in text.splitlines():
                if line.startswith("knittrans_reorg_bytes_read_total"):
                    read += int(float(line.rsplit(" ", 1)[1]))
                elif line.startswith("knittrans_reorg_bytes_needed_total"):
                    needed += int(float(line.rsplit(" ", 1)[1]))
        return read, needed

    def wait_store_empty(self) -> int | None:
        """The master's key count once it reaches 0 (released units are deleted in the background, after their
        read leases), or what is left after a timeout; None where the driver holds no master."""
        if self.mooncake_master is None:
            return None
        deadline = time.monotonic() + STORE_EMPTY_TIMEOUT_SECONDS
        while (count := self.mooncake_master.key_count()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return count

    # -- stopping ----------------------------------------------------------------------------------------

    def stop(self) -> None:
        if self._admission_stream is not None:
            self._admission_stream.cancel()
        super().stop()


def new_job_id() -> str:
    return f"demo-{uuid.uuid4().hex[:8]}"


def claim_out_directory(settings: DemoSettings, job: str) -> FileLease:
    """Hold the output directory for this run: the one given (refused while another run writes there), else
    demo-out, or demo-out-<job> while another run holds demo-out. Then empty it of an earlier run's files."""
    candidates = [settings.out] if settings.out else [DEFAULT_OUT, f"{DEFAULT_OUT}-{job}"]
    for index, candidate in enumerate(candidates):
        # Absolute: every path below is handed to a child process, and some (redis-server) change directory first.
        out = Path(candidate).resolve()
        out.mkdir(parents=True, exist_ok=True)
        try:
            lease = FileLease.claim(out / OUT_LEASE, what=f"the demo output directory {out}")
        except JobLeaseHeld:
            if index + 1 == len(candidates):
                raise
            continue
        for entry in out.iterdir():
            if entry.name == OUT_LEASE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return lease
    raise AssertionError("unreachable")


def run_demo(settings: DemoSettings, nodes: Sequence[Node] = ()) -> DemoReport:
    job = settings.job or new_job_id()
    out_lease = claim_out_directory(settings, job)
    try:
        return _run_holding(settings, nodes, job, out_lease.path.parent)
    finally:
        out_lease.release()


def _run_holding(settings: DemoSettings, nodes: Sequence[Node], job: str, out: Path) -> DemoReport:
    print(f"knittrans demo: job {job}, writing to {out}", file=sys.stderr, flush=True)
    progress = Progress(sys.stderr)
    stack = DemoStack(settings, out, progress, nodes, job=job)
    try:
        state = stack.start_backends()
        progress.show("starting the admission service")
        stack.start_admission(stack.admission_config(state))
        progress.show("starting reorg sidecars")
        stack.start_sidecars(stack.consumers())
        progress.end_line()
        print("Prometheus can scrape:", *stack.metrics_urls, sep="\n  ", file=sys.stderr)
        stack.watch_admissions()
        stack.start_trainers()
        stack.start_references()
        stack.start_rollout()
        deadline = time.monotonic() + settings.timeout_seconds
        with AdmissionClient(stack.admission_address) as client:
            def poll() -> None:
                stack.show_progress(client)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the demo did not finish in {settings.timeout_seconds:.0f}s")

            stack.group.wait_all(lambda p: p.name.startswith(("trainer", "reference", "rollout")), poll=poll)
            stack.show_progress(client)
        progress.end_line()
        admissions = dict(stack.admissions)
        bytes_read, bytes_needed = stack.sidecar_bytes()
        keys_left = stack.wait_store_empty()
    finally:
        stack.stop()
    manifest = load_manifests(out)
    records = [r for rank in range(settings.world_size) for r in read_jsonl(out / f"steps-rank{rank}.jsonl")]
    pieces = [p for rank in range(settings.world_size) for p in read_jsonl(out / f"received-rank{rank}.jsonl")]
    rows = build_rows(records, admissions, manifest, stack.started_at)
    quota = settings.train_batch_size // len(SOURCES)
    checks = check_run(records, pieces, admissions, manifest, quotas=dict.fromkeys(SOURCES, quota),
                       num_minibatches=settings.num_minibatches)
    if keys_left is not None:
        checks = replace(checks, details={**checks.details, "store_keys_after_release": keys_left})
    if settings.with_reference:
        attached = [a for d in range(settings.reference_dp) for a in read_jsonl(reference_records_path(out, d))]
        initial = json.loads((out / "initial-policy.json").read_text())["digest"]
        matched, details = check_reference(records, pieces, admissions, attached, initial_policy=initial)
        checks = replace(checks, reference_fields_match=matched, details={**checks.details, **details})
    report = DemoReport(steps=tuple(rows), checks=checks, bytes_read=bytes_read, bytes_needed=bytes_needed,
                        metrics_urls=tuple(stack.metrics_urls), job=stack.job, out=str(out),
                        settings={k: str(v) for k, v in asdict(settings).items()})
    (out / "report.json").write_text(report.to_json())
    plot(rows, out / "report.png")
    print(format_table(rows))
    return report
