"""One loader for every typed settings tree (verification, SFT, RFT, RL): YAML, dicts and Python construct the same
dataclasses, with the same names and the same validation. Unknown keys are refused with their path; nested settings
are built from their type hints; lists become tuples where a tuple is declared. Scalars are checked against their
declared type (an int is a valid float). `overrides` takes the command line's `--set key.sub=VALUE` (YAML values)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml


class Settings:
    @classmethod
    def from_dict(cls, d: dict, _path: str = ""):
        if not isinstance(d, dict):
            raise ValueError(f"{_path or cls.__name__}: expected a mapping of settings, got {type(d).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if unknown := sorted(set(d) - set(fields)):
            where = f" under {_path.rstrip('.')}" if _path else ""
            raise ValueError(f"unknown {cls.__name__} setting(s){where}: {unknown}; known: {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        return cls(**{k: _coerce(hints[k], v, f"{_path}{k}") for k, v in d.items()})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None, **fields):
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping of settings, got {type(loaded).__name__}")
        return cls.from_dict(merge(merge(loaded, parse_overrides(overrides or [])), fields))

    @classmethod
    def from_options(cls, options: dict, sets: list[str] | None = None):
        """A command's options and its `--set KEY=VALUE` overrides on the defaults. A setting an option gives is
        refused in --set: one of the two would be dropped without a word."""
        over = parse_overrides(sets or [])
        if clash := sorted(_leaves(over) & _leaves(options)):
            raise ValueError(f"{', '.join(clash)}: this command sets it with an option of its own, not with --set")
        return cls.from_dict(merge(options, over))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_overrides(items: list[str]) -> dict:
    """`["a.b=1", "c=[x, y]"]` -> `{"a": {"b": 1}, "c": ["x", "y"]}`; values are read as YAML."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE (e.g. learning_rate=2e-5, lora.r=16)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ValueError(f"--set {item!r}: value is not valid YAML ({str(e).splitlines()[0]})") from None
        *parents, leaf = key.strip().split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, mappings merged key by key (an override of `lora.r` keeps the other lora keys)."""
    merged = dict(base)
    for k, v in over.items():
        merged[k] = merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def _leaves(d: dict, prefix: str = "") -> set[str]:
    """Dotted paths of the values that are not mappings."""
    return {p for k, v in d.items()
            for p in (_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"})}


_SCALARS = {int: (int,), float: (int, float), str: (str,), bool: (bool,), dict: (dict,), list: (list, tuple)}


def _coerce(hint, value, path: str):
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        if issubclass(hint, Settings):
            return hint.from_dict(value, path + ".")
        return hint(**value)
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"setting {path}: expected a list, got {value!r}")
        item = typing.get_args(hint)[0] if typing.get_args(hint) else None
        if item in _SCALARS:
            for i, v in enumerate(value):
                _check_type(item, v, f"{path}[{i}]")
        return tuple(value)
    value = _yaml_float(hint, value)
    _check_type(hint, value, path)
    return value


def _yaml_float(hint, value):
    """PyYAML reads `1e-5` (no dot) as a string; a float setting takes it as the number it is."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,)
    if isinstance(value, str) and float in options and str not in options:
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _check_type(hint, value, path: str) -> None:
    """Refuse a scalar of the wrong type (`learning_rate: fast`) here, not deep inside a trainer."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,)
    allowed: list[type] = []
    for t in options:
        t = typing.get_origin(t) or t
        if t is type(None):
            if value is None:
                return
            continue
        if t not in _SCALARS:  # dataclasses, literals, containers of settings: checked where they are built
            return
        allowed += _SCALARS[t]
    # bool is an int to Python; a flag given where a number is expected is a mistake
    if isinstance(value, tuple(allowed)) and not (isinstance(value, bool) and bool not in allowed):
        return
    names = " or ".join(dict.fromkeys("null" if t is type(None) else getattr(t, "__name__", str(t)) for t in options))
    raise ValueError(f"setting {path}: expected {names}, got {value!r}")


_UnionType = type(int | None)


def check_passthrough(extra: dict, target, taken: set[str], where: str = "trainer") -> None:
    """Keys of a pass-through mapping (`trainer:` -> trl.SFTConfig / GRPOConfig) must be fields of `target` that the
    project does not already set; say which, before a library answers with a TypeError."""
    names = {f.name for f in dataclasses.fields(target)}
    if unknown := sorted(set(extra) - names):
        raise ValueError(f"{where}: {unknown} not field(s) of {target.__module__}.{target.__name__}")
    if clash := sorted(set(extra) & taken):
        raise ValueError(f"{where}: {clash} set by musacoder's own settings; set them there, not under {where}")
