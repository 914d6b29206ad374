"""The README's `knittrans demo --roles reference,actor`, shortened and otherwise verbatim: a frozen reference role
attaches ``ref_logprobs``, the actor trains with a KL term against them, and the demo's own checks
(reference_fields_match among them) pass.

Beyond the demo's checks, this test recomputes what the actor received from outside: for every trained
trajectory it reassembles the ``input_ids`` and the ``ref_logprobs`` the actor's CP ranks recorded, runs the
initial policy (a fresh :func:`initial_model`, one unpacked sequence, no image: a role gets the text alone) and
compares the label log-probs with what arrived.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from knittrans.demo.model import initial_model
from knittrans.demo.stack.report import check_reference, read_jsonl
from tests.e2e.demo_runs import ROLES_DEMOS, check_demo_run, run_readme_demo


def reassembled(pieces: list[dict], dtype: type) -> np.ndarray:
    ordered = sorted(pieces, key=lambda p: p["start"])
    assert [p["start"] for p in ordered[1:]] == [p["end"] for p in ordered[:-1]]  # contiguous chunks
    return np.frombuffer(b"".join(base64.b64decode(p["bytes"]) for p in ordered), dtype=dtype)


def initial_policy_label_logprobs(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
    """The naive computation: one sequence alone, causal attention, log p(token t+1) at t, 0 at the last."""
    ids = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        logits = model.backbone(ids, position_ids=torch.arange(len(ids)), segment_ids=torch.zeros(len(ids)))
    logprobs = torch.log_softmax(logits.double(), dim=-1)[torch.arange(len(ids) - 1), ids[1:]]
    return np.append(logprobs.numpy(), 0.0)


@pytest.mark.parametrize("command", ROLES_DEMOS)
def test_demo_with_a_reference_role(tmp_path: Path, command: str) -> None:
    out = tmp_path / "demo-out"
    result = run_readme_demo(command, tmp_path)
    report = check_demo_run(result, out)
    assert "reference fields match: yes" in result.stdout
    checks = report["checks"]
    assert checks["reference_fields_match"], checks
    assert checks["details"]["reference_trajectories_checked"] == 64

    pieces = [p for rank in range(4) for p in read_jsonl(out / f"received-rank{rank}.jsonl")]
    by_trajectory: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for piece in pieces:
        by_trajectory[piece["trajectory"]][piece["field"]].append(piece)
    assert len(by_trajectory) == 64
    model = initial_model(0)
    for fields in by_trajectory.values():
        tokens = reassembled(fields["input_ids"], np.int32)
        received = reassembled(fields["ref_logprobs"], np.float32)
        np.testing.assert_allclose(received, initial_policy_label_logprobs(model, tokens), atol=2e-5)
        assert received[-1] == 0.0

    # The check itself notices one attached trajectory whose bytes differ from what the actor received.
    records = [r for rank in range(4) for r in read_jsonl(out / f"steps-rank{rank}.jsonl")]
    attached = read_jsonl(out / "reference-rank0.jsonl")
    initial = json.loads((out / "initial-policy.json").read_text())["digest"]
    admissions = {r["sequence"]: {"trajectory_ids": r["trajectories"]} for r in records if r["rank"] == 0}
    for r in records:
        admissions[r["sequence"]]["trajectory_ids"] = sorted(
            set(admissions[r["sequence"]]["trajectory_ids"]) | set(r["trajectories"]))
    assert check_reference(records, pieces, admissions, attached, initial_policy=initial)[0]
    tampered = [dict(a, hash="0" * 32) if a.get("trajectory") == attached[1]["trajectory"] else a for a in attached]
    assert not check_reference(records, pieces, admissions, tampered, initial_policy=initial)[0]
    assert not check_reference(records, pieces, admissions, [*attached, attached[1]], initial_policy=initial)[0]
