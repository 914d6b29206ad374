"""``knittrans simulate`` end to end: table, JSON, plot, trace-driven durations and progress bars."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knittrans.cli import main

ROOT = Path(__file__).resolve().parents[3]
SKEWED = ROOT / "examples" / "sim" / "skewed-4src.yaml"
TRACE = ROOT / "examples" / "traces" / "skewed-4src.jsonl"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_json_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_png = tmp_path / "out" / "sim.json", tmp_path / "out" / "sim.png"
    code = main([
        "simulate", "--config", str(SKEWED), "--policy", "linear", "--policy", "knittrans", "--train-batches", "8",
        "--json", str(out_json), "--plot", str(out_png), "--progress", "never",
    ])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "simulated 8 train batches of 256 trajectories in 4 mini-batches" in stdout
    assert "architectural" in stdout and "knittrans vs linear: architectural staleness" in stdout
    document = json.loads(out_json.read_text())
    assert document["train_batches"] == 8 and document["warmup_steps"] == 2
    assert list(document["policies"]) == ["linear", "knittrans"]
    for policy in document["policies"].values():
        assert isinstance(policy["architectural_staleness"], float)
        for mode in ("disaggregated", "colocated"):
            result = policy[mode]
            assert len(result["per_step_staleness"]) == 8
            assert len(result["admission_times"]) == 8 and all(len(t) == 4 for t in result["admission_times"])
            assert result["violations"] == 0 and result["dropped_stale"] == 0
            assert isinstance(result["mean_staleness"], float)
        measured = [d - c for d, c in zip(policy["disaggregated"]["per_step_staleness"],
                                          policy["colocated"]["per_step_staleness"], strict=True)][2:]
        assert policy["architectural_staleness"] == pytest.approx(sum(measured) / len(measured), abs=1e-5)
    reduction = document["architectural_staleness_reduction"]["knittrans"]["linear"]
    assert reduction is not None and reduction > 0
    assert out_png.read_bytes()[:8] == PNG_SIGNATURE


def test_all_policies_with_durations_from_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "sim.json"
    code = main([
        "simulate", "--config", str(SKEWED), "--policy", "all", "--trace", str(TRACE), "--train-batches", "6",
        "--json", str(out_json), "--progress", "always",
    ])
    assert code == 0
    captured = capsys.readouterr()
    assert "trajectories" in captured.err and "knittrans disagg" in captured.err  # the progress bars
    document = json.loads(out_json.read_text())
    assert document["trace"] == str(TRACE)
    assert list(document["policies"]) == ["train-batch", "linear", "stream", "no-guard", "knittrans"]
    for name in ("train-batch", "linear", "knittrans"):
        assert document["policies"][name]["disaggregated"]["violations"] == 0


def test_config_flags_override_the_file(tmp_path: Path) -> None:
    out_json = tmp_path / "sim.json"
    assert main([
        "simulate", "--config", str(SKEWED), "--train-batches", "4", "--seed", "3", "--json", str(out_json),
        "--progress", "never",
    ]) == 0
    document = json.loads(out_json.read_text())
    assert document["seed"] == 3 and document["train_batches"] == 4
    assert list(document["policies"]) == ["knittrans"]  # the config's policy


def test_unknown_policy_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--config", str(SKEWED), "--policy", "fastest"]) == 2
    assert "policy" in capsys.readouterr().err
