"""The rollout side's record of acknowledged trajectories, for the chaos run's oracle.

:class:`AckRecordingClient` stands between a rollout worker's reporter and its admission client: when a report
returns, it appends every trajectory the service acknowledged (accepted, or a duplicate of one it already holds)
to the worker's ``acked-<worker>.jsonl``, with its source and the content hash of each unit the worker wrote. A
restarted worker reads the file back and submits only what was never acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from knittrans.client.admission import AdmissionClient, ReportOutcome
from knittrans.client.model import ReportResult
from knittrans.demo.chaos.oracle import read_events
from knittrans.types import TrajectoryMeta


def ack_line(meta: TrajectoryMeta, outcome: ReportOutcome) -> dict[str, Any]:
    return {
        "trajectory": meta.trajectory_id,
        "source": meta.source,
        "outcome": outcome.value,
        "units": {u.key: {"field": u.field_name, "hash": u.header.content_hash} for u in meta.units},
        "multimodal": {m.key: m.header.content_hash for m in meta.multimodal if m.header is not None},
    }


def read_acked(paths: Sequence[Path]) -> dict[str, dict]:
    """trajectory id -> its last acknowledgement, over the given logs (missing ones are empty)."""
    acked: dict[str, dict] = {}
    for path in paths:
        if path.exists():
            for event in read_events(path.read_text().splitlines()):
                acked[event["trajectory"]] = event
    return acked


class AckRecordingClient:
    """An :class:`AdmissionClient` whose acknowledged reports are logged (everything else passes through)."""

    def __init__(self, client: AdmissionClient, log: Path) -> None:
        self._client = client
        self._log = open(log, "a")

    def report(self, trajectories: Sequence[TrajectoryMeta], **kwargs: Any) -> list[ReportResult]:
        results = self._client.report(trajectories, **kwargs)
        for meta, result in zip(trajectories, results, strict=True):
            if result.outcome in (ReportOutcome.ACCEPTED, ReportOutcome.DUPLICATE):
                self._log.write(json.dumps(ack_line(meta, result.outcome)) + "\n")
            elif result.outcome is ReportOutcome.CONFLICT:
                # A predecessor's submit of this id was acknowledged before it could log it, with content this
                # worker cannot reproduce: acknowledged, its bytes unknown here (the oracle checks no hashes).
                line = {**ack_line(meta, result.outcome), "units": {}, "multimodal": {}}
                self._log.write(json.dumps(line) + "\n")
        self._log.flush()
        return results

    def close(self) -> None:
        self._log.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
