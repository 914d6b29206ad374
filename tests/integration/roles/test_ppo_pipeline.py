"""Multi-role pipelines with attached fields through the real stack (DESIGN.md §10 "Roles", docs/roles.md).

A PPO-shaped job: ``reference`` (dp 1) attaches ``ref_logprobs``, ``critic`` (dp 3) attaches response-only
``values`` and trains, and the actor (the backbone, dp 2) consumes both (see :mod:`.pipeline`).

- the actor receives the attached fields byte for byte as the producers computed them (``values`` padded with 0
  over the prompt, with its mask), each role trains each admitted trajectory exactly once, the actor's sidecars
  read nothing while a producer has not attached, and the units (reported and attached) are deleted from the
  store only once every role reported its step;
- ``kill -9`` of the admission service between the producers' attachments and the actor's step, with the journal
  in a real Redis (with and without snapshots): the restarted service dispatches the actor the attached fields,
  byte for byte, and the actor's step then releases every unit.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from knittrans.client.admission import AdmissionClient
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import UnitKey
from tests.integration.reorg.processes import start_admission

from .pipeline import DP, SCHEMA, TOPOLOGY, Pipeline

BATCH = 8  # trajectories per mini-batch (two mini-batches per train batch)


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    """Hang guard only: waits for an effect that must come."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def unit_keys(pipeline: Pipeline, trajectory_ids: list[str]) -> list[UnitKey]:
    """Every unit of these trajectories: the reported ones and the attached ones."""
    return [UnitKey(f"{pipeline.job}/t/{t}/{name}") for t in trajectory_ids
            for name in ("input_ids", "ref_logprobs", "values")]


def test_a_ppo_pipeline_feeds_the_actor_the_attached_fields_and_releases_after_every_role(tmp_path: Path) -> None:
    job = f"ppo{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    admission = start_admission(tmp_path, job=job, store=store_url, topology=TOPOLOGY, train_batch_size=2 * BATCH,
                                num_minibatches=2, schema=SCHEMA)
    address = admission.ready["address"]
    store = open_store(store_url, job=job)
    client = AdmissionClient(address, deadline=timedelta(seconds=10))
    pipeline = Pipeline(job=job, store_url=store_url, directory=tmp_path, rollout=RolloutClient(store, namespace=job))
    try:
        for role in ("reference", "critic", "backbone"):
            pipeline.start_role(role, address)
        client.report(pipeline.write(2 * BATCH))
        for released in range(2):  # the train batch's two mini-batches
            actor = [pipeline.trainers[("backbone", dp)] for dp in range(DP["backbone"])]
            needed = [trainer.status().bytes_needed for trainer in actor]
            critic = pipeline.receive_critic()  # the critic has its part; it attaches nothing yet
            pipeline.run_reference()
            # The reference attached everything and stepped, the critic holds back: the actor's sidecars have
            # not been dispatched the mini-batch (they would have read its units).
            assert [trainer.status().bytes_needed for trainer in actor] == needed
            keys = unit_keys(pipeline, [t for _, ids in critic for t in ids])
            pipeline.attach_critic(critic, step=False)
            pipeline.run_actor()
            # The reference and the actor stepped, the critic has not: nothing is released, every unit is stored.
            assert client.status().released_minibatches == released
            assert all(store.exists(keys))
            for mini, _ in critic:
                mini.complete()
            wait_until(lambda keys=keys: not any(store.exists(keys)), "the mini-batch's units to be deleted")
        admitted = sorted(pipeline.written)
        for role, trained in pipeline.trained.items():
            assert sorted(trained) == admitted, role  # each role trained each trajectory exactly once
        assert client.status().released_minibatches == 2
    finally:
        pipeline.close()
        client.close()
        store.close()
        admission.stop()


@pytest.mark.parametrize("snapshot_every", [0, 1], ids=["journal", "snapshots"])
def test_kill_9_of_the_admission_service_between_attach_and_the_actor_step_loses_no_attachment(
        tmp_path: Path, redis_server, snapshot_every: int) -> None:
    job = f"ppok{uuid.uuid4().hex[:8]}"
    store_url = f"file://{tmp_path / 'units'}"
    settings = {"state": redis_server.url, "snapshot_every_records": snapshot_every}

    def serve(name: str):
        directory = tmp_path / name
        directory.mkdir()
        return start_admission(directory, job=job, store=store_url, topology=TOPOLOGY, train_batch_size=BATCH,
                               num_minibatches=1, schema=SCHEMA, settings=settings)

    first = serve("first")
    store = open_store(store_url, job=job)
    pipeline = Pipeline(job=job, store_url=store_url, directory=tmp_path, rollout=RolloutClient(store, namespace=job))
    second = None
    try:
        for role in ("reference", "critic"):
            pipeline.start_role(role, first.ready["address"])
        with AdmissionClient(first.ready["address"], deadline=timedelta(seconds=10)) as client:
            client.report(pipeline.write(BATCH))
        critic = pipeline.receive_critic()
        pipeline.run_reference()
        pipeline.attach_critic(critic)
        first.kill()  # kill -9: every attachment was acknowledged; the actor has not stepped
        second = serve("second")
        address = second.ready["address"]
        pipeline.start_role("backbone", address)  # the actor's sidecars know only the restarted service
        pipeline.run_actor()
        keys = unit_keys(pipeline, sorted(pipeline.written))
        wait_until(lambda: not any(store.exists(keys)), "the mini-batch's units to be deleted")
        assert sorted(pipeline.trained["backbone"]) == sorted(pipeline.written)
    finally:
        pipeline.close()
        store.close()
        first.stop()
        if second is not None:
            second.stop()
