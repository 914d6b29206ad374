"""The chaos schedule is a pure function of its seed and settings; the CLI's targets reach it through the config."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knittrans.config import load_config
from knittrans.demo.chaos.schedule import (
    ALL_TARGETS,
    ChaosSettings,
    FaultAction,
    FaultTarget,
    fault_schedule,
    parse_targets,
)
from knittrans.demo.stack.settings import DemoSettings
from knittrans.errors import ConfigError, InvalidArgument


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_a_seed_gives_the_same_schedule_every_time_and_a_longer_one_extends_it(seed: int) -> None:
    chaos = ChaosSettings(seed=seed)
    assert fault_schedule(chaos, 30) == fault_schedule(ChaosSettings(seed=seed), 30)
    assert fault_schedule(chaos, 50)[:30] == fault_schedule(chaos, 30)


def test_different_seeds_give_different_schedules() -> None:
    schedules = {fault_schedule(ChaosSettings(seed=seed), 10) for seed in range(20)}
    assert len(schedules) == 20


def test_every_fault_is_within_its_settings() -> None:
    chaos = ChaosSettings(seed=7, min_stop_seconds=0.5, max_stop_seconds=1.5, quiet_seconds=4.0)
    faults = fault_schedule(chaos, 400)
    assert [f.index for f in faults] == list(range(400))
    assert faults[0].delay_seconds >= 4.0
    assert {f.target for f in faults} == set(ALL_TARGETS)  # 400 draws reach every kind
    assert {f.action for f in faults} == {FaultAction.KILL, FaultAction.STOP}
    for fault in faults:
        if fault.action is FaultAction.STOP:
            assert 0.5 <= fault.stop_seconds <= 1.5
        else:
            assert fault.stop_seconds == 0.0
    # About half are kills, and the pauses average the mean interval (loose bounds: 400 draws).
    kills = sum(f.action is FaultAction.KILL for f in faults)
    assert 120 < kills < 280
    mean = sum(f.delay_seconds for f in faults[1:]) / 399
    assert 1.0 < mean < 3.0


def test_only_the_configured_targets_are_hit() -> None:
    chaos = ChaosSettings(seed=3, targets=(FaultTarget.REDIS, FaultTarget.SIDECAR))
    assert {f.target for f in fault_schedule(chaos, 200)} == {FaultTarget.REDIS, FaultTarget.SIDECAR}


def test_no_seed_no_faults() -> None:
    assert fault_schedule(ChaosSettings(), 10) == ()


def test_targets_parse_from_the_command_line_form() -> None:
    assert parse_targets("admission, redis") == (FaultTarget.ADMISSION, FaultTarget.REDIS)
    assert parse_targets("all") == ALL_TARGETS
    assert parse_targets("mooncake-store") == (FaultTarget.MOONCAKE_STORE,)
    with pytest.raises(InvalidArgument, match="unknown target"):
        parse_targets("admission,postgres")


@pytest.mark.parametrize("bad", [{"targets": ()}, {"targets": (FaultTarget.REDIS, FaultTarget.REDIS)},
                                 {"mean_interval_seconds": 0.0}, {"kill_probability": 1.5},
                                 {"min_stop_seconds": 2.0, "max_stop_seconds": 1.0}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(InvalidArgument):
        ChaosSettings(seed=1, **bad)


def test_the_demo_settings_take_chaos_flags_and_need_redis_and_mooncake() -> None:
    settings = load_config(DemoSettings, env={}, flags={
        "state": "redis", "store": "mooncake", "chaos.seed": 5, "chaos.targets": ["admission", "sidecar"]})
    assert settings.chaos.seed == 5 and settings.chaos.enabled
    assert settings.chaos.targets == (FaultTarget.ADMISSION, FaultTarget.SIDECAR)
    assert not load_config(DemoSettings, env={}).chaos.enabled
    with pytest.raises(ConfigError, match="chaos"):
        load_config(DemoSettings, env={}, flags={"chaos.seed": 5})  # memory state and a file store
