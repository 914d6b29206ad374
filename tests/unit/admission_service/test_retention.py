"""Retention follows checkpoints (DESIGN.md §9): the pure rule against a naive reference, and the ledger driven
through journal records in random orders of optimizer steps and checkpoints, live and replayed.

The reference states the rule from its definition over the whole history: a mini-batch every consumer stepped on
is released once a checkpoint covers its step (``retain_until_checkpoint``), otherwise once ``retain_steps``
mini-batches after it were stepped on; its step is (train batch, mini-batch) counted from the admission order.
"""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.engine import EngineConfig, decide
from knittrans.admission.engine.decisions import Wait
from knittrans.admission.service.ingest.report import classify
from knittrans.admission.service.ledger import AdmissionLedger, LedgerSettings
from knittrans.admission.service.records import record_for
from knittrans.admission.service.retention import RetentionPolicy, due_for_release
from knittrans.types import BackboneTopology, EncoderTopology, Topology
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, trajectory_pb2
from knittrans.wire import consumer_to_proto

HASH = hashlib.blake2b(b"x", digest_size=16).hexdigest()
TOPOLOGY = Topology(backbone=BackboneTopology(dp=2, cp=1, max_tokens_per_microbatch=4096),
                    encoders=(EncoderTopology(name="vision", dp=1, max_cost_per_microbatch=64),))
PER_BATCH = 2  # mini-batches per train batch
MINIBATCHES = 6

policies = st.builds(RetentionPolicy, retain_steps=st.integers(0, 4), retain_until_checkpoint=st.booleans())


def naive_released(stepped: set[int], checkpoint: tuple[int, int] | None, policy: RetentionPolicy) -> set[int]:
    """Sequences (from 1) to release, from the definition over every mini-batch stepped so far."""
    def step(sequence: int) -> tuple[int, int]:
        return divmod(sequence - 1, PER_BATCH)

    if policy.retain_until_checkpoint:
        return {s for s in stepped if checkpoint is not None and step(s) <= checkpoint}
    return {s for s in stepped if sum(1 for later in stepped if later > s) >= policy.retain_steps}


@settings(max_examples=300, deadline=None)
@given(count=st.integers(0, 8), data=st.data(), policy=policies)
def test_the_rule_releases_what_the_definition_says(count, data, policy) -> None:
    held = [divmod(i, PER_BATCH) for i in range(count)]
    checkpoint = data.draw(st.none() | st.tuples(st.integers(0, 5), st.integers(0, PER_BATCH - 1)))
    due = due_for_release(held, checkpoint, policy)
    assert {i + 1 for i in due} == naive_released(set(range(1, count + 1)), checkpoint, policy)


def message(index: int) -> trajectory_pb2.TrajectoryMetadata:
    return trajectory_pb2.TrajectoryMetadata(
        trajectory_id=f"t{index}", sample_id=f"s{index}", source="A", num_tokens=40, num_loss_tokens=20,
        segments=[trajectory_pb2.VersionSegment(version=0, num_tokens=40)],
        units=[trajectory_pb2.UnitRef(
            key=f"t{index}/input_ids", field_name="input_ids", kind=trajectory_pb2.UNIT_KIND_TOKEN_FIELD,
            header=trajectory_pb2.UnitHeader(dtype=trajectory_pb2.D_TYPE_INT32, shape=[40], seq_axis=0,
                                             byte_length=160, content_hash=HASH))],
        accepted=True, finished_at=float(index))


class Driver:
    """Drives a ledger the way the servicer does, keeping the journal's records."""

    def __init__(self, policy: RetentionPolicy) -> None:
        self.policy = policy
        self.ledger = self.new_ledger()
        self.records: list[journal_pb2.JournalRecord] = []

    def new_ledger(self) -> AdmissionLedger:
        engine = EngineConfig(train_batch_size=4, num_minibatches=PER_BATCH, sources={"A": 0.5},
                              max_batches_ahead=None)
        return AdmissionLedger(LedgerSettings(engine=engine, topology=TOPOLOGY, retention=self.policy))

    def commit(self, record: journal_pb2.JournalRecord) -> None:
        self.records.append(record)
        self.ledger.apply(record)

    def admit(self, trajectories: int) -> None:
        request = pb.ReportTrajectoriesRequest(request_id="r", trajectories=[message(i) for i in range(trajectories)])
        self.commit(classify(request, self.ledger).record(1.0))
        while not isinstance(decision := decide(self.ledger.engine, 2.0, self.ledger.version), Wait):
            self.commit(record_for(decision, 2.0, self.ledger.last_wait))

    def step(self, consumer_index: int, sequence: int) -> None:
        consumer = consumer_to_proto(self.ledger.consumers[consumer_index])
        self.commit(journal_pb2.JournalRecord(at=3.0, progress=pb.ReportProgressRequest(
            consumer=consumer, sequence=sequence, stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP)))

    def checkpoint(self, train_batch_index: int, minibatch_index: int) -> None:
        self.commit(journal_pb2.JournalRecord(at=4.0, checkpoint=pb.ReportCheckpointRequest(
            train_batch_index=train_batch_index, minibatch_index=minibatch_index)))


def released(ledger: AdmissionLedger) -> set[int]:
    live = {s for s, m in ledger.minibatches.items() if not m.released}
    return set(range(1, ledger.next_sequence)) - live


@settings(max_examples=60, deadline=None)
@given(policy=policies, data=st.data())
def test_the_ledger_releases_by_the_rule_live_and_after_replay(policy, data) -> None:
    driver = Driver(policy)
    driver.admit(4 * MINIBATCHES // PER_BATCH)
    assert driver.ledger.next_sequence == MINIBATCHES + 1
    consumers = len(driver.ledger.consumers)
    # Every consumer's step of every mini-batch, in a random order (mostly: consumers step in order, but the rule
    # must not depend on it), cut anywhere, with checkpoints anywhere in between.
    steps = [("step", c, s) for s in range(1, MINIBATCHES + 1) for c in range(consumers)]
    if data.draw(st.booleans()):
        steps = data.draw(st.permutations(steps))
    events: list[tuple[str, int, int]] = steps[:data.draw(st.integers(0, len(steps)))]
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(events)))
        step = data.draw(st.tuples(st.integers(0, MINIBATCHES // PER_BATCH - 1), st.integers(0, PER_BATCH - 1)))
        events.insert(at, ("checkpoint", *step))
    stepped_by: dict[int, set[int]] = {}
    checkpoint = None
    for kind, a, b in events:
        if kind == "step":
            driver.step(a, b)
            stepped_by.setdefault(b, set()).add(a)
        else:
            driver.checkpoint(a, b)
            checkpoint = max(checkpoint or (a, b), (a, b))
        stepped = {s for s, who in stepped_by.items() if len(who) == consumers}
        assert released(driver.ledger) == naive_released(stepped, checkpoint, policy), (kind, a, b)
        assert driver.ledger.released_minibatches == len(released(driver.ledger))
    # Every held mini-batch keeps its units, so its assignment can be streamed again.
    for sequence, minibatch in driver.ledger.minibatches.items():
        if not minibatch.released:
            assert driver.ledger.dispatch(minibatch) is not None, sequence
    replayed = driver.new_ledger()
    for record in driver.records:
        replayed.apply(journal_pb2.JournalRecord.FromString(record.SerializeToString()))
    assert released(replayed) == released(driver.ledger)
    assert list(replayed.pending_deletes) == list(driver.ledger.pending_deletes)
    assert replayed.checkpoint == driver.ledger.checkpoint


def test_by_default_a_stepped_minibatch_is_released_at_once() -> None:
    driver = Driver(RetentionPolicy())
    driver.admit(4)
    for consumer in range(len(driver.ledger.consumers)):
        driver.step(consumer, 1)
    assert released(driver.ledger) == {1}
