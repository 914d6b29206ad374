"""A warning for each mini-batch whose optimizer step some consumers finished and others never did.

The service releases a mini-batch's units only once every planned consumer reported its optimizer step. A rank
that never finishes its step (it waits for a micro-batch that never comes, or hangs anywhere else) therefore
holds the mini-batch for ever, and nothing fails: the training job just stops making progress. The metric
``knittrans_admission_unfinished_step_seconds`` says how long the oldest such mini-batch has waited; this logs,
once per mini-batch, which consumers owe their step, so that whoever reads the log knows whose stacks to dump.
"""

from __future__ import annotations

import logging

from knittrans.admission.service.ledger import AdmissionLedger

logger = logging.getLogger(__name__)

DEFAULT_UNFINISHED_STEP_WARNING = 300.0


class UnfinishedStepWarnings:
    def __init__(self, after_seconds: float) -> None:
        self._after_seconds = after_seconds
        self._warned: set[int] = set()  # sequences already warned of

    def check(self, ledger: AdmissionLedger, *, now: float) -> None:
        unfinished = ledger.unfinished_steps()
        self._warned.intersection_update(m.sequence for m in unfinished)
        for minibatch in unfinished:
            assert minibatch.first_step_at is not None
            waited = now - minibatch.first_step_at
            if waited < self._after_seconds or minibatch.sequence in self._warned:
                continue
            self._warned.add(minibatch.sequence)
            owed = sorted(str(consumer) for consumer in minibatch.owed_steps)
            logger.warning(
                "mini-batch %d (train batch %d, mini-batch %d): %d consumers have not reported its optimizer step "
                "%.0f s after the first did: %s%s (`kill -USR1` on a sidecar logs its threads' stacks)",
                minibatch.sequence, minibatch.admission.train_batch_index,
                minibatch.admission.minibatch_index, len(owed), waited, ", ".join(owed[:8]),
                f" and {len(owed) - 8} more" if len(owed) > 8 else "")
