"""The chaos run's verdict, from records kept outside the services: pure functions over what was logged.

Two append-only logs feed it, both written by the job's own clients, never by the services:

- the rollout side's acknowledgements (``acked-<worker>.jsonl``): every trajectory the admission service
  acknowledged, with its source and the content hash of every unit it wrote;
- the trainer side's history (``applied-rank<r>.jsonl``): a ``restore`` event each time a rank starts (the step
  its checkpoint holds), a ``step`` event after each optimizer step (the mini-batch's sequence, the trajectory ids
  its plan names, and the bytes of every per-token field it received), and a ``failed`` event for a mini-batch
  that came as a typed error instead of data.

A restore discards the steps after its checkpoint: they are redone, and only the final history counts. Then every
acknowledged trajectory must have been trained in exactly one applied step; each step's received bytes must hash
to what the rollout wrote for every trajectory its plan names (a missing micro-batch leaves a field short: no
partial step); every train batch must meet its quotas; every rank must have applied every step; and nothing
(process, shared-memory segment, store unit) may be left behind.
"""

from __future__ import annotations

import base64
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from knittrans.store.hashing import content_hash


@dataclass(frozen=True, kw_only=True)
class Leftovers:
    """What the driver found after stopping everything."""

    processes: tuple[str, ...] = ()
    segments: tuple[str, ...] = ()
    store_units: int = 0


@dataclass(frozen=True, kw_only=True)
class ChaosVerdict:
    trained_exactly_once: bool
    no_partial_step: bool
    quotas_held: bool
    finished: bool
    nothing_left_behind: bool
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (self.trained_exactly_once and self.no_partial_step and self.quotas_held and self.finished
                and self.nothing_left_behind)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def read_events(lines: Iterable[str]) -> list[dict]:
    """JSON lines; a last line cut short by a kill -9 is ignored (the step it describes did not complete)."""
    events = []
    for line in lines:
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def final_history(events: Sequence[dict]) -> list[dict]:
    """One rank's applied steps that its last state holds: each restore drops the steps after its checkpoint."""
    history: list[dict] = []
    for event in events:
        if event["event"] == "restore":
            restored = event["sequence"]  # None: a fresh start
            history = [s for s in history if restored is not None and s["sequence"] <= restored]
        elif event["event"] in ("step", "failed"):
            history.append(event)
    return history


def reassemble(pieces: Sequence[dict]) -> str:
    """The content hash of a unit rebuilt from the token ranges the ranks received (a gap breaks the hash)."""
    data = bytearray()
    position = 0
    for piece in sorted(pieces, key=lambda p: p["start"]):
        if piece["start"] != position:
            return f"gap at token {position}"
        data += base64.b64decode(piece["bytes"])
        position = piece["end"]
    return content_hash(bytes(data))


def judge(
    *,
    acked: Mapping[str, dict],
    histories: Mapping[int, Sequence[dict]],
    admitted: Mapping[int, Sequence[str]],
    quotas: Mapping[str, int],
    num_steps: int,
    job_finished: bool,
    leftovers: Leftovers,
) -> ChaosVerdict:
    """``acked``: trajectory id -> {"source", "units": {key: {"field", "hash"}}}; ``histories``: rank -> its log
    events; ``admitted``: sequence -> trajectory ids, as the admission service announced them (where seen)."""
    details: dict = {}
    finals = {rank: final_history(events) for rank, events in histories.items()}
    steps = {rank: [s for s in history if s["event"] == "step"] for rank, history in finals.items()}
    failed = {s["sequence"] for history in finals.values() for s in history if s["event"] == "failed"}

    # Every rank applied the same sequences, each once, in order.
    per_rank = {rank: [s["sequence"] for s in rank_steps] for rank, rank_steps in steps.items()}
    orders_ok = all(seqs == sorted(set(seqs)) for seqs in per_rank.values())
    agree = len({tuple(seqs) for seqs in per_rank.values()}) <= 1
    if not orders_ok or not agree:
        details["sequences_by_rank"] = per_rank
    sequences = sorted({s for seqs in per_rank.values() for s in seqs})

    # The plan of each applied step and each failed mini-batch: the ids the sidecar's mini-batch named, the same on
    # every rank, and the same as the admission service announced.
    plans: dict[int, tuple[str, ...]] = {}
    batch_of: dict[int, int] = {}
    plan_mismatch = []
    for history in finals.values():
        for s in history:
            planned = tuple(sorted(s["planned"]))
            if plans.setdefault(s["sequence"], planned) != planned:
                plan_mismatch.append(s["sequence"])
            batch_of[s["sequence"]] = s["train_batch"]
    for sequence, planned in plans.items():
        if sequence in admitted and tuple(sorted(admitted[sequence])) != planned:
            plan_mismatch.append(sequence)
    if plan_mismatch:
        details["plans_disagree"] = sorted(set(plan_mismatch))[:10]

    trained = Counter(t for sequence in sequences for t in plans.get(sequence, ()))
    lost = sorted({t for history in finals.values() for s in history if s["event"] == "failed"
                   for t in s["planned"]})
    expected = set(acked) - set(lost)
    duplicates = sorted(t for t, n in trained.items() if n > 1)
    never = sorted(expected - set(trained))
    unacked = sorted(set(trained) - set(acked))
    admitted_ids = [t for ids in admitted.values() for t in ids]
    admitted_twice = sorted(t for t, n in Counter(admitted_ids).items() if n > 1)
    details.update(acked=len(acked), trained=sum(trained.values()), lost=len(lost), applied_steps=len(sequences),
                   failed_steps=sorted(failed))
    for name, ids in (("trained_more_than_once", duplicates), ("acked_never_trained", never),
                      ("trained_never_acked", unacked), ("admitted_twice", admitted_twice),
                      ("lost_with_a_unit", lost)):
        if ids:
            details[name] = ids[:10]
    # A mini-batch is either stepped on by every rank or failed on every rank (they skip it together).
    applied_and_failed = sorted(failed & set(sequences))
    if applied_and_failed:
        details["applied_and_failed"] = applied_and_failed
    once = orders_ok and agree and not plan_mismatch and not duplicates and not never and not unacked \
        and not admitted_twice and not applied_and_failed

    # No partial step: per applied step, every per-token unit of every planned trajectory rebuilt from the pieces
    # all ranks received in that step hashes to what the rollout wrote.
    received: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    trained_fields = set()
    for rank_steps in steps.values():
        for s in rank_steps:
            for piece in s["pieces"]:
                received[s["sequence"]][piece["key"]].append(piece)
                trained_fields.add(piece["field"])
    partial = []
    units_checked = 0
    for sequence in sequences:
        for trajectory in plans.get(sequence, ()):
            for key, unit in acked.get(trajectory, {}).get("units", {}).items():
                if unit["field"] not in trained_fields:
                    continue
                units_checked += 1
                if reassemble(received[sequence].get(key, [])) != unit["hash"]:
                    partial.append({"sequence": sequence, "trajectory": trajectory, "unit": key})
    details["units_checked"] = units_checked
    if partial:
        details["partial_steps"] = partial[:10]
    no_partial = not partial and units_checked > 0

    # Quotas: each train batch's mini-batches (applied, or failed with a lost unit: admitted all the same) hold
    # exactly its quota of every source.
    by_batch: dict[int, Counter] = defaultdict(Counter)
    for sequence in sorted(set(sequences) | failed):
        for trajectory in plans.get(sequence, ()):
            by_batch[batch_of[sequence]][acked.get(trajectory, {}).get("source", "?")] += 1
    short = {b: dict(c) for b, c in sorted(by_batch.items()) if any(c.get(s, 0) != q for s, q in quotas.items())}
    if short:
        details["quota_violations"] = short
    quotas_held = not short and bool(by_batch)

    finished = job_finished and all(len(history) == num_steps for history in finals.values()) and bool(finals)
    if not finished:
        details["steps_by_rank"] = {rank: len(history) for rank, history in finals.items()}
        # Every event each rank logged, restores included: what a reader of a failed run needs to see which
        # mini-batch a rank is missing and after which restart.
        details["events_by_rank"] = {rank: [f"{e['event']} {e.get('sequence')}" for e in events]
                                     for rank, events in histories.items()}
    left = leftovers.processes or leftovers.segments or leftovers.store_units
    if left:
        details["left_behind"] = {"processes": list(leftovers.processes)[:10],
                                  "segments": list(leftovers.segments)[:10], "store_units": leftovers.store_units}
    return ChaosVerdict(trained_exactly_once=once, no_partial_step=no_partial, quotas_held=quotas_held,
                        finished=finished, nothing_left_behind=not left, details=details)
