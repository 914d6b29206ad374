"""Bad simulation input gets a clear error naming the key (or the trace line and field)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from knittrans.admission.replay import parse_lines
from knittrans.admission.simulate import LognormalDurations, SimConfig, TraceDurations
from knittrans.cli import main
from knittrans.config import load_config
from knittrans.errors import ConfigError, InvalidArgument, TraceFormatError

VALID: dict[str, Any] = {
    "train_batch_size": 16,
    "num_minibatches": 2,
    "sources": {"A": 0.4, "B": 0.4},
    "group_size": 4,
    "rollout_slots": 8,
    "rollout": {"A": {"mean_seconds": 10, "std_seconds": 2}, "B": {"mean_seconds": 30, "std_seconds": 5}},
    "train_seconds_per_minibatch": 5,
    "train_batches": 6,
}


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """VALID with dotted keys replaced (a value of ... deletes the key)."""
    document = json.loads(json.dumps(VALID))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = document
        for part in parents:
            node = node[part]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return document


def write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def load(tmp_path: Path, **changes: Any) -> SimConfig:
    return load_config(SimConfig, path=write(tmp_path, with_changes(changes)), env={})


def test_valid_config_loads_with_derived_values(tmp_path: Path) -> None:
    config = load(tmp_path)
    assert config.step_prompts == 4  # 16 trajectories in prompts of 4
    assert config.source_mix == (0.5, 0.5)  # in proportion to the minimum shares
    assert config.prompts_per_source_step == (2, 2)
    assert config.warmup == 2
    assert config.step_barrier == 16


@pytest.mark.parametrize(
    ("changes", "key", "words"),
    [
        ({"rollout.A.mean_seconds": 0}, "rollout.A.mean_seconds", "positive"),
        ({"rollout.B.mean_seconds": -30}, "rollout.B.mean_seconds", "positive"),
        ({"rollout.A.std_seconds": -1}, "rollout.A.std_seconds", "non-negative"),
        ({"group_size": 0}, "group_size", "at least 1"),
        ({"rollout_slots": 2}, "rollout_slots", "group of 4"),
        ({"prompts_per_step": 3}, "prompts_per_step", "fewer than one train batch of 16"),
        (
            {"rollout.A.mix": 0.9, "rollout.B.mix": 0.1, "prompts_per_step": 4},
            "rollout.B.mix",
            "quota can never be met",
        ),
        ({"rollout.A.mix": 1.0}, "rollout.B.mix", "every source or for none"),
        ({"rollout.C": {"mean_seconds": 5}}, "rollout.C", "not one of the configured sources"),
        ({"train_seconds_per_token": 0.1}, "train_seconds_per_minibatch", "exactly one"),
        ({"train_seconds_per_minibatch": ...}, "train_seconds_per_token", "exactly one"),
        ({"train_seconds_per_minibatch": 0}, "train_seconds_per_minibatch", "positive"),
        ({"sync_seconds": -1}, "sync_seconds", "non-negative"),
        ({"tokens_per_second": 0}, "tokens_per_second", "positive"),
        ({"warmup_steps": 6}, "warmup_steps", "leaves none"),
        ({"staleness_bound": 9}, "staleness_bound", "leaves none"),
        ({"next_step_after": 1.5}, "next_step_after", "[0, 1]"),
        ({"rollout_ahead": -1}, "rollout_ahead", "at least 0"),
        ({"train_batches": 0}, "train_batches", "at least 1"),
        ({"rollout_slot": 8}, "rollout_slot", "unknown key"),
        ({"rollout.A.mean": 8}, "rollout.A.mean", "unknown key"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, changes: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, **changes)
    assert info.value.field == key
    assert words in str(info.value)


def test_a_source_without_a_duration_needs_one_unless_a_trace_supplies_it(tmp_path: Path) -> None:
    config = load(tmp_path, **{"rollout.B": ...})
    with pytest.raises(ConfigError) as info:
        LognormalDurations(config)
    assert info.value.field == "rollout.B.mean_seconds"
    trace = parse_lines([
        json.dumps({"id": "a1", "sample_id": "s1", "source": "A", "start": 0, "end": 5, "num_tokens": 50}),
        json.dumps({"id": "b1", "sample_id": "s2", "source": "B", "start": 0, "end": 40, "num_tokens": 400}),
    ])
    durations = TraceDurations(trace, config)
    assert durations.draw(1, random.Random(0)) == (40.0, 400)


def trace_line(**fields: Any) -> str:
    record = {"id": "t1", "sample_id": "s1", "source": "A", "start": 0.0, "end": 10.0, "num_tokens": 100}
    record.update(fields)
    return json.dumps(record)


@pytest.mark.parametrize(
    ("second_line", "field", "words"),
    [
        (trace_line(id="t2", sample_id="s2", source="Z"), "line 2, field 'source'", "not in the config's sources"),
        (trace_line(id="t2", sample_id="s2", start=4.0, end=4.0), "line 2, field 'end'", "must be positive"),
    ],
)
def test_bad_trace_names_the_line_and_field(tmp_path: Path, second_line: str, field: str, words: str) -> None:
    config = load(tmp_path)
    trace = parse_lines([trace_line(), second_line, trace_line(id="t3", sample_id="s3", source="B")])
    with pytest.raises(TraceFormatError) as info:
        TraceDurations(trace, config)
    assert info.value.field == field
    assert words in str(info.value)


def test_a_trace_without_a_source_that_must_launch(tmp_path: Path) -> None:
    config = load(tmp_path)
    with pytest.raises(ConfigError) as info:
        TraceDurations(parse_lines([trace_line()]), config)
    assert info.value.field == "rollout.B"


def test_the_sources_own_checks_still_apply(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, sources={"A": 0.7, "B": 0.7})
    assert info.value.field == "sources"
    assert isinstance(info.value, InvalidArgument)


@pytest.mark.parametrize(
    ("changes", "trace", "expected"),
    [
        ({"rollout.A.mean_seconds": 0}, None, "rollout.A.mean_seconds: must be positive"),
        ({"group_size": 0}, None, "group_size: must be an integer of at least 1"),
        ({"prompts_per_step": 2}, None, "prompts_per_step:"),
        ({}, [trace_line(source="X")], "line 1, field 'source'"),
    ],
)
def test_cli_reports_bad_input_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], trace: list[str] | None,
    expected: str,
) -> None:
    arguments = ["simulate", "--config", str(write(tmp_path, with_changes(changes))), "--progress", "never"]
    if trace is not None:
        trace_path = tmp_path / "trace.jsonl"
        trace_path.write_text("\n".join(trace) + "\n")
        arguments += ["--trace", str(trace_path)]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("knittrans: error:")
    assert expected in error
