"""A run's options as one dataclass: command-line flags, a YAML file and ``--help`` from the same fields.

Every field of a config dataclass is a flag (``lora_rank`` -> ``--lora-rank``; a field's metadata may
name another flag, e.g. ``--env-arg`` for ``env_args``) and a key of the YAML file given with
``--config`` (``lora_rank`` or ``lora-rank``). Precedence: a flag given on the command line > the YAML
file > the field's default. The help text of a flag is the field's docstring (the string literal under
it in the class body) with its default; ``--print-config`` prints the resolved options as YAML, a file
``--config`` takes back.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import json
import math
import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

NONE_WORDS = ("none", "null")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring of every field of ``cls`` (and its dataclass bases): the string literal that follows
    the field's annotated assignment in the class body, whitespace folded."""
    return dict(_field_docs(cls))


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    # Parsed once per class and process: CPython 3.11.7's AST constructor can raise a spurious
    # SystemError ("recursion depth mismatch") in a process that hit deep recursion before.
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, [*body[1:], None], strict=True):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


# -- types ----------------------------------------------------------------------------------------
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parts(hint: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether ``None`` is allowed)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        return (args[0] if len(args) == 1 else hint), optional
    return hint, False


def parse_bool(value: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
    try:
        return words[value.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}") from None


def parse_kv(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE parsed as JSON when it is JSON, else kept as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _scalar_parser(kind: Any, optional: bool) -> Callable[[str], Any]:
    if kind is bool:
        base: Callable[[str], Any] = parse_bool
    elif kind is int:

        def base(value: str) -> int:
            try:
                return int(value)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None

    elif kind is float:

        def base(value: str) -> float:
            try:
                return float(value)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None

    else:
        base = str
    if not optional:
        return base

    def optional_value(value: str) -> Any:
        return None if value.strip().lower() in NONE_WORDS else base(value)

    return optional_value


def _metavar(kind: Any, optional: bool, field_name: str) -> str:
    if kind is str:
        return field_name.upper()
    name = {bool: "BOOL", int: "N", float: "X"}.get(kind, "VALUE")
    return f"{name}|none" if optional else name


def flag_of(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("flag") or "--" + field.name.replace("_", "-"))


def shown_default(field: dataclasses.Field[Any], value: Any) -> str:
    """What ``--help`` says the default is: the field's ``default_text`` metadata, else its value."""
    if "default_text" in field.metadata:
        return str(field.metadata["default_text"])
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value) if value else "none"
    return str(value)


def _mark_given(namespace: argparse.Namespace, dest: str) -> None:
    namespace._given = {*getattr(namespace, "_given", set()), dest}


def _was_given(namespace: argparse.Namespace, dest: str) -> bool:
    return dest in getattr(namespace, "_given", set())


class _Given(argparse.Action):
    """Stores the value and records that the flag was given (so it wins over the YAML file)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _mark_given(namespace, self.dest)


class _GivenPairs(argparse.Action):
    """``KEY=VALUE``, repeatable: a dict (the first one given replaces the default)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        current = dict(getattr(namespace, self.dest) or {}) if _was_given(namespace, self.dest) else {}
        key, value = values
        current[key] = value
        setattr(namespace, self.dest, current)
        _mark_given(namespace, self.dest)


class _GivenList(argparse.Action):
    """Repeatable: a list (the first one given replaces the default)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        current = list(getattr(namespace, self.dest) or []) if _was_given(namespace, self.dest) else []
        setattr(namespace, self.dest, [*current, values])
        _mark_given(namespace, self.dest)


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, *, groups: dict[str, str] | None = None, skip: tuple[str, ...] = ()
) -> None:
    """One flag per field of ``cls`` (help from its docstring and default), plus ``--config`` and
    ``--print-config``. ``groups`` maps a field to the name of its help section (in order of appearance)."""
    docs = field_docs(cls)
    hints = _hints(cls)
    defaults = cls()
    sections: dict[str, Any] = {}
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="options from a YAML file whose keys are these flags' names (lora_rank or lora-rank); "
                             "flags given here win")  # fmt: skip
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved options as YAML (a file --config reads) and exit")  # fmt: skip
    for field in dataclasses.fields(cls):
        if field.name in skip or not field.init:
            continue
        group_name = (groups or {}).get(field.name)
        target: Any = parser
        if group_name:
            target = sections.setdefault(group_name, parser.add_argument_group(group_name))
        default = getattr(defaults, field.name)
        doc = docs.get(field.name, "")
        help_text = f"{doc} (default: {shown_default(field, default)})".strip().replace("%", "%%")
        kind, optional = _parts(hints[field.name])
        origin = typing.get_origin(kind)
        if origin is dict:
            target.add_argument(flag_of(field), dest=field.name, action=_GivenPairs, type=parse_kv, default=default,
                                metavar="KEY=VALUE", help=help_text + " (repeatable)")  # fmt: skip
        elif origin is list:
            (item,) = typing.get_args(kind)
            target.add_argument(flag_of(field), dest=field.name, action=_GivenList, type=_scalar_parser(item, False),
                                default=default, metavar=_metavar(item, False, field.name),
                                help=help_text + " (repeatable)")  # fmt: skip
        else:
            parse = _scalar_parser(kind, optional)
            target.add_argument(flag_of(field), dest=field.name, action=_Given, type=parse, default=default,
                                metavar=_metavar(kind, optional, field.name), help=help_text)  # fmt: skip


class ConfigError(ValueError):
    """Options that cannot make a config (unknown YAML key, wrong type, unreadable file)."""


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError('YAML options need the pyyaml package: pip install "agentboost[local]"') from None
    return yaml


def load_yaml(path: str | Path, cls: type) -> dict[str, Any]:
    """The options of a YAML file, checked against the fields of ``cls`` (names and types)."""
    yaml = _yaml()
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"--config {path}: not valid YAML{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of option names to values, got {type(data).__name__}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"--config {path}: unknown option {key!r}{hint}")
        out[name] = _check_type(value, hints[name], f"--config {path}: {key}")
    return out


def _check_type(value: Any, hint: Any, where: str) -> Any:
    kind, optional = _parts(hint)
    container = typing.get_origin(kind) in (dict, list)
    if isinstance(value, str) and value.strip().lower() in NONE_WORDS and (optional or container):
        value = None  # what the flag's "none" means (--wandb-project none: no W&B; --sft-steps none)
    if value is None:
        if optional or typing.get_origin(kind) in (dict, list):
            return {} if typing.get_origin(kind) is dict else ([] if typing.get_origin(kind) is list else None)
        raise ConfigError(f"{where} must not be empty")
    origin = typing.get_origin(kind)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return {str(k): v for k, v in value.items()}
    if origin is list:
        (item,) = typing.get_args(kind)
        values = value if isinstance(value, list) else [value]
        return [_check_type(v, item, where) for v in values]
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def resolve_options(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The field values of ``cls``: the field defaults, then ``--config``'s YAML, then the flags given."""
    given = set(getattr(args, "_given", set()))
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(args, f.name)}
    if getattr(args, "config", None):
        from_file = load_yaml(args.config, cls)
        for name, value in from_file.items():
            if name not in given:
                values[name] = value
    return values


def to_yaml(cfg: Any) -> str:
    """The config as YAML, every field in declaration order (``--config`` reads it back)."""
    yaml = _yaml()

    data = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    for name, value in data.items():
        if isinstance(value, float) and not math.isfinite(value):
            data[name] = str(value)
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True))
