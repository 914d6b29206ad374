"""The demo's synthetic RL rollout workload: four data sources, GRPO groups, per-token fields and images.

Every sample is a prompt with one small image; its ``group_size`` trajectories share the prompt and the image
(the same stored unit) and differ in their sampled responses. Generation is deterministic in (seed, sample
index), so tests and the demo's checks can regenerate any trajectory.

**Learnable structure.** Token ids: 0 is the image placeholder (and padding), 1 BOS, 2 SEP, 3 EOS, 4…7 name the
source, 8… are text. A prompt is ``BOS, source token, text, image placeholders, text, SEP``. The image shows one
of four classes (a bright quadrant). The response is a walk through the text tokens: it starts at a token
fixed by the prompt's first text token and the image class, each next token is the previous one plus the
source's stride (modulo the text range), and it ends with EOS. Rollouts are "sampled": each response token is
replaced by a random one with probability ``noise`` (the walk continues from whatever was emitted). So a model
must read the image through the encoder and the source token to predict the response, and the loss can fall.

**Per-token fields** (all of length L, the trajectory's token count):

- ``input_ids`` int32;
- ``loss_mask`` uint8, *label-aligned*: ``loss_mask[t] = 1`` when the next token ``t+1`` is a response token
  (EOS included), so the loss at packed position t is the cross-entropy of ``labels[t]`` and the number of
  loss tokens is ``count_nonzero(loss_mask)`` (what ``RolloutClient`` reports and the planner normalises by);
- ``logprobs`` float32, label-aligned like the mask: the rollout policy's log-probability of token t+1;

  both are submitted with ``field_alignment=LABEL_ALIGNED_FIELDS`` (``RolloutClient`` takes a loss mask as
  token-aligned, verl's convention, unless told otherwise; see docs/integration.md);
- ``routing`` uint8 ``[L, routing_top_k]``: MoE routing decisions of a notional rollout model.

Scalars: ``reward`` (the share of response tokens that follow the walk) and ``advantage`` (reward minus the
group mean, as in GRPO). Durations: each trajectory takes its source's mean time, jittered, and the ``agentic``
source is several times slower than the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.types import FieldAlignment, TokenSpan, check_id

PLACEHOLDER_TOKEN = 0
BOS_TOKEN = 1
SEP_TOKEN = 2
EOS_TOKEN = 3
FIRST_SOURCE_TOKEN = 4
MAX_SOURCES = 4
FIRST_TEXT_TOKEN = FIRST_SOURCE_TOKEN + MAX_SOURCES
IMAGE_CLASSES = 4
# The per-token fields that are label-aligned, as RolloutClient.submit's field_alignment wants them.
LABEL_ALIGNED_FIELDS = MappingProxyType({"loss_mask": FieldAlignment.LABEL, "logprobs": FieldAlignment.LABEL})


@dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """One data source: its minimum share of a train batch, rollout time per trajectory and lengths."""

    name: str
    share: float
    mean_seconds: float
    response_tokens: tuple[int, int]  # inclusive range of response lengths (EOS excluded)
    stride: int  # the response walk's step

    def __post_init__(self) -> None:
        check_id(self.name, "name")
        if not (math.isfinite(self.share) and 0 <= self.share <= 1):
            raise InvalidArgument(f"must be in [0, 1], got {self.share!r}", field="share")
        if not (math.isfinite(self.mean_seconds) and self.mean_seconds >= 0):
            raise InvalidArgument(f"must be a non-negative number, got {self.mean_seconds!r}", field="mean_seconds")
        low, high = self.response_tokens
        if not 1 <= low <= high:
            raise InvalidArgument(f"needs 1 <= low <= high, got {self.response_tokens}", field="response_tokens")
        if self.stride < 1:
            raise InvalidArgument("must be positive", field="stride")


DEFAULT_SOURCES = (
    SourceSpec(name="math", share=0.25, mean_seconds=0.4, response_tokens=(8, 14), stride=1),
    SourceSpec(name="code", share=0.25, mean_seconds=0.5, response_tokens=(10, 18), stride=2),
    SourceSpec(name="chart", share=0.25, mean_seconds=0.6, response_tokens=(8, 16), stride=3),
    SourceSpec(name="agentic", share=0.25, mean_seconds=2.4, response_tokens=(16, 28), stride=5),
)
"""Four sources with equal quotas; ``agentic`` rollouts take about five times as long as the others."""


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """Everything that fixes the generated data (and how long its rollouts take)."""

    sources: tuple[SourceSpec, ...] = DEFAULT_SOURCES
    group_size: int = 4
    vocab_size: int = 64
    image_shape: tuple[int, int, int] = (3, 32, 32)
    rows_per_image: int = 16  # the encoder's output rows per image: the placeholder length
    prompt_text_tokens: tuple[int, int] = (3, 6)  # before the image; the same count again (halved) after it
    routing_top_k: int = 4
    num_experts: int = 16
    noise: float = 0.1
    duration_jitter: float = 0.5  # durations are mean × U(1 − jitter, 1 + jitter)
    encoder: str = "vision"
    id_prefix: str = "demo"
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        if not 1 <= len(self.sources) <= MAX_SOURCES:
            raise InvalidArgument(f"needs 1 to {MAX_SOURCES} sources, got {len(self.sources)}", field="sources")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise InvalidArgument("source names must be unique", field="sources")
        if math.fsum(s.share for s in self.sources) > 1 + 1e-9:
            raise InvalidArgument("shares sum to more than 1", field="sources")
        if self.group_size < 1:
            raise InvalidArgument("must be positive", field="group_size")
        if self.vocab_size < FIRST_TEXT_TOKEN + 8 or self.vocab_size > 2**31 - 1:
            raise InvalidArgument(f"must be at least {FIRST_TEXT_TOKEN + 8}", field="vocab_size")
        if len(self.image_shape) != 3 or min(self.image_shape) < 1 or self.image_shape[1] != self.image_shape[2]:
            raise InvalidArgument("must be (channels, size, size)", field="image_shape")
        if self.image_shape[1] % 2:
            raise InvalidArgument("the image size must be even (quadrants)", field="image_shape")
        if self.rows_per_image < 1:
            raise InvalidArgument("must be positive", field="rows_per_image")
        low, high = self.prompt_text_tokens
        if not 1 <= low <= high:
            raise InvalidArgument("needs 1 <= low <= high", field="prompt_text_tokens")
        if not 1 <= self.routing_top_k <= self.num_experts <= 256:
            raise InvalidArgument("needs 1 <= routing_top_k <= num_experts <= 256", field="routing_top_k")
        if not 0 <= self.noise < 1:
            raise InvalidArgument("must be in [0, 1)", field="noise")
        if not 0 <= self.duration_jitter < 1:
            raise InvalidArgument("must be in [0, 1)", field="duration_jitter")
        check_id(self.encoder, "encoder")
        check_id(self.id_prefix, "id_prefix")

    @property
    def text_tokens(self) -> int:
        return self.vocab_size - FIRST_TEXT_TOKEN

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def source(self, name: str) -> SourceSpec:
        for source in self.sources:
            if source.name == name:
                return source
        raise InvalidArgument(f"unknown source {name!r}", field="source")

    @property
    def max_tokens(self) -> int:
        """The longest trajectory the spec can generate."""
        high = self.prompt_text_tokens[1]
        return 3 + high + max(1, high // 2) + self.rows_per_image + max(s.response_tokens[1] for s in self.sources) + 1

    def sample_id(self, index: int) -> str:
        return f"{self.id_prefix}-s{index:06d}"

    def trajectory_id(self, index: int, member: int) -> str:
        return f"{self.id_prefix}-s{index:06d}-t{member}"


@dataclass(frozen=True, kw_only=True, eq=False)
class GeneratedTrajectory:
    trajectory_id: str
    member: int  # index in the GRPO group
    fields: dict[str, np.ndarray]
    prompt_tokens: int
    duration_seconds: float
    reward: float
    advantage: float

    @property
    def num_tokens(self) -> int:
        return int(self.fields["input_ids"].shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(np.count_nonzero(self.fields["loss_mask"]))

    @property
    def generated_tokens(self) -> int:
        """Tokens the rollout generated (the response and EOS): what a policy version produced."""
        return self.num_tokens - self.prompt_tokens


@dataclass(frozen=True, kw_only=True, eq=False)
class GeneratedSample:
    index: int
    sample_id: str
    source: str
    image: np.ndarray  # uint8 (channels, size, size), shared by the group
    image_class: int
    placeholder: TokenSpan  # where the image's encoder rows go, the same in every trajectory of the group
    trajectories: tuple[GeneratedTrajectory, ...]


def source_sequence(spec: WorkloadSpec, num_samples: int) -> tuple[str, ...]:
    """The source of each sample index: exact largest-remainder shares of ``num_samples``, interleaved so that
    every prefix stays close to the shares (the slow source is not bunched at the end)."""
    if num_samples < 0:
        raise InvalidArgument("must not be negative", field="num_samples")
    shares = [s.share for s in spec.sources]
    total = math.fsum(shares)
    weights = [s / total if total else 1 / len(shares) for s in shares]
    out: list[str] = []
    given = [0] * len(shares)
    for i in range(num_samples):
        # The source furthest behind its share of i+1 samples goes next; ties in config order.
        lag = [weights[k] * (i + 1) - given[k] for k in range(len(shares))]
        k = max(range(len(shares)), key=lambda j: (lag[j], -j))
        given[k] += 1
        out.append(spec.sources[k].name)
    return tuple(out)


def _rng(spec: WorkloadSpec, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed, index, stream])


def make_image(spec: WorkloadSpec, image_class: int, rng: np.random.Generator) -> np.ndarray:
    """A noisy image whose class is the bright quadrant; the class also picks the tint channel."""
    channels, size, _ = spec.image_shape
    image = rng.integers(0, 48, size=spec.image_shape, dtype=np.int64)
    half = size // 2
    row, col = divmod(image_class % IMAGE_CLASSES, 2)
    image[:, row * half : (row + 1) * half, col * half : (col + 1) * half] += 150
    image[image_class % channels] += 40
    return np.clip(image, 0, 255).astype(np.uint8)


def _routing(spec: WorkloadSpec, tokens: np.ndarray) -> np.ndarray:
    """Distinct experts per token, a deterministic function of token id and position."""
    positions = np.arange(tokens.shape[0], dtype=np.int64)
    first = (tokens.astype(np.int64) * 7 + positions * 3) % spec.num_experts
    offsets = np.arange(spec.routing_top_k, dtype=np.int64)
    return ((first[:, None] + offsets[None, :]) % spec.num_experts).astype(np.uint8)


def response_start(spec: WorkloadSpec, first_text_token: int, image_class: int) -> int:
    return FIRST_TEXT_TOKEN + (first_text_token - FIRST_TEXT_TOKEN + 7 * image_class) % spec.text_tokens


def next_response_token(spec: WorkloadSpec, token: int, stride: int) -> int:
    return FIRST_TEXT_TOKEN + (token - FIRST_TEXT_TOKEN + stride) % spec.text_tokens


def generate_sample(spec: WorkloadSpec, index: int, source: str) -> GeneratedSample:
    """Sample ``index`` of ``source`` with its ``group_size`` trajectories (deterministic)."""
    if index < 0:
        raise InvalidArgument("must not be negative", field="index")
    src = spec.source(source)
    source_index = spec.source_names.index(source)
    rng = _rng(spec, index, 0)
    image_class = int(rng.integers(0, IMAGE_CLASSES))
    image = make_image(spec, image_class, rng)
    low, high = spec.prompt_text_tokens

    def text(count: int) -> list[int]:
        return rng.integers(FIRST_TEXT_TOKEN, spec.vocab_size, size=count).tolist()

    before = text(int(rng.integers(low, high + 1)))
    after = text(max(1, int(rng.integers(low, high + 1)) // 2))
    prompt = [BOS_TOKEN, FIRST_SOURCE_TOKEN + source_index, *before]
    placeholder = TokenSpan(start=len(prompt), end=len(prompt) + spec.rows_per_image)
    prompt += [PLACEHOLDER_TOKEN] * spec.rows_per_image + after + [SEP_TOKEN]

    trajectories = []
    rewards = []
    for member in range(spec.group_size):
        member_rng = _rng(spec, index, 1 + member)
        length = int(member_rng.integers(src.response_tokens[0], src.response_tokens[1] + 1))
        on_walk = math.log(1 - spec.noise + spec.noise / spec.text_tokens)
        off_walk = math.log(spec.noise / spec.text_tokens) if spec.noise else -30.0
        expected = response_start(spec, before[0], image_class)
        response, response_logprobs, correct = [], [], 0
        for _ in range(length):
            token = expected
            if member_rng.random() < spec.noise:
                token = int(member_rng.integers(FIRST_TEXT_TOKEN, spec.vocab_size))
            correct += token == expected
            response.append(token)
            response_logprobs.append(on_walk if token == expected else off_walk)
            expected = next_response_token(spec, token, src.stride)
        tokens = np.array([*prompt, *response, EOS_TOKEN], dtype=np.int32)
        num_tokens = tokens.shape[0]
        # Label-aligned: position t carries what concerns token t+1 (the response and its EOS).
        loss_mask = np.zeros(num_tokens, dtype=np.uint8)
        loss_mask[len(prompt) - 1 : num_tokens - 1] = 1
        logprobs = np.zeros(num_tokens, dtype=np.float32)
        logprobs[len(prompt) - 1 : num_tokens - 1] = [*response_logprobs, on_walk]  # the last one: EOS
        jitter = 1 + spec.duration_jitter * (2 * member_rng.random() - 1)
        reward = correct / length
        rewards.append(reward)
        trajectories.append(
            dict(
                trajectory_id=spec.trajectory_id(index, member),
                member=member,
                fields={
                    "input_ids": tokens,
                    "loss_mask": loss_mask,
                    "logprobs": logprobs,
                    "routing": _routing(spec, tokens),
                },
                prompt_tokens=len(prompt),
                duration_seconds=src.mean_seconds * jitter,
                reward=reward,
            )
        )
    mean_reward = sum(rewards) / len(rewards)
    return GeneratedSample(
        index=index,
        sample_id=spec.sample_id(index),
        source=source,
        image=image,
        image_class=image_class,
        placeholder=placeholder,
        trajectories=tuple(GeneratedTrajectory(advantage=t["reward"] - mean_reward, **t) for t in trajectories),
    )


def generate_samples(spec: WorkloadSpec, num_samples: int, *, first_index: int = 0) -> list[GeneratedSample]:
    """Samples ``first_index … first_index + num_samples − 1``, sources by :func:`source_sequence`."""
    sources = source_sequence(spec, first_index + num_samples)
    return [generate_sample(spec, i, sources[i]) for i in range(first_index, first_index + num_samples)]


def samples_needed(spec: WorkloadSpec, trajectories: int) -> int:
    """Samples that yield at least ``trajectories`` trajectories."""
    return -(-trajectories // spec.group_size)


def check_encoder_rows(spec: WorkloadSpec, rows_per_image: int) -> None:
    """Raise unless the placeholders have as many tokens as the encoder produces rows."""
    if spec.rows_per_image != rows_per_image:
        raise InvalidArgument(
            f"placeholders hold {spec.rows_per_image} tokens, the encoder makes {rows_per_image} rows",
            field="rows_per_image",
        )


def source_counts(sources: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in sources:
        counts[name] = counts.get(name, 0) + 1
    return counts
