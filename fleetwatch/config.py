"""The deployment configuration: one TOML file that every long-running command reads.

A component declares its settings where it uses them, as a dataclass whose fields are `knob`s (a
default, a one-line reason and the bounds a value must keep) or nested configurations (a field
whose metadata is `why(reason)`). This module decodes a table of the file into that same
dataclass, refusing unknown keys, wrong types and values out of bounds with a ConfigError that
names the key, and renders every key with its default and reason (`fleetwatch config --defaults`).
It knows no component: the CLI says which dataclass each section holds (fleetwatch/cli.py), so the
core imports nothing above it.

A command's own flags form a flat section too (`Flag`, built by the CLI from its parser): the file
gives them defaults and the command line still overrides them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

ENV = "FLEETWATCH_CONFIG"  # the file a command reads when it is given no --config
REASON = "reason"  # the field metadata key of a setting's one-line reason
_BOUNDS = ("gt", "ge", "lt", "le")
_OPS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


class ConfigError(ValueError):
    """A configuration file a command must refuse to start with (status 2)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"config error: {detail}")


def knob(
    default: Any,
    reason: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A configuration field: its code default, why it is what it is, and the bounds on a value."""
    bounds = {k: v for k, v in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if v is not None}
    return field(default=default, metadata={REASON: reason, **bounds})


def why(reason: str) -> dict[str, str]:
    """A nested configuration's metadata: `field(default_factory=LemonConfig, metadata=why(...))`."""
    return {REASON: reason}


@dataclass(frozen=True)
class Flag:
    """One key of a command's flat section: a command-line option whose default the file sets.

    `convert` takes the file's value and returns the option's, or raises ValueError saying what it
    expected (e.g. "a number > 0")."""

    key: str
    default: Any
    reason: str
    convert: Callable[[Any], Any]


Section = type | Sequence[Flag]  # a dataclass, or a command's flags


# ------------------------------------------------------------------------- reading


def load(path: str | Path) -> dict[str, Any]:
    """The file's tables; a missing file or bad TOML is a ConfigError naming the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # arrays nested hundreds deep: no configuration's shape
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None


def table(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The table at dotted `name` ({} when the file has none); a key that is not a table is an error."""
    node: Any = data
    for i, key in enumerate(name.split(".")):
        node = node.get(key, {})
        if not isinstance(node, dict):
            where = ".".join(name.split(".")[: i + 1])
            raise ConfigError(f"[{where}]: expected a table, got {_show(node)}")
    return node


def decode(cls: type, values: Mapping[str, Any], section: str, base: Any = None) -> Any:
    """`values` (a table of the file) over `base` (default: the code defaults, cls()), as a `cls`.

    Every key must be a field of cls; a nested configuration is a sub-table, decoded the same way."""
    base = cls() if base is None else base
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        f = known.get(key)
        if f is None:
            raise ConfigError(f"[{section}] {key}: unknown key (known: {', '.join(known)})")
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"[{section}] {key}: expected a table, got {_show(value)}")
            changes[key] = decode(hint, value, f"{section}.{key}", getattr(base, key))
        else:
            changes[key] = _leaf(hint, f.metadata, value, section, key)
    return dataclasses.replace(base, **changes)


def _leaf(hint: Any, meta: Mapping[str, Any], value: Any, section: str, key: str) -> Any:
    bounds = {k: meta[k] for k in _BOUNDS if k in meta}
    want = typing.Annotated[hint, msgspec.Meta(**bounds)] if bounds else hint
    try:
        return msgspec.convert(value, want)
    except msgspec.ValidationError:
        expected = expectation(hint, bounds)
        raise ConfigError(f"[{section}] {key}: expected {expected}, got {_show(value)}") from None


def expectation(hint: Any, bounds: Mapping[str, float]) -> str:
    """'a number <= 1.0', 'an integer >= 1', 'true or false', ..."""
    what = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}.get(hint, str(hint))
    return " ".join([what, " and ".join(f"{_OPS[k]} {v}" for k, v in bounds.items())]).strip()


def flags(values: Mapping[str, Any], section: str, known: Sequence[Flag]) -> dict[str, Any]:
    """A command's flat section: each key one of its flags, converted as the flag's own values are."""
    by_key = {f.key: f for f in known}
    out: dict[str, Any] = {}
    for key, value in values.items():
        f = by_key.get(key)
        if f is None:
            raise ConfigError(f"[{section}] {key}: unknown key (known: {', '.join(by_key)})")
        try:
            out[key] = f.convert(value)
        except ValueError as e:
            raise ConfigError(f"[{section}] {key}: expected {e}, got {_show(value)}") from None
    return out


def check_sections(
    data: Mapping[str, Any], sections: Mapping[str, Section], roots: Sequence[str] = ()
) -> dict[str, Any]:
    """`sections` of the file decoded: {section name: dataclass instance or the flags' values}.

    A top-level table neither in `sections` nor in `roots` is an error; below the top, a table
    that names none of a flat section's sub-sections is an unknown key of it."""
    out: dict[str, Any] = {}
    for name, sec in sections.items():
        values = table(data, name)
        if isinstance(sec, type):
            out[name] = decode(sec, values, name)
        else:
            subs = {s.rpartition(".")[2] for s in sections if s.startswith(name + ".")}
            out[name] = flags({k: v for k, v in values.items() if k not in subs}, name, sec)
    known = {name.split(".")[0] for name in sections} | set(roots)
    for key, value in data.items():
        if key not in known:
            kind = "section" if isinstance(value, dict) else "key"
            raise ConfigError(f"[{key}]: unknown {kind} (known: {', '.join(sorted(known))})")
    return out


def flags_over(base: Any, args: Any, fields_of: Mapping[str, str]) -> Any:
    """`base` with each field in `fields_of` (flag dest -> field) that was given on the command line
    (not None: such flags default to None, so the file's value shows through) replaced by the flag's."""
    given = {f: getattr(args, flag) for flag, f in fields_of.items() if getattr(args, flag, None) is not None}
    return dataclasses.replace(base, **given)


# ------------------------------------------------------------------------- writing


def render(sections: Mapping[str, Section], header: str = "") -> str:
    """Every key of every section with its default and reason, as TOML that decodes to the defaults.

    A flag without a default (TOML has no null) is shown commented out."""
    lines = [f"# {h}".rstrip() for h in header.splitlines()]
    for name, sec in sections.items():
        if isinstance(sec, type):
            lines += _render_class(name, sec)
        else:
            lines += ["", f"[{name}]"]
            for f in sec:
                lines += _render_key(f.key, f.default, f.reason)
    return "\n".join(lines).lstrip("\n") + "\n"


def _render_class(name: str, cls: type, reason: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    default = cls()
    lines = ["", *([f"# {reason}"] if reason else []), f"[{name}]"]
    nested: list[str] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested += _render_class(f"{name}.{f.name}", hints[f.name], f.metadata.get(REASON, ""))
        else:
            lines += _render_key(f.name, getattr(default, f.name), f.metadata.get(REASON, ""))
    return lines + nested


def _render_key(key: str, value: Any, reason: str) -> list[str]:
    comment = [f"# {reason}"] if reason else []
    if value is None:
        return [*comment, f"# {key} = (unset)"]
    return [*comment, f"{key} = {_toml(value)}"]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (tuple, list)):  # an array of strings is the same in JSON and TOML
        return json.dumps([str(v) for v in value])
    return json.dumps(str(value))  # a JSON string of ASCII is a TOML basic string


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def reasons(cls: type) -> Iterator[tuple[str, str]]:
    """(field, reason) of each field of a configuration dataclass, nested ones as dotted names."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f.name, f.metadata.get(REASON, "")
        if dataclasses.is_dataclass(hints[f.name]):
            yield from ((f"{f.name}.{k}", r) for k, r in reasons(hints[f.name]))
