"""``knittrans plan`` end to end, in process, on the example files and on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knittrans.cli import main
from knittrans.plan.json import plan_from_json, plan_to_json

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "plan"


def test_plan_command_writes_a_valid_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--batch",
            str(EXAMPLES / "batch.jsonl"),
            "--topology",
            str(EXAMPLES / "topology.yaml"),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    summary = capsys.readouterr().out
    assert "micro-batches per rank" in summary and "dedup" in summary
    plan = plan_from_json(out.read_text())
    assert plan.num_trajectories == len((EXAMPLES / "batch.jsonl").read_text().splitlines())
    assert plan.quality.dedup_factor > 1


def test_plan_command_prints_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--batch",
            str(EXAMPLES / "text-only.jsonl"),
            "--topology",
            str(EXAMPLES / "topology.yaml"),
            "--json",
            "-",
            "--label-field",
            "input_ids",
            "--balance-target",
            "1.2",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    plan = plan_from_json(captured.out)
    assert plan.quality.references == 0
    assert "micro-batches per rank" in captured.err


def test_bad_batch_line_names_the_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"trajectory_id": "a", "num_tokens": 10}\n\n{"trajectory_id": "b", "num_tokens": -3}\n')
    code = main(["plan", "--batch", str(batch), "--topology", str(EXAMPLES / "topology.yaml")])
    assert code == 2
    assert "batch.jsonl:3.num_tokens" in capsys.readouterr().err


def test_bad_topology_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = tmp_path / "topo.yaml"
    topology.write_text("backbone:\n  dp: 0\n  max_tokens_per_microbatch: 100\n")
    code = main(["plan", "--batch", str(EXAMPLES / "text-only.jsonl"), "--topology", str(topology)])
    assert code == 2
    assert "backbone.dp" in capsys.readouterr().err
    topology.write_text("backbone:\n  dp: 2\n  max_tokens_per_microbatch: 100\n  budget: 3\n")
    assert main(["plan", "--batch", str(EXAMPLES / "text-only.jsonl"), "--topology", str(topology)]) == 2
    assert "backbone.budget" in capsys.readouterr().err


def test_batch_lines_round_trip_through_the_plan_json() -> None:
    lines = [json.loads(line) for line in (EXAMPLES / "batch.jsonl").read_text().splitlines()]
    plan_json = json.loads(plan_to_json(plan_from_json(_plan_json())))
    for line, stored in zip(lines, plan_json["trajectories"], strict=True):
        for key, value in line.items():
            if key not in ("units", "multimodal"):
                assert stored[key] == value


def _plan_json() -> str:
    from knittrans.admission.planning import plan_minibatch
    from knittrans.admission.planning.cli import read_batch
    from knittrans.config import load_config
    from knittrans.types import Topology

    topology = load_config(Topology, path=EXAMPLES / "topology.yaml", env={})
    return plan_to_json(plan_minibatch(read_batch(EXAMPLES / "batch.jsonl"), topology))


def _leaf_paths(value: object, path: str) -> list[str]:
    """Every scalar or list-of-scalars position in a JSON value, as the field paths errors use."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _leaf_paths(item, f"{path}.{key}" if path else key)]
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        return [p for i, item in enumerate(value) for p in _leaf_paths(item, f"{path}[{i}]")]
    return [path]


def _set(document: dict, path: str, value: object) -> None:
    steps = [int(s) if s.isdigit() else s for s in path.replace("[", ".").replace("]", "").split(".")]
    target: object = document
    for step in steps[:-1]:
        target = target[step]  # type: ignore[index]
    target[steps[-1]] = value  # type: ignore[index]


_LINE = json.loads((EXAMPLES / "batch.jsonl").read_text().splitlines()[0])
# Every field the line has, and the optional ones it leaves out.
_OPTIONAL = ["accepted", "finished_at", "units[0].header.chunk_tokens", "multimodal[0].header.seq_axis",
             "multimodal[0].header.chunk_tokens", "multimodal[0].header.byte_length"]
_WRONG_TYPE_PATHS = sorted(set(_leaf_paths(_LINE, "")) | set(_OPTIONAL))


def test_the_wrong_type_paths_cover_the_fields_named_in_the_issue() -> None:
    named = {"accepted", "sample_id", "source", "rollout_step", "num_loss_tokens", "finished_at", "units[0].key",
             "segments[0].version", "segments[0].num_tokens", "multimodal[0].key", "multimodal[0].encoder",
             "multimodal[0].cost", "multimodal[0].placeholder", "multimodal[0].kind"}
    assert named <= set(_WRONG_TYPE_PATHS)


@pytest.mark.parametrize("path", _WRONG_TYPE_PATHS)
def test_a_wrong_type_is_named_once_with_its_line(
    path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = json.loads(json.dumps(_LINE))
    _set(line, path, {"not": "this type"})  # an object fits no scalar or list field
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps(line) + "\n")
    assert main(["plan", "--batch", str(batch), "--topology", str(EXAMPLES / "topology.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"knittrans: error: batch.jsonl:1.{path}: expected " in err
    assert err.count("batch.jsonl:1") == 1, err


def _disagreeing_cost(line: dict) -> dict:
    line["multimodal"][0]["cost"] = 1.0
    return line


def _unknown_encoder(line: dict) -> dict:
    line["multimodal"][0]["encoder"] = "audio"
    return line


def _same_id(line: dict) -> dict:
    line["trajectory_id"] = _LINE["trajectory_id"]
    return line


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_same_id, "batch.jsonl:4.trajectory_id: id 't000' already appears at batch.jsonl:1"),
        (_disagreeing_cost, "batch.jsonl:4.multimodal[0].cost: cost 1.0 differs from 4096.0 of the same unit at "
                            "batch.jsonl:1.multimodal[0]"),
        (_unknown_encoder, "batch.jsonl:4.multimodal[0].encoder: unknown encoder 'audio'"),
    ],
)
def test_errors_found_across_lines_name_the_lines(
    change, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines 1, 2 and 4 (line 3 is blank): the planner's 0-based positions become the file's 1-based lines."""
    example = (EXAMPLES / "batch.jsonl").read_text().splitlines()
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join([example[0], example[2], "", json.dumps(change(json.loads(example[1])))]) + "\n")
    assert main(["plan", "--batch", str(batch), "--topology", str(EXAMPLES / "topology.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"knittrans: error: {expected}" in err
    assert "trajectories[" not in err
