"""The one config loader: a YAML file, then ``KNITTRANS_*`` environment variables, then flags.

Every command describes its config as a (nested) keyword-only frozen dataclass. :func:`load_config` merges
the three layers, converts values to the annotated types and builds the dataclass, whose own
``__post_init__`` validates the values. Unknown keys are errors in every layer, with the key named.

Environment variables use ``__`` for nesting: ``KNITTRANS_SERVER__PORT=50051`` sets ``server.port``.
Their values are parsed as YAML scalars or flow collections (``[0, 0.5, 1]``, ``{A: 0.5}``).
This module is the only place in KnitTrans that reads ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from knittrans.errors import ConfigError, InvalidArgument

ENV_PREFIX = "KNITTRANS_"
# Names a file rather than a config key, so the config layers leave these out.
CONFIG_FILE_VARIABLE = f"{ENV_PREFIX}CONFIG"
CONNECTION_FILE_VARIABLE = f"{ENV_PREFIX}CONNECTION_FILE"
# Where `knittrans up` writes, and clients read, the local stack's addresses (knittrans.connection_file).
DEFAULT_CONNECTION_FILE = "knittrans-connection.json"
T = TypeVar("T")


def environment() -> Mapping[str, str]:
    """The process environment; the one sanctioned read of ``os.environ``."""
    return os.environ


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", field=str(path)) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", field=str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", field=str(path))
    return data


def load_config(
    schema: type[T],
    *,
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    env_prefix: str = ENV_PREFIX,
) -> T:
    """Build ``schema`` from a file, then environment variables, then flags (later layers win).

    ``flags`` maps dotted keys (``server.port``) to values; ``None`` values are ignored so that unset
    argparse options do not override the lower layers.
    """
    merged: dict[str, Any] = read_yaml_file(path) if path is not None else {}
    env = environment() if env is None else env
    for name, raw in sorted(env.items()):
        if not name.startswith(env_prefix) or name in (f"{env_prefix}CONFIG", f"{env_prefix}CONNECTION_FILE"):
            continue
        dotted = name[len(env_prefix) :].lower().replace("__", ".")
        _set_dotted(merged, dotted, _parse_env_value(raw, name), source=name)
    for dotted, value in (flags or {}).items():
        if value is not None:
            _set_dotted(merged, dotted, value, source=f"--{dotted.replace('_', '-')}")
    return build(schema, merged)


def config_path_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """``KNITTRANS_CONFIG`` names the config file when no ``--config`` flag is given."""
    env = environment() if env is None else env
    return env.get(CONFIG_FILE_VARIABLE)


def connection_file_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """``KNITTRANS_CONNECTION_FILE`` names the connection file ``knittrans up`` writes and clients read."""
    env = environment() if env is None else env
    return env.get(CONNECTION_FILE_VARIABLE) or None


def connection_file_path(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Path:
    """The connection file: ``path`` when given, else ``KNITTRANS_CONNECTION_FILE``, else
    ``knittrans-connection.json`` in the current directory."""
    return Path(path or connection_file_from_env(env) or DEFAULT_CONNECTION_FILE)


def build(schema: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
    """Convert a plain mapping into the dataclass ``schema``, rejecting unknown keys.

    Every config class is built here, so every error names its key the same way: an unknown key first, then
    the first missing required key (in declaration order, ``backbone.dp: is required``), then bad values.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping, got {type(data).__name__}", field=prefix or "<root>")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}  # type: ignore[arg-type]
    given: dict[str, Any] = {}
    for key, value in data.items():
        key_name = str(key).replace("-", "_")
        if key_name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key; known keys are: {known}", field=f"{prefix}{key}")
        given[key_name] = value
    for name, spec in fields.items():
        if name not in given and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ConfigError("is required", field=f"{prefix}{name}")
    kwargs = {name: _convert(hints[name], value, f"{prefix}{name}") for name, value in given.items()}
    try:
        return schema(**kwargs)
    except InvalidArgument as exc:
        field = f"{prefix}{exc.field}" if exc.field else (prefix.rstrip(".") or None)
        raise ConfigError(exc.message, field=field) from exc


def _convert(annotation: Any, value: Any, field: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:  # an optional value: its own error names the nested key
            return _convert(non_none[0], value, field)
        errors = []
        for option in non_none:
            try:
                return _convert(option, value, field)
            except ConfigError as exc:
                errors.append(exc.message)
        raise ConfigError("; ".join(errors), field=field)
    if annotation is Any:
        return value
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return build(annotation, value if value is not None else {}, prefix=f"{field}.")
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"expected a list, got {value!r}", field=field)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{field}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"expected {len(args)} items, got {len(value)}", field=field)
        return tuple(_convert(a, v, f"{field}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (dict, Mapping, typing.Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {value!r}", field=field)
        key_type, value_type = args or (str, Any)
        return {
            _convert(key_type, k, f"{field}.{k}"): _convert(value_type, v, f"{field}.{k}") for k, v in value.items()
        }
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"must be one of {', '.join(map(str, args))}, got {value!r}", field=field)
        return value
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return annotation(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in annotation)
            raise ConfigError(f"must be one of {choices}, got {value!r}", field=field) from None
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"expected true or false, got {value!r}", field=field)
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"expected an integer, got {value!r}", field=field)
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"expected a number, got {value!r}", field=field)
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"expected a string, got {value!r}", field=field)
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise ConfigError(f"expected {annotation.__name__}, got {value!r}", field=field)
    # NewType and other callables that wrap a base type
    supertype = getattr(annotation, "__supertype__", None)
    if supertype is not None:
        return annotation(_convert(supertype, value, field))
    raise ConfigError(f"unsupported config type {annotation!r}", field=field)


def _parse_env_value(raw: str, name: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"not a valid value: {exc}", field=name) from exc


def _set_dotted(target: dict[str, Any], dotted: str, value: Any, *, source: str) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError("empty key", field=source)
    node = target
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{part!r} is not a section", field=source)
        node = child
    node[parts[-1]] = value
