"""The rollout of the role examples: samples GRPO groups from the initial policy and submits them.

    python examples/roles/rollout.py --admission unix:grpo.sock --store file:///dev/shm/knittrans-grpo-example \
        --groups 4 [--group-size 4] [--record rollout.json]

Each group's responses share a prompt (the sample). What a trainer role needs besides the tokens travels with
each trajectory, as examples/roles/grpo.yaml and ppo.yaml declare it:

- ``reward``, a float scalar: one number per trajectory (the fraction of its response tokens in the lower half
  of the vocabulary); the actors turn it into advantages themselves.
- ``uid``, str metadata: the sample id, which groups the GRPO responses of one prompt.
- ``old_logprobs``, a response-only token field: the log-prob of each response token under the policy that
  sampled it, token-aligned (row j is token ``response_start + j``), like verl's ``old_log_probs``.
- ``loss_mask``: 1 on the response tokens, token-aligned.

``--record`` writes what was submitted, per trajectory, as JSON (the tests' oracle reads it).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from common import VOCAB, build_policy

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.client.reporter import BatchingReporter
from knittrans.rollout import RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment


def sample(policy, prompt: list[int], length: int, generator: torch.Generator) -> tuple[list[int], list[float]]:
    """``length`` tokens sampled from the policy after the prompt, with each one's log-prob."""
    tokens, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(length):
            distribution = torch.log_softmax(policy(torch.tensor([tokens[-1]]))[0], dim=-1)
            token = int(torch.multinomial(distribution.exp(), 1, generator=generator))
            tokens.append(token)
            logprobs.append(float(distribution[token]))
    return tokens[len(prompt):], logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--store", required=True, help="unit store URL the trainers' sidecars read from")
    parser.add_argument("--groups", type=int, default=4, help="prompts (samples) to roll out")
    parser.add_argument("--group-size", type=int, default=4, help="responses per prompt (the job's group_size)")
    parser.add_argument("--record", default="", help="write the submitted trajectories here (JSON)")
    args = parser.parse_args()

    policy = build_policy()  # the initial policy: version 0, the actor's and the reference's starting point
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    store = open_store(args.store)
    record = {}
    with AdmissionClient(ConnectionSettings(target=args.admission)) as admission:
        version = admission.status().policy_version
        reporter = BatchingReporter(admission)
        rollout = RolloutClient(store, namespace="rollout", reporter=reporter)
        for group in range(args.groups):
            uid = f"sample-{group}"
            prompt = rng.integers(0, VOCAB, int(rng.integers(4, 9))).tolist()
            for member in range(args.group_size):
                response, logprobs = sample(policy, prompt, int(rng.integers(6, 17)), generator)
                tokens = np.array(prompt + response, dtype=np.int64)
                reward = float(np.mean(np.array(response) < VOCAB // 2))
                trajectory_id = f"{uid}-{member}"
                rollout.submit(
                    {"input_ids": tokens, "loss_mask": (np.arange(len(tokens)) >= len(prompt)).astype(np.uint8),
                     "old_logprobs": np.array(logprobs, dtype=np.float32)},
                    response_start=len(prompt), response_fields=("old_logprobs",),
                    field_alignment={"loss_mask": "token", "old_logprobs": "token"},
                    scalars={"reward": reward}, metadata={"uid": uid},
                    trajectory_id=trajectory_id, sample_id=uid, source="math", rollout_step=version,
                    segments=(VersionSegment(version=version, num_tokens=len(response)),))
                record[trajectory_id] = {"input_ids": tokens.tolist(), "response_start": len(prompt),
                                         "reward": reward, "uid": uid, "old_logprobs": logprobs}
                print(f"submitted {trajectory_id}: {len(tokens)} tokens, reward {reward:.3f}")
        reporter.close()  # flush: every trajectory is acknowledged when this returns
        status = admission.status()
        print(f"admission: admitted {status.admitted_total}, pool {status.pool_size}")
    store.close()
    if args.record:
        with open(args.record, "w") as out:
            json.dump(record, out)


if __name__ == "__main__":
    main()
