"""Store URLs, key naming and Mooncake error translation (no servers)."""

from pathlib import Path

import pytest

from knittrans.errors import ConfigError, Conflict, InvalidArgument, StoreError, StoreFullError, UnitNotFound
from knittrans.store.factory import FileStoreSpec, RayStoreSpec, parse_size, parse_store_url
from knittrans.store.file import default_root, file_name
from knittrans.store.keys import multimodal_unit_key, trajectory_unit_key
from knittrans.store.mooncake import MooncakeStoreConfig
from knittrans.store.mooncake_errors import mooncake_error
from knittrans.types import SampleId, TrajectoryId


def test_file_urls():
    assert parse_store_url("file://", job="j1") == FileStoreSpec(root=Path("/dev/shm/knittrans-j1"))
    assert parse_store_url("file:///data/units?durable=true") == FileStoreSpec(root=Path("/data/units"), durable=True)
    with pytest.raises(ConfigError) as excinfo:
        parse_store_url("file:///data/units?durabel=true")
    assert excinfo.value.field == "store.durabel"


def test_mooncake_urls():
    spec = parse_store_url("mooncake://127.0.0.1:4567?local_buffer_size=64MiB&full_retry_seconds=2")
    assert spec == MooncakeStoreConfig(
        master_address="127.0.0.1:4567", local_buffer_size=64 << 20, full_retry_seconds=2.0
    )
    with pytest.raises(ConfigError) as excinfo:
        parse_store_url("mooncake://127.0.0.1:4567?protocol=carrier-pigeon")
    assert excinfo.value.field == "store.protocol"
    with pytest.raises(ConfigError):
        parse_store_url("mooncake://127.0.0.1")
    with pytest.raises(ConfigError):
        parse_store_url("mooncake://")


def test_ray_urls_and_unknown_schemes():
    assert parse_store_url("ray://") == RayStoreSpec()
    assert parse_store_url("ray://reg?namespace=ns") == RayStoreSpec(registry="reg", namespace="ns")
    assert parse_store_url("ray://?address=10.0.0.1:6379&node_ip_address=10.0.0.2") == RayStoreSpec(
        address="10.0.0.1:6379", node_ip_address="10.0.0.2")
    with pytest.raises(ConfigError, match="unknown store scheme"):
        parse_store_url("s3://bucket")


@pytest.mark.parametrize(
    ("text", "size"), [("1024", 1024), ("64MiB", 64 << 20), ("64 MB", 64_000_000), ("1GiB", 1 << 30)]
)
def test_sizes(text, size):
    assert parse_size(text, field="x") == size


def test_keys_are_scoped_and_unambiguous():
    assert trajectory_unit_key("job", TrajectoryId("a/b"), "logprobs") == "job/t/a/b/logprobs"
    assert multimodal_unit_key("job", SampleId("s"), "ab" * 16) == f"job/s/s/mm/{'ab' * 16}"
    with pytest.raises(InvalidArgument):
        trajectory_unit_key("job", TrajectoryId("t"), "bad/field")
    with pytest.raises(InvalidArgument):
        trajectory_unit_key("a/b", TrajectoryId("t"), "field")
    with pytest.raises(InvalidArgument):
        multimodal_unit_key("job", SampleId("s"), "not-hex")


def test_file_names_are_safe_and_distinct():
    names = {file_name(k) for k in ("a/b", "a%2Fb".replace("%", "x"), "..", ".", "a" * 256, "a" * 255)}
    assert len(names) == 6
    for name in names:
        assert "/" not in name and name not in (".", "..") and len(name) <= 255
    assert default_root("job-1") == Path("/dev/shm/knittrans-job-1")
    with pytest.raises(InvalidArgument):
        default_root("../etc")


@pytest.mark.parametrize(
    ("code", "operation", "error", "field"),
    [
        (-704, "batch_get_into", UnitNotFound, "k"),
        (-200, "batch_put_from", StoreFullError, "k"),
        (-705, "batch_put_from", Conflict, "k"),
        (-600, "batch_get_into_multi_buffer_ranges", InvalidArgument, "range"),
        (-600, "batch_get_into", InvalidArgument, "buffer"),
        (-706, "batch_remove", StoreError, "k"),
        (-800, "batch_get_into", StoreError, "k"),
        (-12345, "batch_get_into", StoreError, "k"),
    ],
)
def test_mooncake_codes_become_typed_errors(code, operation, error, field):
    exc = mooncake_error(code, key="k", operation=operation)
    assert type(exc) is error
    assert exc.field == field
