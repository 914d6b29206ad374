"""The demo report keeps waiting for admission apart from waiting for data once admitted."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from knittrans.demo.stack.report import build_rows
from knittrans.stack.progress import Progress

STARTED = 1_000.0


def rank_record(rank: int, *, waiting_since: float, received_at: float, later_wait: float) -> dict:
    return {
        "rank": rank, "step": 0, "sequence": 1, "train_batch": 0, "minibatch": 0, "train_version": 0,
        "waiting_since": waiting_since, "received_at": received_at, "later_wait_seconds": later_wait,
        "compute_seconds": 0.5, "finished_at": received_at + 1.0, "dedup_factor": 1.0, "loss": 1.0,
    }


def test_a_rank_that_waited_for_rollouts_waited_for_admission_not_for_data() -> None:
    # Rank 0 asked at t=10 s, the mini-batch was admitted at t=14 s and its first micro-batch came at t=14.25 s;
    # its later micro-batches kept it waiting 0.5 s more. Rank 1 asked only after the admission.
    records = [
        rank_record(0, waiting_since=STARTED + 10, received_at=STARTED + 14.25, later_wait=0.5),
        rank_record(1, waiting_since=STARTED + 15, received_at=STARTED + 15.125, later_wait=0.0),
    ]
    admissions = {1: {"admitted_at": STARTED + 14, "train_version": 0, "trajectory_ids": []}}
    (row,) = build_rows(records, admissions, {}, STARTED)
    assert row.admission_wait_seconds == 4.0
    assert row.data_wait_after_admission_seconds == 0.75  # the slowest rank: 0.25 + 0.5


@given(
    waiting=st.floats(0, 100), admitted=st.floats(0, 100), delay=st.floats(0, 10), later=st.floats(0, 10),
)
def test_the_two_waits_add_up_to_the_whole_wait(waiting: float, admitted: float, delay: float, later: float) -> None:
    received = max(waiting, admitted) + delay  # nothing arrives before it is admitted and asked for
    records = [rank_record(0, waiting_since=STARTED + waiting, received_at=STARTED + received, later_wait=later)]
    admissions = {1: {"admitted_at": STARTED + admitted, "train_version": 0, "trajectory_ids": []}}
    (row,) = build_rows(records, admissions, {}, STARTED)
    whole = received - waiting + later
    assert abs(row.admission_wait_seconds + row.data_wait_after_admission_seconds - whole) < 1e-3
    assert abs(row.admission_wait_seconds - max(0.0, admitted - waiting)) < 1e-3
    assert row.data_wait_after_admission_seconds >= later - 1e-3


def test_progress_in_a_log_is_plain_lines() -> None:
    log = io.StringIO()  # not a terminal
    progress = Progress(log)
    progress.show("starting")
    progress.show("step 1", key=1)
    progress.show("step 1 (pool grew)", key=1)
    progress.end_line()
    progress.show("step 2", key=2)
    assert log.getvalue() == "starting\nstep 1\nstep 2\n"
