"""The admission replay trace: JSON Lines, one trajectory per line.

``{"id": "t17", "sample_id": "s3", "source": "A", "start": 12.0, "end": 845.5, "num_tokens": 18234,
"rollout_step": 0, "accepted": true, "version": 0}``

``start`` and ``end`` are seconds; ``end: null`` marks a trajectory that was scheduled but never finished.
``rollout_step`` (default 0), ``accepted`` (default true) and ``version`` (default: derived on the replay's
own timeline) are optional; unknown keys are ignored. Every error names the line and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from knittrans.errors import TraceFormatError
from knittrans.types import SampleId, SourceName, TrajectoryId, check_id

_REQUIRED = ("id", "sample_id", "source", "start", "end", "num_tokens")


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceRecord:
    """One line of a trace. ``version`` None means: derive it from the replay's timeline."""

    line: int
    trajectory_id: TrajectoryId
    sample_id: SampleId
    source: SourceName
    start: float
    end: float | None
    num_tokens: int
    rollout_step: int = 0
    accepted: bool = True
    version: int | None = None

    @property
    def finished(self) -> bool:
        return self.end is not None


@dataclass(frozen=True, kw_only=True)
class Trace:
    """A parsed trace with the orderings the replay needs, computed once for every policy."""

    records: tuple[TraceRecord, ...]
    arrival_order: tuple[int, ...]  # finished records by (end, line)
    schedule_order: tuple[int, ...]  # all records by (start, line)
    index_of: Mapping[TrajectoryId, int]
    sample_sizes: Mapping[SampleId, int]
    sources: tuple[SourceName, ...]  # in order of first appearance

    @property
    def rollout_start(self) -> float:
        return min((r.start for r in self.records), default=0.0)

    @property
    def num_finished(self) -> int:
        return len(self.arrival_order)

    @classmethod
    def from_records(cls, records: Iterable[TraceRecord]) -> Trace:
        records = tuple(records)
        index_of: dict[TrajectoryId, int] = {}
        sample_sizes: dict[SampleId, int] = {}
        sample_source: dict[SampleId, SourceName] = {}
        sources: dict[SourceName, None] = {}
        for index, record in enumerate(records):
            if record.trajectory_id in index_of:
                first = records[index_of[record.trajectory_id]].line
                raise TraceFormatError(
                    f"duplicate id {record.trajectory_id!r} (first on line {first})", field=_where(record.line, "id")
                )
            index_of[record.trajectory_id] = index
            source = sample_source.setdefault(record.sample_id, record.source)
            if source != record.source:
                raise TraceFormatError(
                    f"sample {record.sample_id!r} has trajectories from sources {source!r} and {record.source!r}",
                    field=_where(record.line, "source"),
                )
            sample_sizes[record.sample_id] = sample_sizes.get(record.sample_id, 0) + 1
            sources.setdefault(record.source, None)
        finished = [i for i, r in enumerate(records) if r.end is not None]
        finished.sort(key=lambda i: (records[i].end, records[i].line))
        scheduled = sorted(range(len(records)), key=lambda i: (records[i].start, records[i].line))
        return cls(
            records=records,
            arrival_order=tuple(finished),
            schedule_order=tuple(scheduled),
            index_of=index_of,
            sample_sizes=sample_sizes,
            sources=tuple(sources),
        )

    def check_sources(self, known: Iterable[str]) -> None:
        """Every record's source must be configured; the error names the first line that is not."""
        known_set = set(known)
        for record in self.records:
            if record.source not in known_set:
                raise TraceFormatError(
                    f"source {record.source!r} is not in the config's sources ({', '.join(sorted(known_set))})",
                    field=_where(record.line, "source"),
                )


def _where(line: int, field: str) -> str:
    return f"line {line}, field {field!r}"


def _number(value: object, line: int, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceFormatError(f"must be a finite number of seconds, got {value!r}", field=_where(line, field))
    return float(value)


def _count(value: object, line: int, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceFormatError(f"must be an integer of at least {minimum}, got {value!r}", field=_where(line, field))
    return value


def _identifier(value: object, line: int, field: str) -> str:
    if not isinstance(value, str):
        raise TraceFormatError(f"must be a string, got {value!r}", field=_where(line, field))
    try:
        check_id(value, field)
    except ValueError as exc:
        message = getattr(exc, "message", str(exc))
        raise TraceFormatError(message, field=_where(line, field)) from None
    return value


def parse_record(text: str, line: int) -> TraceRecord | None:
    """One line of a trace; None for a blank line."""
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"not valid JSON: {exc.msg} at column {exc.colno}", field=f"line {line}") from None
    if not isinstance(data, dict):
        raise TraceFormatError(f"must be a JSON object, got {type(data).__name__}", field=f"line {line}")
    for field in _REQUIRED:
        if field not in data:
            raise TraceFormatError("is missing", field=_where(line, field))
    start = _number(data["start"], line, "start")
    end_value = data["end"]
    end = None if end_value is None else _number(end_value, line, "end")
    if end is not None and end < start:
        raise TraceFormatError(f"{end} is before start {start}", field=_where(line, "end"))
    accepted = data.get("accepted", True)
    if not isinstance(accepted, bool):
        raise TraceFormatError(f"must be true or false, got {accepted!r}", field=_where(line, "accepted"))
    version = data.get("version")
    return TraceRecord(
        line=line,
        trajectory_id=TrajectoryId(_identifier(data["id"], line, "id")),
        sample_id=SampleId(_identifier(data["sample_id"], line, "sample_id")),
        source=SourceName(_identifier(data["source"], line, "source")),
        start=start,
        end=end,
        num_tokens=_count(data["num_tokens"], line, "num_tokens", 0),
        rollout_step=_count(data.get("rollout_step", 0), line, "rollout_step", 0),
        accepted=accepted,
        version=None if version is None else _count(version, line, "version", 0),
    )


def parse_lines(lines: Iterable[str]) -> Trace:
    records = []
    for line_number, text in enumerate(lines, start=1):
        record = parse_record(text, line_number)
        if record is not None:
            records.append(record)
    return Trace.from_records(records)


def read_trace(path: str | Path) -> Trace:
    try:
        with Path(path).open(encoding="utf-8") as handle:
            return parse_lines(handle)
    except OSError as exc:
        raise TraceFormatError(f"cannot read the trace: {exc.strerror}", field=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"not UTF-8 text: {exc.reason}", field=str(path)) from exc
