"""examples/roles/ (docs/roles.md, "Examples"): GRPO with a KL term and PPO with a critic, run exactly as the docs'
```bash blocks say, from a fresh copy of examples/, through the real stack (the admission service with the
example's config, one reorg sidecar per consumer of every role, a file store under /dev/shm).

The oracle is independent of the scripts' arithmetic: what the rollout submitted (its ``--record``) and a naive
per-token recomputation with the seed-built models (one token at a time, float64): the reference log-probs, the
group-normalised advantages, the k3 KL, the critic's first values and GAE by its closed form. Each actor must
have trained every submitted trajectory exactly once, and the store must hold no unit after the last step.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.doc_blocks import ROOT, bash_blocks

ROLES = ROOT / "docs" / "roles.md"
STORES = [Path("/dev/shm/knittrans-grpo-example"), Path("/dev/shm/knittrans-ppo-example")]  # named in the configs


def load_common():
    spec = importlib.util.spec_from_file_location("roles_example_common", ROOT / "examples" / "roles" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@torch.no_grad()
def naive_next_logprob(policy, previous: int, token: int) -> float:
    """log p(token | previous) of the bigram policy, by hand in float64."""
    hidden = torch.tanh(policy.embedding.weight[previous].double())
    logits = policy.head.weight.double() @ hidden + policy.head.bias.double()
    return float(logits[token] - torch.logsumexp(logits, dim=0))


@torch.no_grad()
def naive_value(critic, previous: int) -> float:
    hidden = torch.tanh(critic.embedding.weight[previous].double())
    return float(critic.head.weight.double()[0] @ hidden + critic.head.bias.double()[0])


def naive_gae(values: list[float], reward: float, gamma: float = 1.0, lam: float = 0.95) -> list[float]:
    """A_j = sum_k (gamma lam)^k delta_{j+k}, delta_j = r_j + gamma V_{j+1} - V_j (reward on the last token)."""
    n = len(values)
    deltas = [(reward if j == n - 1 else 0.0) + gamma * (values[j + 1] if j + 1 < n else 0.0) - values[j]
              for j in range(n)]
    return [sum((gamma * lam) ** k * deltas[j + k] for k in range(n - j)) for j in range(n)]


@pytest.fixture
def example_paths() -> Iterator[None]:
    """The examples' stores and sockets are global paths (/dev/shm, /tmp): one run at a time on this machine."""
    with open("/tmp/knittrans-role-examples-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for store in STORES:
            shutil.rmtree(store, ignore_errors=True)  # what an earlier, killed run may have left
        try:
            yield
        finally:
            for store in STORES:
                shutil.rmtree(store, ignore_errors=True)


def run_block(block: str, tmp_path: Path) -> tuple[Path, str]:
    """One docs block, verbatim, in one bash session in a directory holding a copy of examples/."""
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "examples", work / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout_path, "w") as stdout_file, open(stderr_path, "w") as stderr_file:
        shell = subprocess.Popen(["bash", "-c", "set -e\n" + block], cwd=work, env=env, stdout=stdout_file,
                                 stderr=stderr_file, text=True, start_new_session=True)
    try:
        shell.wait(timeout=240)  # hang guard only
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:
            os.killpg(shell.pid, signal.SIGKILL)  # whatever a failed block left running
        except ProcessLookupError:
            pass
    stdout, stderr = stdout_path.read_text(), stderr_path.read_text()
    assert shell.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return work, stdout


def assert_store_empties(store: Path) -> None:
    deadline = time.monotonic() + 30  # hang guard only: the service deletes released units in the background
    while [p for p in store.rglob("*") if p.is_file()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in store.rglob("*") if p.is_file()] == []


def trained_exactly_once(steps: list[dict], submitted: dict) -> None:
    counts = Counter(t for step in steps for t in step["used"])
    assert sorted(counts) == sorted(submitted) and set(counts.values()) == {1}, counts


def test_the_docs_have_both_role_examples() -> None:
    blocks = bash_blocks(ROLES)
    assert len(blocks) == 2
    assert "examples/roles/grpo.yaml" in blocks[0] and "examples/roles/ppo.yaml" in blocks[1]


def test_the_grpo_example_trains_with_group_advantages_and_the_kl_to_the_reference(
        tmp_path: Path, example_paths: None) -> None:
    work, stdout = run_block(bash_blocks(ROLES)[0], tmp_path)
    assert "admitted 16" in stdout and stdout.count("reference: attached ref_logprobs") == 2
    submitted = json.loads((work / "grpo-rollout.json").read_text())
    steps = json.loads((work / "grpo-actor.json").read_text())
    assert len(submitted) == 16 and len(steps) == 2
    trained_exactly_once(steps, submitted)
    reference = load_common().build_policy()
    groups: dict[str, list[float]] = {}
    for trajectory in submitted.values():
        groups.setdefault(trajectory["uid"], []).append(trajectory["reward"])
    for index, step in enumerate(steps):
        assert Counter(submitted[t]["uid"] for t in step["used"]) == Counter(
            {uid: 4 for uid in {submitted[t]["uid"] for t in step["used"]}})  # whole groups
        for trajectory_id, used in step["used"].items():
            written = submitted[trajectory_id]
            tokens, start = written["input_ids"], written["response_start"]
            assert used["uid"] == written["uid"]
            naive_ref = [naive_next_logprob(reference, tokens[i - 1], tokens[i]) for i in range(start, len(tokens))]
            assert used["ref_logprobs"] == pytest.approx(naive_ref, abs=1e-5)
            rewards = groups[written["uid"]]
            expected = (written["reward"] - statistics.fmean(rewards)) / (statistics.stdev(rewards) + 1e-6)
            assert used["advantage"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
            k3 = [math.exp(r - p) - (r - p) - 1 for p, r in zip(used["logprobs"], naive_ref, strict=True)]
            assert used["kl"] == pytest.approx(k3, abs=1e-5)
            if index == 0:  # the policy is still the reference (and the sampling policy): no KL, ratio 1
                assert used["logprobs"] == pytest.approx(naive_ref, abs=1e-5)
                assert used["logprobs"] == pytest.approx(written["old_logprobs"], abs=1e-5)
                assert max(used["kl"]) < 1e-5
    assert max(max(u["kl"]) for u in steps[1]["used"].values()) > 1e-6  # the first step moved the policy
    assert_store_empties(STORES[0])


def test_the_ppo_example_computes_gae_from_the_critic_values_and_trains_both(
        tmp_path: Path, example_paths: None) -> None:
    work, stdout = run_block(bash_blocks(ROLES)[1], tmp_path)
    assert "admitted 16" in stdout and stdout.count("critic: step") == 2
    submitted = json.loads((work / "ppo-rollout.json").read_text())
    steps = json.loads((work / "ppo-actor.json").read_text())
    attached = json.loads((work / "ppo-critic.json").read_text())
    assert len(submitted) == 16 and len(steps) == 2 and sorted(attached) == sorted(submitted)
    trained_exactly_once(steps, submitted)
    common = load_common()
    critic, policy = common.build_critic(), common.build_policy()
    for index, step in enumerate(steps):
        for trajectory_id, used in step["used"].items():
            written = submitted[trajectory_id]
            tokens, start = written["input_ids"], written["response_start"]
            assert used["reward"] == written["reward"]
            assert used["values"] == attached[trajectory_id]  # the critic's values, as it attached them
            assert len(used["values"]) == len(tokens) - start  # one per response token
            assert used["advantages"] == pytest.approx(naive_gae(used["values"], written["reward"]), abs=1e-4)
            if index == 0:  # neither the critic nor the actor has stepped yet
                values = [naive_value(critic, tokens[i - 1]) for i in range(start, len(tokens))]
                assert used["values"] == pytest.approx(values, abs=1e-5)
                ratio = [math.exp(naive_next_logprob(policy, tokens[i - 1], tokens[i]) - old)
                         for i, old in zip(range(start, len(tokens)), written["old_logprobs"], strict=True)]
                assert used["ratio"] == pytest.approx(ratio, abs=1e-5) and ratio == pytest.approx([1.0] * len(ratio),
                                                                                                  abs=1e-5)
    moved = [abs(v - naive_value(critic, submitted[t]["input_ids"][submitted[t]["response_start"] + j - 1]))
             for t, used in steps[1]["used"].items() for j, v in enumerate(used["values"])]
    assert max(moved) > 1e-6  # the critic trained on the first mini-batch before valuing the second
    assert_store_empties(STORES[1])
