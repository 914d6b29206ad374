"""What the role examples share: the tiny models, built from a seed, and the per-token arithmetic on packed
micro-batches (docs/roles.md, "Examples").

The policy is a bigram model (the next token depends on the current one only), so a packed micro-batch needs no
attention mask: position t of any trajectory scores ``labels[t]``, the next token of the same trajectory.
"""

from __future__ import annotations

import torch

VOCAB = 64
POLICY_SEED = 0  # the actor's initial weights; the reference is a frozen copy of them
CRITIC_SEED = 1


class Bigram(torch.nn.Module):
    """``out`` outputs per position: next-token logits (the policy) or one value (the critic)."""

    def __init__(self, out: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, out)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embedding(input_ids.long())))


def build_policy() -> Bigram:
    torch.manual_seed(POLICY_SEED)
    return Bigram(VOCAB)


def build_critic() -> Bigram:
    torch.manual_seed(CRITIC_SEED)
    return Bigram(1)


def label_logprobs(policy: Bigram, micro) -> torch.Tensor:
    """log p(labels[t] | input_ids[..t]) at each packed position; 0 where there is no label (-100)."""
    labels = micro["labels"].long()
    logprobs = torch.log_softmax(policy(micro["input_ids"]), dim=-1)
    picked = logprobs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(labels != -100, picked, torch.zeros_like(picked))


def response_rows(micro) -> list[slice]:
    """Each trajectory's packed rows whose label is a response token: where a response-only field submitted or
    attached token-aligned lands (``old_logprobs.mask`` is 1 exactly there), one row per response token."""
    mask = micro["old_logprobs.mask"] != 0
    return [slice(s.start + int(torch.nonzero(mask[s])[0]), s.stop - 1) for s in micro.sequence_rows()]


def clipped_surrogate(logprobs, old_logprobs, advantages, clip: float = 0.2) -> torch.Tensor:
    """PPO's clipped policy loss per position (the caller masks and normalises)."""
    ratio = torch.exp(logprobs - old_logprobs)
    return -torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)


def gae(values: torch.Tensor, reward: float, gamma: float = 1.0, lam: float = 0.95) -> torch.Tensor:
    """Generalised advantage estimates over one response: ``values[j]`` is the critic's value of the state that
    generated response token j, the reward comes with the last token, and the value after it is 0."""
    advantages = torch.zeros_like(values)
    running = 0.0
    for j in reversed(range(len(values))):
        next_value = values[j + 1] if j + 1 < len(values) else 0.0
        delta = (reward if j == len(values) - 1 else 0.0) + gamma * next_value - values[j]
        running = delta + gamma * lam * running
        advantages[j] = running
    return advantages
