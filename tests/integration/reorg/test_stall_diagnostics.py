"""What a stalled job tells (docs/failures.md, "A step that never ends"), through real processes:

- the admission service's gauge of the oldest unfinished optimizer step, and its one warning naming the consumer
  that owes it;
- an admission service SIGSTOPped past every client deadline while a rank is partway through a mini-batch: after
  SIGCONT nothing is lost or repeated, and every mini-batch is released;
- ``kill -USR1`` on the admission service and on a sidecar writes every thread's stack to the process's log, and
  both go on serving;
- a trainer rank whose sidecar is SIGSTOPped partway through a mini-batch, past the deadline of the rank's release
  of the micro-batch it just used, gets the whole mini-batch once the sidecar runs again (the release is asked
  again; dropped, it left the sidecar's one slot occupied and the rank waiting forever, with nothing logged), and
  logs one warning naming the mini-batch and the sidecar once it has waited ``stall_warning_seconds``; waiting
  between mini-batches (rollout's time) or computing that long warns of nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest

from knittrans.client.admission import AdmissionClient, ProgressStage
from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2, admission_service_pb2_grpc, reorg_service_pb2, reorg_service_pb2_grpc
from tests.integration.reorg.processes import Process, start_admission, start_sidecar
from tests.integration.reorg.test_sidecar_restart import MINIBATCHES, PER_MINIBATCH, write_trajectories

TOPOLOGY = {"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 64}}


def _dumped(process: Process, before: int, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = process.log.read_text()[before:]
        # faulthandler lists the main thread ("Current thread 0x...") last.
        if "Current thread" in text and "File " in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{process.name} wrote no stacks:\n{process.tail()}")


def test_usr1_dumps_every_threads_stack_and_the_services_go_on(tmp_path: Path) -> None:
    job = f"sd{uuid.uuid4().hex[:8]}"
    store = f"file://{tmp_path / 'units'}"
    admission = start_admission(tmp_path, job=job, store=store, topology=TOPOLOGY, train_batch_size=2,
                                num_minibatches=1)
    processes = [admission]
    try:
        sidecar = start_sidecar(tmp_path, job=job, store=store, admission=admission.ready["address"], dp_rank=0,
                                cp_rank=0)
        processes.append(sidecar)
        for process in processes:
            before = process.log.stat().st_size
            process.signal(signal.SIGUSR1)
            stacks = _dumped(process, before)
            assert stacks.count("hread 0x") >= 2, stacks  # every thread ("Thread 0x..."), the main one last
            assert process.alive(), process.tail()
        with grpc.insecure_channel(admission.ready["address"]) as channel:
            status = admission_service_pb2_grpc.AdmissionServiceStub(channel).GetStatus(
                admission_service_pb2.GetStatusRequest(), timeout=10)
        assert status.num_minibatches == 1
        with grpc.insecure_channel(sidecar.ready["address"]) as channel:
            reorg_service_pb2_grpc.ReorgServiceStub(channel).GetReorgStatus(
                reorg_service_pb2.GetReorgStatusRequest(), timeout=10)
    finally:
        for process in reversed(processes):
            assert process.stop() == 0, process.tail()


def test_a_sidecar_stalled_mid_minibatch_delivers_all_of_it_after_and_the_rank_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    job = f"sw{uuid.uuid4().hex[:8]}"
    store = f"file://{tmp_path / 'units'}"
    # write_trajectories' 12 trajectories, one a micro-batch (see test_sidecar_restart): one mini-batch of 12
    # micro-batches, more than the sidecar's one slot and the rank's one staged micro-batch hold ahead.
    everything = PER_MINIBATCH * MINIBATCHES
    admission = start_admission(tmp_path, job=job, store=store, train_batch_size=everything, num_minibatches=1,
                                topology={"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 64}})
    address = admission.ready["address"]
    processes = [admission]
    written: dict[str, object] = {}
    try:
        sidecar = start_sidecar(tmp_path, job=job, store=store, admission=address, dp_rank=0, cp_rank=0, slots=1)
        processes.append(sidecar)
        settings = TrainerSettings(sidecar=sidecar.ready["address"], admission=ConnectionSettings(target=address),
                                   prefetch=1, poll_seconds=1.0, sidecar_timeout_seconds=60.0,
                                   stall_warning_seconds=2.0, wait_timeout_seconds=30.0)
        # Rollout takes 3 s: the rank waits that long for micro-batch 0, between mini-batches, and must not warn.
        rollout = threading.Timer(3.0, lambda: written.update(write_trajectories(store, job, address)))
        with caplog.at_level(logging.WARNING, logger="knittrans.trainer"), TrainerClient(settings) as trainer:
            rollout.start()
            taken: list[str] = []
            for micro in next(trainer.mini_batches()):
                taken.extend(micro.trajectory_ids)
                if len(taken) == 1:
                    # Stopped before the rank lets go of micro-batch 0: its release meets a stopped sidecar and
                    # times out (poll_seconds 1 s) until the sidecar runs again, 6.5 s later; the rank waits about
                    # 4 s of it, twice the warning's 2 s, so that no other wait under load comes near it.
                    sidecar.signal(signal.SIGSTOP)
                    time.sleep(2.5)  # computing for longer than the warning's 2 s: not a stall either
                    threading.Timer(4.0, sidecar.signal, (signal.SIGCONT,)).start()
        rollout.join()
        stalls = [r.getMessage() for r in caplog.records if "micro-batch of mini-batch" in r.getMessage()]
    finally:
        for process in reversed(processes):
            process.signal(signal.SIGCONT)
            process.stop()
    assert len(stalls) == 1, stalls
    assert "mini-batch 1 " in stalls[0] and sidecar.ready["address"] in stalls[0], stalls
    assert sorted(taken) == sorted(written)  # the whole mini-batch, each trajectory once, after the stall


def _scrape(url: str, name: str) -> float:
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported at {url}")


def test_the_admission_service_names_the_consumers_that_never_finished_a_step(tmp_path: Path) -> None:
    """Two backbone ranks; one reports its optimizer step on mini-batch 1 and the other never does: the gauge
    grows, and the service's log names the one that owes it, once; once it steps, the gauge goes back to 0."""
    job = f"su{uuid.uuid4().hex[:8]}"
    store = f"file://{tmp_path / 'units'}"
    admission = start_admission(
        tmp_path, job=job, store=store, train_batch_size=PER_MINIBATCH, num_minibatches=1,
        topology={"backbone": {"dp": 2, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 64}},
        settings={"unfinished_step_warning_seconds": 1.0,
                  "server": {"host": "127.0.0.1", "port": 0, "metrics": {"port": 0}}})
    try:
        address, metrics = admission.ready["address"], admission.ready["metrics_url"]
        write_trajectories(store, job, address)
        gauge = "knittrans_admission_unfinished_step_seconds"
        assert _scrape(metrics, gauge) == 0.0
        stepped, owing = ConsumerId(role="backbone", dp_rank=0), ConsumerId(role="backbone", dp_rank=1)
        with AdmissionClient(address) as client:
            client.report_progress(stepped, 1, ProgressStage.OPTIMIZER_STEP)
            deadline = time.monotonic() + 30
            while "have not reported its optimizer step" not in admission.log.read_text():
                assert time.monotonic() < deadline, admission.tail()
                time.sleep(0.2)
            time.sleep(2.5)  # more ticks of the check: still one warning
            assert _scrape(metrics, gauge) >= 1.0
            client.report_progress(owing, 1, ProgressStage.OPTIMIZER_STEP)
            while _scrape(metrics, gauge) != 0.0:
                assert time.monotonic() < deadline + 30, admission.tail()
                time.sleep(0.2)
        [warning] = [line for line in admission.log.read_text().splitlines() if "optimizer step" in line]
        assert "mini-batch 1 (train batch 0, mini-batch 0): 1 consumers" in warning, warning
        assert str(owing) in warning and str(stepped) not in warning, warning
    finally:
        assert admission.stop() == 0, admission.tail()


def test_an_admission_service_stopped_past_every_deadline_mid_job_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """SIGSTOP on the admission service for 12 s (past the SDK's 10 s call deadline and the sidecar's verdict
    polls) while the rank is partway through mini-batch 2 of 4: the sidecar's verification, verdict wait and
    acknowledgements and the rank's optimizer-step report all meet a stopped service. After SIGCONT the rank gets
    every mini-batch once, in order, whole, and the service releases all four."""
    job = f"sa{uuid.uuid4().hex[:8]}"
    store = f"file://{tmp_path / 'units'}"
    admission = start_admission(tmp_path, job=job, store=store, train_batch_size=PER_MINIBATCH, num_minibatches=1,
                                topology={"backbone": {"dp": 1, "cp": 1, "tp": 1, "max_tokens_per_microbatch": 64}})
    address = admission.ready["address"]
    processes = [admission]
    try:
        sidecar = start_sidecar(tmp_path, job=job, store=store, admission=address, dp_rank=0, cp_rank=0, slots=1)
        processes.append(sidecar)
        written = write_trajectories(store, job, address)
        settings = TrainerSettings(sidecar=sidecar.ready["address"], admission=ConnectionSettings(target=address),
                                   prefetch=1, poll_seconds=1.0, sidecar_timeout_seconds=60.0,
                                   wait_timeout_seconds=60.0)
        steps: list[tuple[int, list[str]]] = []
        with TrainerClient(settings) as trainer:
            minibatches = trainer.mini_batches()
            for _ in range(MINIBATCHES):
                mini = next(minibatches)
                ids: list[str] = []
                for micro in mini:
                    ids.extend(micro.trajectory_ids)
                    if mini.sequence == 2 and len(ids) == 1:
                        admission.signal(signal.SIGSTOP)
                        threading.Timer(12.0, admission.signal, (signal.SIGCONT,)).start()
                steps.append((mini.sequence, ids))
                mini.complete()
        with AdmissionClient(address) as client:
            deadline = time.monotonic() + 30
            while client.status().released_minibatches < MINIBATCHES:
                assert time.monotonic() < deadline, admission.tail()
                time.sleep(0.2)
    finally:
        for process in reversed(processes):
            process.signal(signal.SIGCONT)
            process.stop()
    assert [sequence for sequence, _ in steps] == list(range(1, MINIBATCHES + 1))
    assert all(len(ids) == PER_MINIBATCH for _, ids in steps), steps
    assert sorted(i for _, ids in steps for i in ids) == sorted(written)
