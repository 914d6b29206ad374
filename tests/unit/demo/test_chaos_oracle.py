"""The chaos oracle must be able to fail: fabricated histories with a partial step, a duplicate, a redo without a
restore, a broken quota or a leftover each fail exactly the check they break; a clean one and a correct redo pass."""

from __future__ import annotations

import base64
import json

from knittrans.demo.chaos.oracle import Leftovers, final_history, judge, read_events
from knittrans.store.hashing import content_hash

SOURCES = ("math", "code")
QUOTAS = dict.fromkeys(SOURCES, 2)  # train batches of 4: two of each source, in two mini-batches of 2


def unit_bytes(trajectory: str) -> bytes:
    return (trajectory * 8).encode()


def acked_run(trajectories: list[str]) -> dict[str, dict]:
    return {t: {"trajectory": t, "source": SOURCES[i % 2],
                "units": {f"job/t/{t}/input_ids": {"field": "input_ids", "hash": content_hash(unit_bytes(t))}}}
            for i, t in enumerate(trajectories)}


def pieces(trajectory: str, cp: int, cp_rank: int) -> list[dict]:
    """What CP rank ``cp_rank`` of ``cp`` received of the trajectory's unit (one contiguous chunk each)."""
    data = unit_bytes(trajectory)
    size = len(data) // cp
    start, end = cp_rank * size, (cp_rank + 1) * size if cp_rank + 1 < cp else len(data)
    return [{"trajectory": trajectory, "field": "input_ids", "key": f"job/t/{trajectory}/input_ids", "start": start,
             "end": end, "bytes": base64.b64encode(data[start:end]).decode()}]


def step(rank: int, sequence: int, planned: list[str], *, cp: int = 2, drop: str = "") -> dict:
    return {"event": "step", "rank": rank, "sequence": sequence, "train_batch": (sequence - 1) // 2,
            "minibatch": (sequence - 1) % 2, "planned": planned,
            "pieces": [p for t in planned if t != drop for p in pieces(t, cp, rank)]}


def restore(rank: int, sequence: int | None) -> dict:
    return {"event": "restore", "rank": rank, "sequence": sequence}


# Two train batches, four mini-batches; sources alternate, so each mini-batch holds one math and one code.
PLAN = {1: ["t0", "t1"], 2: ["t2", "t3"], 3: ["t4", "t5"], 4: ["t6", "t7"]}
ACKED = acked_run([t for ids in PLAN.values() for t in ids])


def clean_history(rank: int) -> list[dict]:
    return [restore(rank, None), *(step(rank, s, ids) for s, ids in PLAN.items())]


def verdict(histories: dict[int, list[dict]], *, admitted: dict | None = None, leftovers: Leftovers | None = None,
            acked: dict | None = None, finished: bool = True):
    return judge(acked=ACKED if acked is None else acked, histories=histories,
                 admitted=PLAN if admitted is None else admitted, quotas=QUOTAS, num_steps=len(PLAN),
                 job_finished=finished, leftovers=leftovers or Leftovers())


def test_a_clean_run_passes() -> None:
    result = verdict({0: clean_history(0), 1: clean_history(1)})
    assert result.passed, result.details
    assert result.details["trained"] == 8 and result.details["units_checked"] == 8


def test_a_step_missing_a_micro_batch_is_a_partial_step() -> None:
    histories = {0: clean_history(0), 1: clean_history(1)}
    histories[1][3] = step(1, 3, PLAN[3], drop="t5")  # rank 1 never got t5's half: the step used part of its plan
    result = verdict(histories)
    assert not result.no_partial_step and not result.passed
    assert result.details["partial_steps"] == [{"sequence": 3, "trajectory": "t5", "unit": "job/t/t5/input_ids"}]


def test_a_trajectory_in_two_steps_is_a_duplicate() -> None:
    plan = {**PLAN, 4: ["t6", "t1"]}  # t1 admitted again in place of t7
    histories = {r: [restore(r, None), *(step(r, s, ids) for s, ids in plan.items())] for r in (0, 1)}
    result = verdict(histories, admitted=plan)
    assert not result.trained_exactly_once
    assert result.details["trained_more_than_once"] == ["t1"] and result.details["acked_never_trained"] == ["t7"]


def test_a_step_applied_twice_without_a_restore_is_a_duplicate() -> None:
    histories = {r: [*clean_history(r)[:3], step(r, 2, PLAN[2]), *clean_history(r)[3:]] for r in (0, 1)}
    result = verdict(histories)
    assert not result.trained_exactly_once


def test_steps_redone_after_a_restore_count_once() -> None:
    # Both ranks applied steps 1-3, restarted from the checkpoint of step 2, and redid step 3.
    histories = {r: [*clean_history(r)[:4], restore(r, 2), step(r, 3, PLAN[3]), step(r, 4, PLAN[4])] for r in (0, 1)}
    result = verdict(histories)
    assert result.passed, result.details


def test_steps_lost_by_a_restore_and_never_redone_are_not_trained() -> None:
    histories = {r: [*clean_history(r), restore(r, 2)] for r in (0, 1)}
    result = verdict(histories)
    assert not result.trained_exactly_once and not result.finished
    assert result.details["acked_never_trained"] == ["t4", "t5", "t6", "t7"]
    assert result.details["steps_by_rank"] == {0: 2, 1: 2}
    assert result.details["events_by_rank"][1] == ["restore None", "step 1", "step 2", "step 3", "step 4",
                                                   "restore 2"]


def test_ranks_that_applied_different_steps_fail() -> None:
    histories = {0: clean_history(0), 1: [*clean_history(1)[:3], step(1, 4, PLAN[4])]}
    assert not verdict(histories).passed


def test_a_plan_that_differs_from_the_admission_fails() -> None:
    result = verdict({0: clean_history(0), 1: clean_history(1)}, admitted={**PLAN, 2: ["t2", "t9"]})
    assert not result.trained_exactly_once and result.details["plans_disagree"] == [2]


def test_an_acknowledged_trajectory_never_admitted_fails() -> None:
    acked = {**ACKED, **acked_run(["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"])}
    result = verdict({0: clean_history(0), 1: clean_history(1)}, acked=acked)
    assert not result.trained_exactly_once and result.details["acked_never_trained"] == ["t8"]


def test_a_train_batch_below_its_quota_fails() -> None:
    plan = {1: ["t0", "t2"], 2: ["t1", "t3"], 3: ["t4", "t6"], 4: ["t5", "t7"]}
    acked = {t: {**a, "source": "math" if t in ("t0", "t2", "t4", "t6") else "code"} for t, a in ACKED.items()}
    acked["t1"] = {**acked["t1"], "source": "math"}  # train batch 0: three math, one code
    histories = {r: [restore(r, None), *(step(r, s, ids) for s, ids in plan.items())] for r in (0, 1)}
    result = verdict(histories, admitted=plan, acked=acked)
    assert not result.quotas_held and result.details["quota_violations"] == {0: {"math": 3, "code": 1}}
    assert result.trained_exactly_once and result.no_partial_step


def test_an_unfinished_job_fails() -> None:
    assert not verdict({0: clean_history(0), 1: clean_history(1)}, finished=False).finished


def test_anything_left_behind_fails() -> None:
    histories = {0: clean_history(0), 1: clean_history(1)}
    for leftovers in (Leftovers(processes=("python -m knittrans.cli reorg serve",)),
                      Leftovers(segments=("knittrans-demo-1@x@0",)), Leftovers(store_units=3)):
        result = verdict(histories, leftovers=leftovers)
        assert not result.nothing_left_behind and not result.passed


def test_a_line_cut_short_by_a_kill_is_ignored() -> None:
    lines = [json.dumps(restore(0, None)), json.dumps(step(0, 1, PLAN[1])), '{"event": "step", "rank": 0, "seq']
    events = read_events(lines)
    assert [e["event"] for e in events] == ["restore", "step"]
    assert [s["sequence"] for s in final_history(events)] == [1]


def failed(rank: int, sequence: int, planned: list[str]) -> dict:
    return {"event": "failed", "rank": rank, "sequence": sequence, "train_batch": (sequence - 1) // 2,
            "minibatch": (sequence - 1) % 2, "planned": planned}


def test_a_minibatch_lost_with_the_store_is_reported_not_counted_as_trained() -> None:
    histories = {r: [restore(r, None), *(failed(r, s, ids) if s == 3 else step(r, s, ids) for s, ids in PLAN.items())]
                 for r in (0, 1)}
    result = verdict(histories)
    assert result.passed, result.details  # its train batch's quotas count what was admitted, lost or not
    assert result.details["lost_with_a_unit"] == ["t4", "t5"] and result.details["lost"] == 2
    assert result.details["trained"] == 6 and result.details["failed_steps"] == [3]


def test_a_train_batch_with_a_lost_minibatch_is_still_held_to_its_quota() -> None:
    plan = {1: ["t0", "t1"], 2: ["t2", "t4"], 3: ["t3", "t5"], 4: ["t6", "t7"]}  # train batch 0: three math
    histories = {r: [restore(r, None), *(failed(r, s, ids) if s == 1 else step(r, s, ids) for s, ids in plan.items())]
                 for r in (0, 1)}
    result = verdict(histories, admitted=plan)
    assert not result.quotas_held
    assert result.details["quota_violations"] == {0: {"math": 3, "code": 1}, 1: {"code": 3, "math": 1}}


def test_a_minibatch_failed_on_one_rank_and_stepped_on_another_fails() -> None:
    histories = {0: clean_history(0),
                 1: [restore(1, None), *(failed(1, s, ids) if s == 3 else step(1, s, ids) for s, ids in PLAN.items())]}
    result = verdict(histories)
    assert not result.trained_exactly_once and result.details["applied_and_failed"] == [3]
