"""The ledger's verdict on a mini-batch (WaitMiniBatchVerdict), against a naive reference: OK once every planned
consumer verified it, FAILED with the first failure when one came before that, never changed once given;
repeats change nothing, and replaying the journal gives the same verdicts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.admission.service.ledger import AdmissionLedger, Verdict
from knittrans.types import ConsumerId
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2
from knittrans.wire import consumer_to_proto
from tests.unit.admission_service.test_ledger_replay import Journaled, message, new_ledger

SEQUENCES = (1, 2)


def admitted() -> Journaled:
    driver = Journaled()
    driver.report([message(i) for i in range(8)], "batch")
    assert driver.ledger.next_sequence > max(SEQUENCES)
    return driver


def verified(consumer: ConsumerId, sequence: int) -> journal_pb2.JournalRecord:
    return journal_pb2.JournalRecord(at=1.0, progress=pb.ReportProgressRequest(
        consumer=consumer_to_proto(consumer), sequence=sequence, stage=pb.PROGRESS_STAGE_VERIFIED))


def failed(consumer: ConsumerId, sequence: int, unit: str) -> journal_pb2.JournalRecord:
    failure = pb.ConsumerFailure(consumer=consumer_to_proto(consumer), sequence=sequence, trajectory_id="t1",
                                 unit_key=unit, reason="missing")
    return journal_pb2.JournalRecord(at=1.0, consumer_failure=pb.ReportConsumerFailureRequest(failure=failure))


def reference(events: list[tuple[str, int, int, str]], consumers: int) -> dict[int, tuple[str, str | None]]:
    """A naive model: walk the events in order; per sequence, the first of 'all verified' or 'a failure' wins."""
    outcome: dict[int, tuple[str, str | None]] = {}
    seen: dict[int, set[int]] = {s: set() for s in SEQUENCES}
    reported: set[tuple[int, int]] = set()
    for kind, consumer, sequence, unit in events:
        if kind == "failure":
            if (consumer, sequence) in reported:
                continue  # a repeated report of one (consumer, sequence) changes nothing
            reported.add((consumer, sequence))
            outcome.setdefault(sequence, ("failed", unit))
        else:
            seen[sequence].add(consumer)
            if len(seen[sequence]) == consumers:
                outcome.setdefault(sequence, ("ok", None))
    return outcome


def observed(ledger: AdmissionLedger) -> dict[int, tuple[str, str | None]]:
    result = {}
    for sequence in SEQUENCES:
        verdict, failure = ledger.verdict(sequence)
        if verdict is not Verdict.PENDING:
            result[sequence] = (verdict.value, failure.unit_key if failure is not None else None)
    return result


EVENTS = st.lists(
    st.tuples(st.sampled_from(["verified", "verified", "verified", "failure"]), st.integers(0, 4),
              st.sampled_from(SEQUENCES), st.sampled_from(["u/a", "u/b", "u/c"])),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.randoms(use_true_random=False))
def test_verdicts_follow_the_reference_and_survive_replay(events, rng) -> None:
    driver = admitted()
    consumers = driver.ledger.consumers
    assert len(consumers) == 5  # 2 x 2 backbone consumers and one encoder consumer
    # Every consumer verifies both mini-batches at some point, in a shuffled order, among the generated events.
    everyone = [("verified", c, s, "") for c in range(len(consumers)) for s in SEQUENCES]
    events = list(events) + everyone
    rng.shuffle(events)
    acknowledged = dict(driver.ledger.acknowledged)
    for i, (kind, consumer, sequence, unit) in enumerate(events):
        if kind == "failure":
            driver.commit(failed(consumers[consumer], sequence, unit))
        else:
            driver.commit(verified(consumers[consumer], sequence))
        assert observed(driver.ledger) == reference(events[: i + 1], len(consumers))
    assert set(observed(driver.ledger)) == set(SEQUENCES)  # everyone verified: every verdict is in
    assert driver.ledger.acknowledged == acknowledged  # verifying is not delivering
    replayed = new_ledger()
    for record in driver.records:
        replayed.apply(journal_pb2.JournalRecord.FromString(record.SerializeToString()))
    assert observed(replayed) == observed(driver.ledger)
    assert len(replayed.failed_sequences) == len(driver.ledger.failed_sequences)


def test_repeats_change_nothing_and_a_late_failure_leaves_the_verdict_ok() -> None:
    driver = admitted()
    ledger = driver.ledger
    consumers = ledger.consumers
    for consumer in consumers[:-1]:
        driver.commit(verified(consumer, 1))
        assert ledger.apply(verified(consumer, 1)).decided is None  # a repeat
        assert not ledger.awaits_verification(consumer, 1)
    assert ledger.verdict(1) == (Verdict.PENDING, None)
    assert ledger.awaits_verification(consumers[-1], 1)
    assert driver.ledger.apply(verified(consumers[-1], 1)).decided == 1
    assert ledger.verdict(1) == (Verdict.OK, None)
    # Bytes damaged after verification: recorded (status, metric), but the others may be delivering already.
    late = ledger.apply(failed(consumers[0], 1, "u/late"))
    assert late.failure is not None and late.failed_minibatch and late.decided is None
    assert ledger.verdict(1) == (Verdict.OK, None)
    assert 1 in ledger.failed_sequences

    first = ledger.apply(failed(consumers[2], 2, "u/first"))
    assert first.decided == 2
    assert ledger.apply(failed(consumers[3], 2, "u/second")).decided is None
    verdict, failure = ledger.verdict(2)
    assert verdict is Verdict.FAILED and failure.unit_key == "u/first"
    assert len(ledger.failed_sequences) == 2


def test_a_forgotten_minibatch_keeps_its_verdict() -> None:
    driver = admitted()
    ledger = driver.ledger
    driver.commit(failed(ledger.consumers[1], 1, "u/gone"))
    for sequence in SEQUENCES:
        for consumer in ledger.consumers:
            driver.commit(verified(consumer, sequence))
        driver.finish(sequence)  # every consumer's optimizer step: released and acknowledged, then forgotten
    assert not set(SEQUENCES) & set(ledger.minibatches)
    assert ledger.verdict(1)[0] is Verdict.FAILED and ledger.verdict(1)[1].unit_key == "u/gone"
    assert ledger.verdict(2) == (Verdict.OK, None)
