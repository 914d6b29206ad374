"""The config loader layers file < environment < flags and rejects unknown keys, naming them."""

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pytest

from knittrans.config import load_config
from knittrans.errors import ConfigError, InvalidArgument


class Mode(StrEnum):
    FAST = "fast"
    SAFE = "safe"


@dataclass(frozen=True, kw_only=True)
class Server:
    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True, kw_only=True)
class Example:
    name: str
    mode: Mode = Mode.SAFE
    ratios: dict[str, float] = field(default_factory=dict)
    schedule: tuple[float, ...] = (1.0,)
    bound: int | None = None
    server: Server = field(default_factory=Server)

    def __post_init__(self) -> None:
        if sum(self.ratios.values()) > 1:
            raise InvalidArgument("ratios sum above 1", field="ratios")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_layers_override_in_order(tmp_path: Path) -> None:
    path = write(tmp_path, "name: file\nserver: {port: 1}\nschedule: [0, 1]\n")
    config = load_config(
        Example, path=path, env={"KNITTRANS_SERVER__PORT": "2", "KNITTRANS_MODE": "fast", "HOME": "/x"},
        flags={"name": "flag", "bound": None},
    )
    assert config == Example(name="flag", mode=Mode.FAST, schedule=(0.0, 1.0), server=Server(port=2))


@pytest.mark.parametrize(
    ("text", "env", "field"),
    [
        ("name: a\ncolour: red\n", {}, "colour"),
        ("name: a\nserver: {prot: 1}\n", {}, "server.prot"),
        ("name: a\n", {"KNITTRANS_COLOUR": "red"}, "colour"),
        ("name: a\nmode: turbo\n", {}, "mode"),
        ("name: a\nratios: {A: 0.7, B: 0.7}\n", {}, "ratios"),
        ("name: a\nserver: {port: x}\n", {}, "server.port"),
    ],
)
def test_bad_keys_and_values_name_the_key(tmp_path: Path, text: str, env: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Example, path=write(tmp_path, text), env=env)
    assert info.value.field == field


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(Example, path=tmp_path / "absent.yaml", env={})
