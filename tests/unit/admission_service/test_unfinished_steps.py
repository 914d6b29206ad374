"""Mini-batches some consumers stepped on and others never did (docs/failures.md, "A step that never ends"): the
ledger's list against a naive reference over random orders and times of optimizer-step reports, live, replayed
and through a snapshot; the gauge's age of the oldest; one warning per such mini-batch, naming who owes it."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from knittrans.admission.service.ledger import AdmissionLedger
from knittrans.admission.service.metrics import AdmissionMetrics
from knittrans.admission.service.retention import RetentionPolicy
from knittrans.admission.service.snapshot import StoredFingerprints, restore_ledger, snapshot_of
from knittrans.admission.service.unfinished_steps import UnfinishedStepWarnings
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2, snapshot_pb2
from knittrans.wire import consumer_to_proto
from tests.unit.admission_service.test_retention import MINIBATCHES, PER_BATCH, Driver


def report_step(driver: Driver, consumer_index: int, sequence: int, at: float) -> None:
    consumer = consumer_to_proto(driver.ledger.consumers[consumer_index])
    driver.commit(journal_pb2.JournalRecord(at=at, progress=pb.ReportProgressRequest(
        consumer=consumer, sequence=sequence, stage=pb.PROGRESS_STAGE_OPTIMIZER_STEP)))


def admitted(policy: RetentionPolicy | None = None) -> Driver:
    driver = Driver(policy or RetentionPolicy())
    driver.admit(4 * MINIBATCHES // PER_BATCH)
    assert driver.ledger.next_sequence == MINIBATCHES + 1
    return driver


def unfinished(ledger: AdmissionLedger) -> list[tuple[int, float | None, frozenset]]:
    return [(m.sequence, m.first_step_at, frozenset(m.owed_steps)) for m in ledger.unfinished_steps()]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), retain_steps=st.integers(0, 2))
def test_unfinished_steps_are_those_some_but_not_all_consumers_stepped_on(data, retain_steps) -> None:
    driver = admitted(RetentionPolicy(retain_steps=retain_steps))
    consumers = len(driver.ledger.consumers)
    # Any order, repeats included (a retried report), any journal times (not monotonic: the reference must not
    # take the earliest time for the first report).
    events = data.draw(st.lists(st.tuples(st.integers(0, consumers - 1), st.integers(1, MINIBATCHES),
                                          st.floats(0, 1e6, allow_nan=False)), max_size=40))
    stepped_by: dict[int, set[int]] = {}
    first_at: dict[int, float] = {}
    for consumer, sequence, at in events:
        report_step(driver, consumer, sequence, at)
        stepped_by.setdefault(sequence, set()).add(consumer)
        first_at.setdefault(sequence, at)
        expected = [(s, first_at[s]) for s in sorted(stepped_by) if 0 < len(stepped_by[s]) < consumers]
        assert [(s, at) for s, at, _ in unfinished(driver.ledger)] == expected
    for sequence, _, owed in unfinished(driver.ledger):
        assert owed == {driver.ledger.consumers[c] for c in range(consumers)} - {
            driver.ledger.consumers[c] for c in stepped_by[sequence]}
    replayed = driver.new_ledger()
    for record in driver.records:
        replayed.apply(journal_pb2.JournalRecord.FromString(record.SerializeToString()))
    assert unfinished(replayed) == unfinished(driver.ledger)
    snapshot = snapshot_of(driver.ledger, len(driver.records), StoredFingerprints())
    restored = driver.new_ledger()
    chunks = [] if snapshot.new_chunk is None else [snapshot.new_chunk.SerializeToString()]
    restore_ledger(restored, snapshot_pb2.AdmissionSnapshot.FromString(snapshot.state.SerializeToString()), chunks)
    assert unfinished(restored) == unfinished(driver.ledger)


def test_the_gauge_is_the_age_of_the_oldest_unfinished_step_and_zero_without_one() -> None:
    driver = admitted()
    registry = CollectorRegistry()
    metrics = AdmissionMetrics(registry, sources=("A",))

    def exported() -> float | None:
        return registry.get_sample_value("knittrans_admission_unfinished_step_seconds")

    metrics.refresh(driver.ledger, now=1000.0)
    assert exported() == 0.0
    report_step(driver, 0, 2, at=900.0)
    report_step(driver, 1, 1, at=950.0)  # a later first report on an older mini-batch: the oldest by sequence
    metrics.refresh(driver.ledger, now=1000.0)
    assert exported() == 50.0
    for consumer in range(len(driver.ledger.consumers)):
        report_step(driver, consumer, 1, at=960.0)
    metrics.refresh(driver.ledger, now=1000.0)
    assert exported() == 100.0  # mini-batch 1 finished; 2 is left


def test_each_unfinished_step_is_warned_of_once_past_the_threshold_naming_who_owes_it(
        caplog: pytest.LogCaptureFixture) -> None:
    driver = admitted()
    consumers = driver.ledger.consumers
    warnings = UnfinishedStepWarnings(after_seconds=60.0)
    report_step(driver, 0, 1, at=100.0)
    with caplog.at_level(logging.WARNING, logger="knittrans.admission.service.unfinished_steps"):
        warnings.check(driver.ledger, now=159.0)
        assert caplog.records == []
        warnings.check(driver.ledger, now=161.0)
        warnings.check(driver.ledger, now=500.0)
        [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("mini-batch 1 (train batch 0, mini-batch 0):")
    assert all(str(c) in warning for c in consumers[1:]) and str(consumers[0]) not in warning
