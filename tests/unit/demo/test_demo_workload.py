"""The demo's synthetic rollout workload: deterministic, shaped as the pipeline expects, learnable, skewed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.demo.workload import (
    EOS_TOKEN,
    FIRST_TEXT_TOKEN,
    PLACEHOLDER_TOKEN,
    SEP_TOKEN,
    SourceSpec,
    WorkloadSpec,
    check_encoder_rows,
    generate_sample,
    generate_samples,
    next_response_token,
    response_start,
    source_counts,
    source_sequence,
)
from knittrans.errors import InvalidArgument

SPEC = WorkloadSpec()


def test_generation_is_deterministic_and_samples_differ() -> None:
    first, again = generate_samples(SPEC, 6), generate_samples(SPEC, 6)
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.image, b.image)
        for ta, tb in zip(a.trajectories, b.trajectories, strict=True):
            for name in ta.fields:
                assert np.array_equal(ta.fields[name], tb.fields[name])
            assert (ta.reward, ta.duration_seconds) == (tb.reward, tb.duration_seconds)
    assert not np.array_equal(first[0].image, first[1].image)
    other_seed = generate_samples(WorkloadSpec(seed=1), 1)[0]
    assert not np.array_equal(other_seed.image, first[0].image)


def test_a_group_shares_prompt_image_and_placeholder() -> None:
    sample = generate_sample(SPEC, 5, "chart")
    assert len(sample.trajectories) == SPEC.group_size
    assert sample.image.dtype == np.uint8 and sample.image.shape == SPEC.image_shape
    span = sample.placeholder
    assert span.length == SPEC.rows_per_image
    prompts = {tuple(t.fields["input_ids"][: t.prompt_tokens].tolist()) for t in sample.trajectories}
    assert len(prompts) == 1
    prompt = prompts.pop()
    assert all(token == PLACEHOLDER_TOKEN for token in prompt[span.start : span.end])
    assert PLACEHOLDER_TOKEN not in prompt[: span.start] + prompt[span.end :]
    assert prompt[-1] == SEP_TOKEN
    assert len({t.trajectory_id for t in sample.trajectories}) == SPEC.group_size
    assert len({tuple(t.fields["input_ids"].tolist()) for t in sample.trajectories}) > 1  # sampled responses


@pytest.mark.parametrize("source", SPEC.source_names)
def test_fields_have_the_pipeline_shapes_and_a_label_aligned_mask(source: str) -> None:
    for trajectory in generate_sample(SPEC, 11, source).trajectories:
        f = trajectory.fields
        length = trajectory.num_tokens
        assert f["input_ids"].dtype == np.int32 and f["input_ids"].shape == (length,)
        assert f["loss_mask"].dtype == np.uint8 and f["loss_mask"].shape == (length,)
        assert f["logprobs"].dtype == np.float32 and f["logprobs"].shape == (length,)
        assert f["routing"].dtype == np.uint8 and f["routing"].shape == (length, SPEC.routing_top_k)
        assert (f["routing"] < SPEC.num_experts).all()
        assert all(len(set(row.tolist())) == SPEC.routing_top_k for row in f["routing"])
        assert length <= SPEC.max_tokens
        # The mask selects the positions whose next token is generated: the response and its EOS.
        selected = np.flatnonzero(f["loss_mask"])
        assert selected.tolist() == list(range(trajectory.prompt_tokens - 1, length - 1))
        assert trajectory.num_loss_tokens == trajectory.generated_tokens
        assert f["input_ids"][-1] == EOS_TOKEN
        assert (f["logprobs"][f["loss_mask"] == 0] == 0).all() and (f["logprobs"][selected] < 0).all()


def test_responses_follow_the_walk_except_for_sampling_noise() -> None:
    spec = WorkloadSpec(noise=0.0)
    for sample in generate_samples(spec, 8):
        stride = spec.source(sample.source).stride
        for trajectory in sample.trajectories:
            tokens = trajectory.fields["input_ids"].tolist()
            first_text = tokens[2]
            response = tokens[trajectory.prompt_tokens : -1]
            assert response[0] == response_start(spec, first_text, sample.image_class)
            assert all(b == next_response_token(spec, a, stride) for a, b in itertools.pairwise(response))
            assert all(FIRST_TEXT_TOKEN <= t < spec.vocab_size for t in response)
            assert trajectory.reward == 1.0 and trajectory.advantage == 0.0
    noisy = generate_samples(WorkloadSpec(noise=0.3), 8)
    rewards = [t.reward for s in noisy for t in s.trajectories]
    assert min(rewards) < 1.0
    for sample in noisy:  # GRPO: advantages are centred within the group
        assert abs(sum(t.advantage for t in sample.trajectories)) < 1e-9


def test_images_show_their_class() -> None:
    for sample in generate_samples(SPEC, 12):
        half = SPEC.image_shape[1] // 2
        quadrants = [
            sample.image[:, r * half : (r + 1) * half, c * half : (c + 1) * half].mean() for r in (0, 1) for c in (0, 1)
        ]
        assert int(np.argmax(quadrants)) == sample.image_class


def test_one_source_is_several_times_slower() -> None:
    means = {s.name: s.mean_seconds for s in SPEC.sources}
    slowest = max(means.values())
    assert slowest >= 3 * max(m for m in means.values() if m != slowest)
    durations: dict[str, list[float]] = {}
    for sample in generate_samples(SPEC, 40):
        durations.setdefault(sample.source, []).extend(t.duration_seconds for t in sample.trajectories)
    for name, values in durations.items():
        low, high = means[name] * (1 - SPEC.duration_jitter), means[name] * (1 + SPEC.duration_jitter)
        assert all(low <= v <= high for v in values)


@given(st.integers(min_value=0, max_value=200))
@settings(max_examples=40, deadline=None)
def test_source_sequence_keeps_every_prefix_near_the_shares(count: int) -> None:
    sources = source_sequence(SPEC, count)
    assert len(sources) == count
    for prefix in range(1, count + 1):
        counts = source_counts(sources[:prefix])
        for spec in SPEC.sources:
            assert abs(counts.get(spec.name, 0) - spec.share * prefix) < 1.0


def test_uneven_shares_are_apportioned_exactly() -> None:
    spec = WorkloadSpec(
        sources=(
            SourceSpec(name="a", share=0.5, mean_seconds=0.1, response_tokens=(2, 3), stride=1),
            SourceSpec(name="b", share=0.25, mean_seconds=0.1, response_tokens=(2, 3), stride=1),
            SourceSpec(name="c", share=0.25, mean_seconds=0.1, response_tokens=(2, 3), stride=1),
        )
    )
    assert source_counts(source_sequence(spec, 12)) == {"a": 6, "b": 3, "c": 3}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"group_size": 0}, "group_size"),
        ({"vocab_size": 10}, "vocab_size"),
        ({"image_shape": (3, 32, 16)}, "image_shape"),
        ({"routing_top_k": 20, "num_experts": 16}, "routing_top_k"),
        ({"noise": 1.0}, "noise"),
        ({"sources": ()}, "sources"),
    ],
)
def test_bad_specs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        WorkloadSpec(**kwargs)
    assert error.value.field == field


def test_placeholders_must_match_the_encoder_rows() -> None:
    check_encoder_rows(SPEC, SPEC.rows_per_image)
    with pytest.raises(InvalidArgument, match="encoder makes 4 rows"):
        check_encoder_rows(SPEC, 4)
