"""``ReportCheckpoint``: the trainer saved a checkpoint holding every step up to the named one (DESIGN.md §9).

Journaled like every change; applying it may release mini-batches that retention held for it
(:mod:`.retention`). A checkpoint at or before the latest one is answered without a record.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from knittrans.admission.service.journaled import JournaledCommits
from knittrans.admission.service.ledger import AdmissionLedger, Applied
from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.types import MAX_ID_LENGTH
from knittrans.v1 import admission_service_pb2 as pb
from knittrans.v1 import journal_pb2

logger = logging.getLogger(__name__)


def check_checkpoint(request: pb.ReportCheckpointRequest, ledger: AdmissionLedger) -> None:
    """A checkpoint can only hold steps of mini-batches that were admitted."""
    if len(request.request_id) > MAX_ID_LENGTH:
        raise InvalidArgument(f"longer than {MAX_ID_LENGTH} characters", field="request_id")
    per_batch = ledger.settings.engine.num_minibatches
    if request.minibatch_index >= per_batch:
        raise InvalidArgument(f"must be below num_minibatches ({per_batch})", field="minibatch_index")
    step = (request.train_batch_index, request.minibatch_index)
    admitted = [m.step for m in ledger.minibatches.values()]
    last = max(admitted, default=None)
    if ledger.next_sequence == 1 or (last is not None and step > last):
        raise FailedPrecondition(f"step {step} was not admitted yet (last admitted: {last})",
                                 field="train_batch_index")


def check_streamable(ledger: AdmissionLedger, after: int) -> None:
    """A stream from ``after`` must start at a mini-batch that is still held: one released since (its units are
    deleted) cannot be delivered again, and skipping it would be a silent gap."""
    following = after + 1
    if following >= ledger.next_sequence:
        return
    minibatch = ledger.minibatches.get(following)
    if minibatch is None or minibatch.released:
        raise FailedPrecondition(f"mini-batch {following} was released: its units are gone (retain mini-batches for "
                                 "restored jobs with retain_until_checkpoint or retain_steps)", field="after_sequence")


async def report_checkpoint(
    request: pb.ReportCheckpointRequest,
    *,
    ledger: AdmissionLedger,
    commits: JournaledCommits,
    commit: Callable[[journal_pb2.JournalRecord], Awaitable[Applied]],
    clock: Callable[[], float],
) -> pb.ReportCheckpointResponse:
    check_checkpoint(request, ledger)
    step = (request.train_batch_index, request.minibatch_index)
    released = 0
    async with commits.mutating():
        if ledger.checkpoint is None or step > ledger.checkpoint:
            applied = await commit(journal_pb2.JournalRecord(at=clock(), checkpoint=request))
            released = applied.released_count
            logger.info("checkpoint at train batch %d, mini-batch %d: %d mini-batches released", *step, released)
        latest = ledger.checkpoint or step
    return pb.ReportCheckpointResponse(released_minibatches=released, checkpoint_train_batch_index=latest[0],
                                       checkpoint_minibatch_index=latest[1])
