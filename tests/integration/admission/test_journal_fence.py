"""The fenced Redis journal against a real redis-server: an append lands only at the journal's end, a re-sent
append is recognised, concurrent writers at one sequence leave exactly one record, and replay applies each
sequence once. The oracle is a plain Python list."""

from __future__ import annotations

import asyncio
import itertools
import signal

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knittrans.admission.service.journal import (
    AppendOutcome,
    FenceViolation,
    JournalFenced,
    JournalGap,
    JournalOutcomeUnknown,
    RedisJournal,
    is_next,
)
from knittrans.v1 import admission_service_pb2, journal_pb2

_jobs = itertools.count()


def fresh_job() -> str:
    return f"fence{next(_jobs)}"


def record(sequence: int, payload: int) -> journal_pb2.JournalRecord:
    return journal_pb2.JournalRecord(
        at=float(payload), sequence=sequence, version=admission_service_pb2.AdvanceVersionRequest(new_version=payload)
    )


async def read_all(journal: RedisJournal, after: int = 0) -> list[journal_pb2.JournalRecord]:
    return [r async for r in journal.replay(after=after)]


async def attempt(journal: RedisJournal, rec: journal_pb2.JournalRecord) -> AppendOutcome | FenceViolation:
    try:
        return await journal.append(rec)
    except JournalFenced as exc:
        return exc.violation


def test_concurrent_appenders_at_one_sequence_leave_exactly_one_record(redis_server) -> None:
    async def main() -> None:
        job = fresh_job()
        writers = [RedisJournal(redis_server.url, job=job) for _ in range(8)]
        try:
            # Eight writers at sequence 1, each with its own record: one wins, the others are refused.
            outcomes = await asyncio.gather(*(attempt(w, record(1, 100 + i)) for i, w in enumerate(writers)))
            assert outcomes.count(AppendOutcome.APPENDED) == 1
            assert outcomes.count(FenceViolation.DIFFERENT_RECORD) == 7
            winner = outcomes.index(AppendOutcome.APPENDED)
            assert await read_all(writers[0]) == [record(1, 100 + winner)]
            # At sequence 2, two writers send the same record: one appends it, the other finds it there.
            records = [record(2, 7), record(2, 7)] + [record(2, 200 + i) for i in range(6)]
            outcomes = await asyncio.gather(*(attempt(w, r) for w, r in zip(writers, records, strict=True)))
            assert outcomes.count(AppendOutcome.APPENDED) == 1
            if AppendOutcome.APPENDED in outcomes[:2]:  # the shared record won: its twin found it there
                assert set(outcomes[:2]) == {AppendOutcome.APPENDED, AppendOutcome.ALREADY_THERE}
            else:
                assert outcomes[:2] == [FenceViolation.DIFFERENT_RECORD] * 2
            journal = await read_all(writers[0])
            assert len(journal) == 2 and journal[1] in records
            # A writer that believes the journal ends earlier, or later, is refused and told where it ends.
            for stale in (record(1, 999), record(5, 999)):
                with pytest.raises(JournalFenced) as refused:
                    await writers[3].append(stale)
                assert refused.value.journal_end == 2
            assert len(await read_all(writers[0])) == 2
        finally:
            for writer in writers:
                await writer.close()

    asyncio.run(main())


def test_re_appending_the_same_record_is_success_and_keeps_one_copy(redis_server) -> None:
    async def main() -> None:
        journal = RedisJournal(redis_server.url, job=fresh_job())
        try:
            assert await journal.append(record(1, 1)) is AppendOutcome.APPENDED
            assert await journal.append(record(1, 1)) is AppendOutcome.ALREADY_THERE
            assert await journal.append(record(2, 2)) is AppendOutcome.APPENDED
            assert await journal.append(record(1, 1)) is AppendOutcome.ALREADY_THERE
            assert await read_all(journal) == [record(1, 1), record(2, 2)]
        finally:
            await journal.close()

    asyncio.run(main())


def test_an_append_whose_reply_is_lost_lands_at_most_once(redis_server) -> None:
    """Redis stopped (SIGSTOP) past the client's time-out: the outcome is unknown. Sending the same record again
    once Redis answers finds it there or appends it; either way the journal holds it once."""

    async def main() -> None:
        job = fresh_job()
        journal = RedisJournal(redis_server.url, job=job, timeout_seconds=0.5)
        try:
            assert await journal.append(record(1, 1)) is AppendOutcome.APPENDED
            redis_server.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(JournalOutcomeUnknown):
                    await journal.append(record(2, 2))
            finally:
                redis_server.process.send_signal(signal.SIGCONT)
            while True:  # until Redis answers again
                try:
                    outcome = await journal.append(record(2, 2))
                    break
                except JournalOutcomeUnknown:
                    await asyncio.sleep(0.1)
            assert outcome in (AppendOutcome.APPENDED, AppendOutcome.ALREADY_THERE)
            assert await read_all(journal) == [record(1, 1), record(2, 2)]
        finally:
            await journal.close()

    asyncio.run(main())


def test_a_journal_written_before_fencing_replays_with_positions_and_takes_fenced_appends(redis_server) -> None:
    async def main() -> None:
        journal = RedisJournal(redis_server.url, job=fresh_job())
        try:
            legacy = redis.Redis.from_url(redis_server.url)
            legacy.rpush(journal.key, *(record(0, p).SerializeToString() for p in (10, 11, 12)))
            legacy.close()
            assert [r.sequence for r in await read_all(journal)] == [1, 2, 3]
            with pytest.raises(JournalFenced):
                await journal.append(record(3, 13))
            assert await journal.append(record(4, 13)) is AppendOutcome.APPENDED
            assert [(r.sequence, r.version.new_version) for r in await read_all(journal, after=2)] == [(3, 12),
                                                                                                        (4, 13)]
        finally:
            await journal.close()

    asyncio.run(main())


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 8), st.integers(0, 2)),
        st.tuples(st.just("replay"), st.integers(0, 8), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_appends_and_replays_agree_with_a_list(redis_server, ops) -> None:
    async def main() -> None:
        journal = RedisJournal(redis_server.url, job=fresh_job())
        model: list[bytes] = []
        try:
            for op, number, payload in ops:
                if op == "replay":
                    after = min(number, len(model))
                    replayed = await read_all(journal, after=after)
                    assert [r.SerializeToString() for r in replayed] == model[after:]
                    assert [r.sequence for r in replayed] == list(range(after + 1, len(model) + 1))
                    continue
                rec = record(number, payload)
                raw = rec.SerializeToString()
                if number == len(model) + 1:
                    expected: AppendOutcome | FenceViolation = AppendOutcome.APPENDED
                    model.append(raw)
                elif number <= len(model):
                    same = model[number - 1] == raw
                    expected = AppendOutcome.ALREADY_THERE if same else FenceViolation.DIFFERENT_RECORD
                else:
                    expected = FenceViolation.ENDS_ELSEWHERE
                assert await attempt(journal, rec) == expected
            assert [r.SerializeToString() for r in await read_all(journal)] == model
        finally:
            await journal.close()

    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 30), cuts=st.lists(st.integers(0, 30), max_size=4), data=st.data())
def test_replay_applies_each_sequence_once_and_names_a_gap(length, cuts, data) -> None:
    """Overlapping reads of one journal (a tail read after a restart, a snapshot plus its tail) apply every record
    exactly once; a read that skips records is refused, naming the missing sequences."""
    journal = list(range(1, length + 1))
    stream = [s for after in [0, *cuts] for s in journal[min(after, length):]]
    applied: list[int] = []
    for sequence in stream:
        if is_next(applied[-1] if applied else 0, sequence):
            applied.append(sequence)
    assert applied == journal
    if length >= 2:
        missing = data.draw(st.integers(1, length - 1))
        last = 0
        with pytest.raises(JournalGap) as gap:
            for sequence in journal[: missing - 1] + journal[missing:]:
                if is_next(last, sequence):
                    last = sequence
        assert (gap.value.applied, gap.value.sequence) == (missing - 1, missing + 1)
        assert f"records {missing} are missing" in str(gap.value)


def test_redis_time_out_is_counted_from_the_command(redis_server) -> None:
    """A stopped Redis answers nothing; the journal's read fails with Unavailable instead of hanging."""
    from knittrans.errors import Unavailable

    async def main() -> None:
        journal = RedisJournal(redis_server.url, job=fresh_job(), timeout_seconds=0.3)
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(Unavailable):
                await read_all(journal)
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
            await journal.close()

    asyncio.run(main())
