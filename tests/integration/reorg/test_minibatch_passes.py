"""Several passes over each mini-batch (``mini_batches(passes=3)``, PPO's ``ppo_epochs``) through the real
admission service, a real sidecar and two TP ranks sharing it: TP rank 0 iterates synchronously
(:class:`~knittrans.trainer.TrainerClient`), TP rank 1 with ``async for``
(:class:`~knittrans.aio.AsyncTrainerClient`).

The oracles are independent of the client: CRCs of the arrays the rollout submitted, at the positions each rank
holds, for every pass; the sidecar's own read counters (each micro-batch published and read once, not once per
pass); and the admission service's status (a mini-batch is released only once TP rank 0 reported its step,
which it does after the last pass: while rank 0 is held in its last pass, nothing is released or acknowledged).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from knittrans.client.admission import AdmissionClient

from .processes import start_admission, start_sidecar, start_trainer
from .test_async_trainer import MINIBATCHES, TRAIN_BATCH, check_against_submitted, submit_all
from .test_reorg_data_plane import sidecar_status

PASSES = 3


def wait_for(condition, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def progress_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_pass_yields_what_the_rollout_wrote_read_once_and_released_after_the_last(tmp_path: Path) -> None:
    job = f"passes{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    topology = {"backbone": {"dp": 1, "cp": 1, "tp": 2, "max_tokens_per_microbatch": 512}}
    admission = start_admission(tmp_path, job=job, store=store_url, topology=topology,
                                train_batch_size=TRAIN_BATCH, num_minibatches=MINIBATCHES)
    address = admission.ready["address"]
    progress, release = tmp_path / "rank0.progress", tmp_path / "release"
    sidecar, trainers = None, []
    try:
        sidecar = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0)
        socket = sidecar.ready["address"]
        passes = ("--passes", str(PASSES))
        # TP rank 0 reports the steps: it is held at the first micro-batch of its last pass over mini-batch 1.
        sync_rank, sync_output = start_trainer(
            tmp_path, socket=socket, tp_rank=0, global_rank=0, admission=address, minibatches=MINIBATCHES,
            extra=(*passes, "--progress", str(progress), "--hold-at", "0", "--hold-pass", str(PASSES - 1),
                   "--release-file", str(release)))
        async_rank, async_output = start_trainer(tmp_path, socket=socket, tp_rank=1, global_rank=1,
                                                 admission=address, minibatches=MINIBATCHES, use_asyncio=True,
                                                 extra=passes)
        trainers = [sync_rank, async_rank]
        arrays = asyncio.run(submit_all(store_url, address, job))

        wait_for(lambda: any(line["event"] == "holding" for line in progress_lines(progress)), "rank 0 to hold")
        lines = progress_lines(progress)
        first = lines[0]["sequence"]
        assert {line["pass"] for line in lines if line["event"] == "micro"} == set(range(PASSES))
        time.sleep(1.0)  # give a premature release every chance to show
        with AdmissionClient(address, deadline=timedelta(seconds=5)) as client:
            assert client.status().released_minibatches == 0
        held = sidecar_status(socket)
        assert held.acknowledged_sequence < first  # rank 0 holds the last micro-batch's slot until its last pass
        assert held.slots_occupied >= 1
        release.touch()

        for process in trainers:
            try:
                process.popen.wait(timeout=120)
            except Exception:
                pytest.fail(f"{process.name} did not finish:\n{process.tail()}")
            assert process.popen.returncode == 0, process.tail()
        results = [json.loads(sync_output.read_text()), json.loads(async_output.read_text())]
        for result in results:
            check_against_submitted(result, arrays)  # pass 0 (every trajectory exactly once)
            for mini in result["minibatches"]:
                assert len(mini["passes"]) == PASSES
                for again in mini["passes"]:  # every pass: the same micro-batches, in the same order, byte for byte
                    assert again == mini["microbatches"]
                    check_against_submitted({"minibatches": [{"microbatches": again}]},
                                            {t["trajectory_id"]: arrays[t["trajectory_id"]]
                                             for m in again for t in m["items"]})
        assert results[0]["minibatches"] == results[1]["minibatches"]

        assert any(m["num_microbatches"] > 1 for m in results[0]["minibatches"])  # copies kept, not only the held
        status = sidecar_status(socket)
        micro_batches = sum(m["num_microbatches"] for m in results[0]["minibatches"])
        assert status.published == status.read_calls == micro_batches  # once each, not once per pass
        assert status.bytes_read == status.bytes_needed > 0
        submitted = sum(a.nbytes for fields in arrays.values() for a in fields.values())
        assert status.bytes_read == submitted  # every unit's bytes read exactly once over all passes
        wait_for(lambda: sidecar_status(socket).acknowledged_sequence == first + MINIBATCHES - 1, "acknowledgement")
        with AdmissionClient(address, deadline=timedelta(seconds=5)) as client:
            wait_for(lambda: client.status().released_minibatches == MINIBATCHES, "the steps to be released")
            assert client.status().policy_version == 1
    finally:
        for process in trainers:
            process.stop(timeout=5)
        if sidecar is not None:
            sidecar.stop()
        admission.stop()


def test_a_tp_rank_restart_in_a_later_pass_restarts_the_mini_batch_from_pass_0(tmp_path: Path) -> None:
    """TP rank 1 holds micro-batch 0 of pass 0; TP rank 0 goes through pass 0 and holds in pass 1. Rank 1 is
    killed (-9) and started again: the sidecar starts a new delivery round, and rank 0, which takes nothing from
    the sidecar in pass 1, raises MiniBatchRestarted and gets the mini-batch again, whole, from pass 0."""
    job = f"passes{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    topology = {"backbone": {"dp": 1, "cp": 1, "tp": 2, "max_tokens_per_microbatch": 256}}
    admission = start_admission(tmp_path, job=job, store=store_url, topology=topology,
                                train_batch_size=TRAIN_BATCH, num_minibatches=MINIBATCHES)
    address = admission.ready["address"]
    progress0, progress1 = tmp_path / "rank0.progress", tmp_path / "rank1.progress"
    sidecar, trainers = None, []
    try:
        sidecar = start_sidecar(tmp_path, job=job, store=store_url, admission=address, dp_rank=0, cp_rank=0,
                                slots=16)
        socket = sidecar.ready["address"]
        passes = ("--passes", str(PASSES))
        rank0, output0 = start_trainer(
            tmp_path, socket=socket, tp_rank=0, global_rank=0, admission=address, minibatches=MINIBATCHES,
            extra=(*passes, "--progress", str(progress0), "--hold-at", "0", "--hold-pass", "1",
                   "--hold-until-restart"))
        stuck, _ = start_trainer(tmp_path, socket=socket, tp_rank=1, global_rank=1, admission=address,
                                 minibatches=MINIBATCHES, name="trainer-1-old",
                                 extra=(*passes, "--progress", str(progress1), "--hold-at", "0"))
        trainers = [rank0, stuck]
        arrays = asyncio.run(submit_all(store_url, address, job))
        for path in (progress0, progress1):
            wait_for(lambda path=path: any(line["event"] == "holding" for line in progress_lines(path)), "holds")
        first = progress_lines(progress0)[0]["sequence"]
        assert len({line["micro"]["index"] for line in progress_lines(progress0) if line["event"] == "micro"}) > 1
        stuck.kill()
        rank1, output1 = start_trainer(tmp_path, socket=socket, tp_rank=1, global_rank=1, admission=address,
                                       minibatches=MINIBATCHES, name="trainer-1-new", extra=passes)
        trainers.append(rank1)
        for process in (rank0, rank1):
            try:
                process.popen.wait(timeout=120)
            except Exception:
                pytest.fail(f"{process.name} did not finish:\n{process.tail()}")
            assert process.popen.returncode == 0, process.tail()
        result0, result1 = json.loads(output0.read_text()), json.loads(output1.read_text())
        assert [r["sequence"] for r in result0["restarted"]] == [first]  # raised in pass 1, never stepped on
        restarted_in = [line for line in progress_lines(progress0) if line["event"] == "restarted"]
        assert len(restarted_in) == 1
        for result in (result0, result1):
            check_against_submitted(result, arrays)
            for mini in result["minibatches"]:
                assert [again == mini["microbatches"] for again in mini["passes"]] == [True] * PASSES
        assert result0["minibatches"] == result1["minibatches"]
        # After the restart, rank 0's micro-batches of the mini-batch came again from pass 0, micro-batch 0.
        lines = progress_lines(progress0)
        after = lines[lines.index(restarted_in[0]) + 1]
        assert (after["event"], after["sequence"], after["pass"], after["micro"]["index"]) == ("micro", first, 0, 0)
        with AdmissionClient(address, deadline=timedelta(seconds=5)) as client:
            wait_for(lambda: client.status().released_minibatches == MINIBATCHES, "the steps to be released")
    finally:
        for process in trainers:
            process.stop(timeout=5)
        if sidecar is not None:
            sidecar.stop()
        admission.stop()
