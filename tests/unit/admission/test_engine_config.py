"""EngineConfig validation through the one config loader, and the quota arithmetic of DESIGN.md §3.1–3.2."""

from __future__ import annotations

from pathlib import Path

import pytest

from knittrans.admission.engine import (
    DEFAULT_STARVATION_SECONDS,
    AdmissionPolicy,
    AdmissionTargets,
    EngineConfig,
    OnStarvation,
    StarvationAction,
    source_quotas,
)
from knittrans.admission.engine.quotas import (
    largest_remainder,
    linear_schedule,
    minibatch_sizes,
    mirror_requirements,
    progressive_target,
    relaxed_schedule,
)
from knittrans.admission.replay.config import ReplayConfig
from knittrans.config import load_config
from knittrans.errors import ConfigError

GOOD = """\
train_batch_size: 256
num_minibatches: 4
sources: {A: 0.24, B: 0.24, C: 0.24, D: 0.24}
source_schedule: [0.0, 0.0, 0.5, 1.0]
train_seconds_per_minibatch: 60
staleness_bound: 4
completion_quota: 0.8
admission_unit: trajectory
"""


def load(tmp_path: Path, text: str, schema: type = ReplayConfig) -> EngineConfig:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(schema, path=path, env={})


def test_the_issue_example_loads(tmp_path: Path) -> None:
    config = load(tmp_path, GOOD)
    assert isinstance(config, ReplayConfig)
    assert config.source_names == ("A", "B", "C", "D")
    assert config.source_schedule == (0.0, 0.0, 0.5, 1.0)
    assert config.staleness_bound == 4
    assert config.completion_quota == 0.8
    assert config.policy is AdmissionPolicy.KNITTRANS
    assert config.starvation == OnStarvation()
    assert AdmissionTargets.build(config).quotas == (62, 62, 62, 62)


def test_engine_config_loads_without_replay_keys(tmp_path: Path) -> None:
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith("train_seconds"))
    config = load(tmp_path, text, EngineConfig)
    assert type(config) is EngineConfig


@pytest.mark.parametrize(
    ("replace", "field", "words"),
    [
        ("sources: {A: 0.24, B: 0.24, C: 0.24, D: 0.24}", "sources: {A: 0.5, B: 0.3, C: 0.3}", "above 1"),
        ("sources: {A: 0.24, B: 0.24, C: 0.24, D: 0.24}", "sources: {}", "at least one source"),
        ("sources: {A: 0.24, B: 0.24, C: 0.24, D: 0.24}", "sources: {A: 1.5}", "[0, 1]"),
        ("source_schedule: [0.0, 0.0, 0.5, 1.0]", "source_schedule: [0.0, 0.6, 0.5, 1.0]", "non-decreasing"),
        ("source_schedule: [0.0, 0.0, 0.5, 1.0]", "source_schedule: [0.0, 0.0, 0.5, 0.9]", "end at 1"),
        ("source_schedule: [0.0, 0.0, 0.5, 1.0]", "source_schedule: [0.0, 1.0]", "4 mini-batches"),
        ("source_schedule: [0.0, 0.0, 0.5, 1.0]", "source_schedule: [0.0, -0.5, 0.5, 1.0]", "outside [0, 1]"),
        ("admission_unit: trajectory", "admission_unit: trajectory\npolicy: fastest", "must be one of"),
        ("admission_unit: trajectory", "admission_unit: sample", "must be one of"),
        ("completion_quota: 0.8", "completion_quota: 1.2", "(0, 1]"),
        ("staleness_bound: 4", "staleness_bound: -1", "at least 0"),
        ("num_minibatches: 4", "num_minibatches: 0", "at least 1"),
        ("train_seconds_per_minibatch: 60", "train_seconds_per_minibatch: 0", "positive"),
        ("admission_unit: trajectory", "admission_unit: trajectory\non_starvation: relax_after=soon", "duration"),
        ("admission_unit: trajectory", "admission_unit: trajectory\non_starvation: retry", "relax_after"),
        ("admission_unit: trajectory", "admission_unit: trajectory\nbatch_size: 3", "unknown key"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, replace: str, field: str, words: str) -> None:
    key = field.splitlines()[-1].split(":")[0]
    with pytest.raises(ConfigError) as info:
        load(tmp_path, GOOD.replace(replace, field))
    assert info.value.field == key or info.value.field.startswith(f"{key}.")
    assert words in str(info.value)
    assert key in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("wait", OnStarvation()),
        ("relax_after=600", OnStarvation(action=StarvationAction.RELAX, after_seconds=600)),
        ("relax_after=10m", OnStarvation(action=StarvationAction.RELAX, after_seconds=600)),
        ("fail_after=1.5h", OnStarvation(action=StarvationAction.FAIL, after_seconds=5400)),
        ("fail", OnStarvation(action=StarvationAction.FAIL, after_seconds=DEFAULT_STARVATION_SECONDS)),
    ],
)
def test_on_starvation_strings(tmp_path: Path, text: str, expected: OnStarvation) -> None:
    config = load(tmp_path, GOOD + f"on_starvation: {text}\n")
    assert config.starvation == expected


def test_on_starvation_mapping(tmp_path: Path) -> None:
    config = load(tmp_path, GOOD + "on_starvation: {action: relax, after_seconds: 30}\n")
    assert config.starvation == OnStarvation(action=StarvationAction.RELAX, after_seconds=30)


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    config = load_config(ReplayConfig, path=path, env={"KNITTRANS_POLICY": "linear", "KNITTRANS_STALENESS_BOUND": "2"})
    assert config.policy is AdmissionPolicy.LINEAR
    assert config.staleness_bound == 2


@pytest.mark.parametrize(
    ("ratios", "size", "quotas"),
    [
        ((0.24, 0.24, 0.24, 0.24), 256, (62, 62, 62, 62)),  # ceilings fit
        ((0.25, 0.25, 0.25, 0.25), 10, (3, 3, 2, 2)),  # ceilings overfill: largest remainder, ties in order
        ((0.5, 0.5), 7, (4, 3)),
        ((0.1, 0.3, 0.6), 10, (1, 3, 6)),  # exact
        ((0.34, 0.33, 0.33), 10, (4, 3, 3)),  # ceilings 4+4+4 overfill; remainders .4, .3, .3
        ((0.0, 0.5), 5, (0, 3)),
    ],
)
def test_source_quotas(ratios: tuple[float, ...], size: int, quotas: tuple[int, ...]) -> None:
    assert source_quotas(ratios, size) == quotas
    assert sum(quotas) <= size


def test_largest_remainder_never_exceeds_the_ceiling() -> None:
    assert largest_remainder((0.3, 0.3, 0.3), 10) == (3, 3, 3)  # total 9: no remainders to hand out


def test_schedules_and_sizes() -> None:
    assert minibatch_sizes(10, 4) == (3, 3, 2, 2)
    assert linear_schedule((3, 3, 2, 2)) == (0.3, 0.6, 0.8, 1.0)
    assert relaxed_schedule(4) == (0.0, 0.0, 0.5, 1.0)
    assert relaxed_schedule(1) == (1.0,)
    assert relaxed_schedule(8) == (0, 0, 0, 0, 0.25, 0.5, 0.75, 1.0)
    assert progressive_target(0, 62, 0.5) == 31
    assert progressive_target(10, 50, 0.25) == 20
    assert progressive_target(70, 62, 0.0) == 70  # carry-over above the quota
    assert mirror_requirements((62, 62), (64, 64, 64, 64)) == ((16, 16), (31, 31), (47, 47), (62, 62))


@pytest.mark.parametrize(
    ("policy", "source_alpha", "guard"),
    [
        (AdmissionPolicy.TRAIN_BATCH, (1.0, 1.0, 1.0, 1.0), True),
        (AdmissionPolicy.LINEAR, (0.25, 0.5, 0.75, 1.0), True),
        (AdmissionPolicy.STREAM, None, False),
        (AdmissionPolicy.NO_GUARD, (0.0, 0.1, 0.5, 1.0), False),
        (AdmissionPolicy.KNITTRANS, (0.0, 0.1, 0.5, 1.0), True),
    ],
)
def test_policies_resolve_their_schedules(policy: AdmissionPolicy, source_alpha: tuple | None, guard: bool) -> None:
    config = EngineConfig(
        train_batch_size=8, num_minibatches=4, sources={"A": 0.5, "B": 0.5}, source_schedule=(0, 0.1, 0.5, 1),
        completion_quota=0.5, policy=policy,
    )
    targets = AdmissionTargets.build(config)
    assert targets.source_alpha == source_alpha
    assert targets.guard is guard
    assert (targets.mirror is not None) is (policy is AdmissionPolicy.LINEAR)
    assert (targets.completion_alpha is None) is (policy is AdmissionPolicy.STREAM)
