"""``knittrans plan`` end to end, in process, on the example files and on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knittrans.cli import main
from knittrans.plan import Plan

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
    plan = Plan.from_json(out.read_text())
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
    plan = Plan.from_json(captured.out)
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
    plan_json = json.loads(Plan.from_json(_plan_json()).to_json())
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
    return plan_minibatch(read_batch(EXAMPLES / "batch.jsonl"), topology).to_json()
