"""Which mini-batches every TP rank is done with (:class:`DeliveryTracker`), and where each TP rank of a
consumer stands (:class:`RankProgress`), so that a rank that restarts mid-mini-batch never gets a suffix
(DESIGN.md §9: the mini-batch is the unit of delivery).

A TP rank's trainer process calls the sidecar with a session id fixed for its life. A call from a new session
of a rank is a restart of that rank. If at that moment some TP rank of the consumer is *partway* through a
mini-batch (it released some of its micro-batches, not the last), the sidecar starts a new *delivery round*:
it withdraws what it published from the oldest mini-batch not yet released by every TP rank on, and publishes
it all again from micro-batch 0. Every rank gets again the mini-batch it was in, from its start (a live rank's
client raises :class:`~knittrans.errors.MiniBatchRestarted` so its loop drops the partial gradient); a rank
never gets again a mini-batch whose micro-batches it released to the last (it stepped on it).

Why every TP rank and not only the restarted one: the TP ranks of a consumer compute one model's step together
(their collectives pair micro-batch for micro-batch), so a restarted rank at micro-batch 0 and a live rank at
micro-batch 2 cannot go on as one step.

Pure bookkeeping; the sidecar calls it on its event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from knittrans.errors import InvalidArgument

# The restore point of a job restarted without a checkpoint: the step before train batch 0's mini-batch 0, so
# that a restore delivers again from sequence 1.
BEFORE_FIRST_STEP_INDICES = (0, -1)


class RankProgress:
    """Per TP rank: the last sequence it released to the last micro-batch, and whether it is partway through
    the next one; and the session each rank last called from."""

    def __init__(self) -> None:
        self._done_through: dict[int, int] = {}
        self._partway: set[int] = set()
        self._sessions: dict[int, str] = {}
        self._restore_step: tuple[int, int] | None = None
        self._restore_members: dict[int, str] = {}  # TP rank -> the session that joined the current restore

    @property
    def partway(self) -> frozenset[int]:
        """TP ranks that released some, not all, micro-batches of their current mini-batch."""
        return frozenset(self._partway)

    def released(self, tp_rank: int, sequence: int, last_in_minibatch: bool) -> None:
        """``tp_rank`` released a live micro-batch of ``sequence``."""
        if last_in_minibatch:
            self._done_through[tp_rank] = max(self._done_through.get(tp_rank, 0), sequence)
            self._partway.discard(tp_rank)
        else:
            self._partway.add(tp_rank)

    def called_from(self, tp_rank: int, session: str) -> bool:
        """``tp_rank`` calls from ``session``; True when that is a restart of the rank (it called from another
        session before). An empty session (an old client) is never a restart."""
        if not session:
            return False
        previous = self._sessions.get(tp_rank)
        self._sessions[tp_rank] = session
        return previous is not None and previous != session

    def restores(self, tp_rank: int, session: str, step: tuple[int, int]) -> bool:
        """A trainer process of ``tp_rank`` restored from a checkpoint holding ``step``. True when it starts a new
        restore (the sidecar delivers again everything after the step); False when it joins the restore another
        TP rank of its job started (the same step, and no other process of this rank joined it before)."""
        self.called_from(tp_rank, session)
        if self._restore_step == step and self._restore_members.get(tp_rank, session) == session:
            self._restore_members[tp_rank] = session
            return False
        self._restore_step, self._restore_members = step, {tp_rank: session}
        self._done_through.clear()
        self._partway.clear()
        return True

    def rewind(self, sequences: Iterable[int]) -> dict[int, frozenset[int]]:
        """A new round re-delivers ``sequences``: for each, the TP ranks that already had all of it (they skip
        it). Nobody is partway any more: every rank starts its mini-batch again."""
        self._partway.clear()
        return {s: frozenset(r for r, done in self._done_through.items() if done >= s) for s in sequences}


class DeliveryTracker:
    """Which assignment sequences are fully consumed, acknowledged strictly in order."""

    def __init__(self) -> None:
        self._outstanding: OrderedDict[int, int] = OrderedDict()
        self._last = 0

    def expect(self, sequence: int, microbatches: int) -> list[int]:
        if sequence <= self._last:
            raise InvalidArgument(f"sequence {sequence} is not after {self._last}", field="sequence")
        self._last = sequence
        self._outstanding[sequence] = microbatches
        return self._ready()

    def cut_short(self, sequence: int, dropped: int) -> list[int]:
        """``dropped`` micro-batches of ``sequence`` will never be published (its mini-batch failed)."""
        if sequence in self._outstanding:
            self._outstanding[sequence] -= dropped
        return self._ready()

    def rewind(self, sequence: int) -> None:
        """Forget ``sequence`` and everything after it: they are delivered again (a new delivery round)."""
        for outstanding in [s for s in self._outstanding if s >= sequence]:
            del self._outstanding[outstanding]
        self._last = min(self._last, sequence - 1)

    def released(self, sequence: int) -> list[int]:
        """One micro-batch of ``sequence`` was released by every TP rank; returns the sequences now complete."""
        if sequence not in self._outstanding:
            return []
        self._outstanding[sequence] -= 1
        return self._ready()

    def _ready(self) -> list[int]:
        done = []
        while self._outstanding:
            sequence, remaining = next(iter(self._outstanding.items()))
            if remaining > 0:
                break
            self._outstanding.popitem(last=False)
            done.append(sequence)
        return done
