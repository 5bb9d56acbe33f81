"""One loader for every typed settings tree (verification, SFT, RFT, RL): YAML, dicts and Python construct the same
dataclasses, with the same names and the same validation. Unknown keys are refused with their path; nested settings
are built from their type hints; lists become tuples where a tuple is declared. Each value is validated by pydantic
against its declared type, strictly (an int is a valid float; a string is no number, a flag no int), and against the
ranges a field declares as `Annotated[int, Field(ge=1)]`. `overrides` takes the command line's `--set key.sub=VALUE`
(YAML values). In a config file, a setting marked `ConfigPath` that names a relative path is relative to the file's
folder, so a config works from any directory; paths given on the command line stay relative to the current one."""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from pathlib import Path

import yaml
from pydantic import Field, TypeAdapter, ValidationError

__all__ = ["ConfigPath", "Field", "Settings", "check_passthrough", "merge", "parse_overrides"]


@dataclasses.dataclass(frozen=True)
class ConfigPath:
    """Marks a setting that names a file or directory (`Annotated[str, ConfigPath()]`). kind: `path`; `model`, a
    local directory or a hub id (`org/name` that is no directory next to the config stays a hub id); `spec`, a
    generation client (`hf:PATH`, `replay:PATH`; `openai:` names a server). Lists and `{path: ...}` items are
    resolved item by item; values in `keep` are names, not paths (e.g. `builtin` for the shipped tasks)."""

    kind: str = "path"
    keep: tuple[str, ...] = ()

    def resolve(self, value, folder: Path):
        if isinstance(value, list):
            return [self.resolve(v, folder) for v in value]
        if isinstance(value, dict):
            return {**value, "path": self.resolve(value["path"], folder)} if "path" in value else value
        if not isinstance(value, str) or not value or value in self.keep:
            return value
        if self.kind == "spec":
            kind, sep, rest = value.partition(":")
            if sep and kind in ("hf", "replay"):
                return f"{kind}:{ConfigPath('model' if kind == 'hf' else 'path').resolve(rest, folder)}"
            return value
        p = Path(value).expanduser()
        if p.is_absolute():
            return str(p)
        if self.kind == "model" and value.count("/") == 1 and not value.startswith(".") and \
                not (folder / p).exists():
            return value
        return os.path.normpath(folder / p)


class Settings:
    @classmethod
    def from_dict(cls, d: dict, _path: str = ""):
        if not isinstance(d, dict):
            raise ValueError(f"{_path or cls.__name__}: expected a mapping of settings, got {type(d).__name__}")
        fields = _fields(cls)
        if unknown := sorted(set(d) - set(fields)):
            where = f" under {_path.rstrip('.')}" if _path else ""
            raise ValueError(f"unknown {cls.__name__} setting(s){where}: {unknown}; known: {sorted(fields)}")
        return cls(**{k: _coerce(fields[k], v, f"{_path}{k}") for k, v in d.items()})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None, **fields):
        """Settings from a YAML file (relative paths in it relative to its folder), then `--set` overrides, then
        `fields` (a command's own options). A malformed file raises yaml.YAMLError naming the file, line and
        column."""
        path = Path(path)
        with path.open() as f:  # from a stream, a YAML error's mark names the file
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping of settings, got {type(loaded).__name__}")
        loaded = cls.relative_to(loaded, path.parent)
        return cls.from_dict(merge(merge(loaded, parse_overrides(overrides or [])), fields))

    @classmethod
    def relative_to(cls, d: dict, folder: Path) -> dict:
        """`d` with the relative paths of its ConfigPath settings (nested settings included) made relative to
        `folder` instead of the current directory."""
        fields = _fields(cls)
        out = dict(d)
        for k, v in d.items():
            if k not in fields:
                continue  # from_dict names it
            if marker := fields[k].path:
                out[k] = marker.resolve(v, folder)
            elif fields[k].settings is not None and isinstance(v, dict):
                out[k] = fields[k].settings.relative_to(v, folder)
        return out

    @classmethod
    def from_options(cls, options: dict, sets: list[str] | None = None):
        """A command's options and its `--set KEY=VALUE` overrides on the defaults. A setting an option gives is
        refused in --set: one of the two would be dropped without a word."""
        over = parse_overrides(sets or [])
        if clash := sorted(_leaves(over) & _leaves(options)):
            raise ValueError(f"{', '.join(clash)}: this command sets it with an option of its own, not with --set")
        return cls.from_dict(merge(options, over))

    def __post_init__(self):
        """Built in Python, settings get the declared ranges too (their types are the caller's business: code may
        pass a list for a tuple, a Path for a str)."""
        for name, f in _fields(type(self)).items():
            if f.ranges is not None:
                try:
                    f.ranges.validate_python(getattr(self, name))
                except ValidationError as e:
                    raise ValueError(_problem(e, name, getattr(self, name))) from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Field:
    hint: typing.Any
    adapter: TypeAdapter | None  # strict validation of a loaded value; None: checked where it is built
    ranges: TypeAdapter | None  # lax validation, for fields that declare ranges
    path: ConfigPath | None
    settings: type[Settings] | None  # a nested settings type
    dataclass: type | None  # a nested dataclass that is not Settings


@functools.cache
def _fields(cls) -> dict[str, _Field]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        base, meta = _split(hint)
        nested = base if isinstance(base, type) and dataclasses.is_dataclass(base) else None
        adapter = _adapter(hint) if _checkable(hint) else None
        out[f.name] = _Field(
            hint, adapter, adapter if adapter is not None and _has_ranges(hint) else None,
            next((m for m in meta if isinstance(m, ConfigPath)), None),
            nested if nested is not None and issubclass(nested, Settings) else None,
            nested if nested is not None and not issubclass(nested, Settings) else None)
    return out


def _adapter(hint) -> TypeAdapter | None:
    try:
        return TypeAdapter(hint)
    except Exception:  # noqa: BLE001 - a type pydantic has no schema for (a queue, a handle): checked where used
        return None


def _split(hint) -> tuple[typing.Any, tuple]:
    if typing.get_origin(hint) is typing.Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


def _walk(hint):
    yield hint
    for arg in typing.get_args(hint):
        if arg is not Ellipsis:
            yield from _walk(arg)


def _checkable(hint) -> bool:
    """Types pydantic checks strictly as loaded: not dataclasses (built from their own mapping) nor paths (a
    string in YAML, a Path once built)."""
    return not any(isinstance(t, type) and (dataclasses.is_dataclass(t) or issubclass(t, Path)) for t in _walk(hint))


def _has_ranges(hint) -> bool:
    return any(typing.get_origin(t) is typing.Annotated and any(not isinstance(m, ConfigPath) for m in _split(t)[1])
               for t in _walk(hint))


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


def _coerce(f: _Field, value, path: str):
    if isinstance(value, dict) and f.settings is not None:
        return f.settings.from_dict(value, path + ".")
    if isinstance(value, dict) and f.dataclass is not None:
        return f.dataclass(**value)
    if f.adapter is None:
        return value
    if isinstance(value, list) and any(typing.get_origin(t) is tuple for t in _walk(f.hint)):
        value = tuple(value)
    value = _yaml_float(f.hint, value)
    try:
        return f.adapter.validate_python(value, strict=True)
    except ValidationError as e:
        raise ValueError(_problem(e, path, value)) from None


def _yaml_float(hint, value):
    """PyYAML reads `1e-5` (no dot) as a string; a float setting takes it as the number it is."""
    types = {t for t in _walk(hint) if isinstance(t, type)}
    if isinstance(value, str) and float in types and str not in types:
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _problem(e: ValidationError, path: str, value) -> str:
    """pydantic's complaint as one line: `setting lora.r: input should be a valid integer, got 'x'`."""
    errs = e.errors(include_url=False)
    if len(errs) > 1 and all(x["loc"] and isinstance(x["loc"][0], str) for x in errs):  # no branch of a union fit
        names = " or ".join(dict.fromkeys(str(x["loc"][0]) for x in errs))
        return f"setting {path}: expected {names}, got {value!r}"
    x = errs[0]
    where = path + "".join(f"[{p}]" for p in x["loc"] if isinstance(p, int))
    msg = x["msg"].replace("a valid tuple", "a list")
    return f"setting {where}: {msg[:1].lower()}{msg[1:]}, got {x['input']!r}"


def check_passthrough(extra: dict, target, taken: set[str], where: str = "trainer") -> None:
    """Keys of a pass-through mapping (`trainer:` -> trl.SFTConfig / GRPOConfig) must be fields of `target` that the
    project does not already set; say which, before a library answers with a TypeError."""
    names = {f.name for f in dataclasses.fields(target)}
    if unknown := sorted(set(extra) - names):
        raise ValueError(f"{where}: {unknown} not field(s) of {target.__module__}.{target.__name__}")
    if clash := sorted(set(extra) & taken):
        raise ValueError(f"{where}: {clash} set by musacoder's own settings; set them there, not under {where}")
