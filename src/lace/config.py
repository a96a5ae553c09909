"""Dataclass configs: one docstring per field, loadable from YAML, overridable from the CLI.

A config is a plain `@dataclass` whose fields carry an attribute docstring:

    @dataclass
    class TrainConfig:
        steps: int = 1000
        '''Optimiser steps to run.'''

`add_config_arguments` turns every field into a `--flag` whose help is that docstring,
and `config_from_args` builds the dataclass from (defaults < YAML file < flags).

A field whose type is itself a dataclass config (for example `edit: EditConfig`) is nested:
each of its fields becomes `--<field>-<name>` (`--edit-strength`), and YAML gives it as a
mapping (`edit: {strength: 2.0}`), merged over the field's default.

A config may name other flags for its fields, nested ones by dotted path, in a class attribute
`FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]]` (`{"rerank.csls_k": ("--csls-k",)}`), so that a
config can nest what it runs and keep the flags its users know; `()` gives a field no flag (the config sets
it itself). YAML takes every flag's name as a
key too, underscored (`csls_k: 5`, `knn_index: ivf`, or `knn: faiss` for the field whose flag is
`--knn`): the flat names of a config from before it nested its parts keep working.

A config split by concern names its parts in `FLAT_PARTS: ClassVar[tuple[str, ...]]` (`TrainConfig`'s run, optim,
arm, negatives, log): a flat part's fields take the flags and YAML keys they would have at the top (`--lr`, `lr:`
for `optim.lr`), and `with_changes` takes them too, so one routing (`flags_as_fields`) reads YAML, flat changes
and the flags' names alike.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lace.errors import LaceInputError, input_error

ConfigT = TypeVar("ConfigT")


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each field of a dataclass to the docstring written under it."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body
        for node, following in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> Any:
    """Strip `Optional[...]`/`X | None` from a resolved annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _parse_value(annotation: Any, text: str) -> Any:
    base = _base_type(annotation)
    if text.lower() in ("none", "null") and base is not annotation:
        return None
    origin = typing.get_origin(base)
    if origin in (tuple, list):
        (item,) = typing.get_args(base)[:1] or (str,)
        items = [_parse_value(item, part) for part in text.split(",") if part.strip()]
        return tuple(items) if origin is tuple else items
    if base is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    if base in (int, float, str):
        return base(text)
    if base is Path:
        return Path(text)
    return text


def _help_text(doc: str, default: Any) -> str:
    """The field's docstring plus its default, written as a user would type it on the command line."""
    if isinstance(default, (tuple, list)):
        default = ",".join(str(item) for item in default) or "none"
    # the docstring may already say what happens when unset; argparse reads % as a format
    text = doc if "(default" in doc else f"{doc} (default: {default})"
    return text.replace("%", "%%")


def _nested(annotation: Any) -> type | None:
    """The dataclass a field nests, or None for a plain field."""
    base = _base_type(annotation)
    return base if isinstance(base, type) and dataclasses.is_dataclass(base) else None


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return field.default if field.default is not dataclasses.MISSING else None


def _own_flags(cls: type, flags: dict[str, tuple[str, ...]] | None) -> dict[str, tuple[str, ...]]:
    """Field path (relative to `cls`, dotted for nested fields) -> flag names: the config's own `FLAG_NAMES`,
    under `flags`."""
    return {**getattr(cls, "FLAG_NAMES", {}), **(flags or {})}


def _inner_flags(flags: dict[str, tuple[str, ...]], name: str) -> dict[str, tuple[str, ...]]:
    """The entries of `flags` for the fields nested in field `name`, relative to it."""
    return {key[len(name) + 1:]: names for key, names in flags.items() if key.startswith(f"{name}.")}


@cache
def flag_dests(cls: type) -> dict[str, str]:
    """Each flag of `cls` (underscored, without the dashes: `csls_k`) -> the dotted field path it sets."""
    dests: dict[str, str] = {}

    def walk(klass: type, prefix: str, flag_prefix: str, flags: dict[str, tuple[str, ...]]) -> None:
        hints = typing.get_type_hints(klass)
        flags = _own_flags(klass, flags)
        for field in dataclasses.fields(klass):
            dest = prefix + field.name
            nested = _nested(hints[field.name])
            if nested is not None:
                walk(nested, dest + ".", _inner_flag_prefix(klass, field.name, flag_prefix),
                     _inner_flags(flags, field.name))
                continue
            for flag in flags.get(field.name, (_flag(flag_prefix + field.name),)):
                dests[flag.removeprefix("--").replace("-", "_")] = dest

    walk(cls, "", "", {})
    return dests


def _inner_flag_prefix(cls: type, name: str, flag_prefix: str) -> str:
    """The flag-name prefix of the fields nested in field `name` of `cls`: `<name>_` added, but for a flat part."""
    return flag_prefix if name in getattr(cls, "FLAT_PARTS", ()) else f"{flag_prefix}{name}_"


@cache
def flat_paths(cls: type) -> dict[str, str]:
    """Each field of `cls`'s flat parts (at any depth of flat parts) by its own name -> its dotted path
    (`lr` -> `optim.lr`, `edit` -> `negatives.edit`)."""
    paths: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for part in getattr(cls, "FLAT_PARTS", ()):
        nested = _nested(hints[part])
        paths.update({name: f"{part}.{path}" for name, path in flat_paths(nested).items()})
        paths.update({field.name: f"{part}.{field.name}" for field in dataclasses.fields(nested)})
    return paths


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
    flags: dict[str, tuple[str, ...]] | None = None, prefix: str = "", defaults: Any = None,
    flag_prefix: str | None = None,
) -> None:
    """Add one `--flag` per field of dataclass `cls`, with the field's docstring as help.

    Flags default to `None` so that `config_from_args` can tell what the user set.
    Booleans take `--flag` / `--no-flag`; `skip` names fields left out (`"finetune.edit"` for a nested one,
    which then keeps its default). `flags` gives a field other flag names (for
    example `{"output": ("--out", "--output")}`, or `{"edit.n_edits": ("--edit-n-edits", "--n-edits")}` for a
    nested field), so commands can share flag names and keep the names of fields that moved into a nested config;
    they win over the config's own `FLAG_NAMES`, and `()` gives a field no flag.
    A nested dataclass field adds its own fields as `--<field>-<name>` (dest `<field>.<name>`),
    their defaults read from the field's default (`defaults`, for the nested call); the fields of a flat part
    (named in the config's `FLAT_PARTS`) take `--<name>` (`flag_prefix`, for the nested call).
    """
    flag_prefix = prefix.replace(".", "_") if flag_prefix is None else flag_prefix
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    flags = _own_flags(cls, flags)
    group = parser.add_argument_group(f"{cls.__name__} ({prefix.rstrip('.')})" if prefix else cls.__name__)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        annotation = hints[field.name]
        default = getattr(defaults, field.name) if defaults is not None else _default(field)
        nested = _nested(annotation)
        if nested is not None:
            inner = f"{field.name}."
            add_config_arguments(parser, nested, prefix=f"{prefix}{inner}", defaults=default,
                                 skip=tuple(name[len(inner):] for name in skip if name.startswith(inner)),
                                 flags=_inner_flags(flags, field.name),
                                 flag_prefix=_inner_flag_prefix(cls, field.name, flag_prefix))
            continue
        help_text = _help_text(docs.get(field.name, ""), default)
        dest = prefix + field.name
        names = flags.get(field.name, (_flag(flag_prefix + field.name),))
        if not names:  # the config sets this field itself: no flag
            continue
        if _base_type(annotation) is bool:
            group.add_argument(
                *names, dest=dest, action=argparse.BooleanOptionalAction,
                default=None, help=help_text,
            )
        else:
            group.add_argument(
                *names, dest=dest, default=None, metavar=field.name.upper(),
                type=lambda text, a=annotation: _parse_value(a, text), help=help_text,
            )


def config_from_dict(cls: type[ConfigT], values: dict[str, Any], source: str = "config") -> ConfigT:
    """Build `cls` from a mapping, naming the source and the field on bad keys, values or types.

    Values are checked against the field's type: text is parsed as a flag would be, an int is
    accepted for a float, a number for a string, a list for a tuple; anything else that does not
    match (a list for an int, a mapping for a string) is a `LaceInputError`. A key may also be a flag's
    name (`csls_k` for `--csls-k`): its value goes to the field the flag sets.
    """
    values = flags_as_fields(cls, values, source)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(key) for key in set(values) - names)
    if unknown:
        refuse_set_elsewhere(cls, values, None, source)
        raise LaceInputError(
            f"{source}: unknown field(s) {unknown} for {cls.__name__}; expected some of {sorted(names)}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = sorted(name for name, f in fields.items() if name not in values and f.init
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise LaceInputError(f"{source}: missing required field(s) {missing} for {cls.__name__}")
    converted = {}
    for key, value in values.items():
        nested = _nested(hints[key])
        if nested is not None and isinstance(value, dict):
            refuse_set_elsewhere(nested, value, key, source)
            default = _default(fields[key])
            value = flags_as_fields(nested, value, f"{source}: field '{key}'")  # flat keys into their parts first
            written = flags_as_fields(nested, config_to_dict(default)) if default is not None else {}
            merged = _merged(written, value)
            value = config_from_dict(nested, merged, source=f"{source}: field '{key}'")
        else:
            value = _typed_value(hints[key], value, f"{source}: field '{key}'")
        converted[key] = value
    try:
        return cls(**converted)
    except ValueError as error:  # a config's own checks (`__post_init__`), named with the source
        raise LaceInputError(f"{source}: {error}") from error


def refused_setting(where: str, field: str, expected: str, setter: str, why: str, got: Any) -> LaceInputError:
    """The one error of a config given a setting made elsewhere: `<where>: field '<field>': expected <expected>:
    <setter> sets it (<why>) (got <got>)`."""
    return input_error(where, field, f"{expected}: {setter} sets it" + (f" ({why})" if why else ""), got)


def refuse_set_fields(where: str, part: str, given: Any, default: Any, names: tuple[str, ...], setter: str,
                      why: str = "") -> None:
    """Refuse a field of `given` (the nested config `part`) among `names` that differs from `default`'s: `setter`
    sets it itself, so a value given there would be silently replaced."""
    for name in names:
        value, expected = getattr(given, name), getattr(default, name)
        if value != expected:
            raise refused_setting(where, f"{part}.{name}", repr(expected), setter, why, value)


def refuse_set_elsewhere(cls: type, values: dict[str, Any], name: str | None, source: str) -> None:
    """Refuse each key of `values` (given for field `name`, a `cls`; or for `cls` itself) that `cls` does not hold but
    the whole config it is the user's share of does (`SET_ELSEWHERE = (whole, setter, why)`: a ground's fine-tune
    holds the parts of a `TrainConfig` its user sets, the ground sets the rest)."""
    whole, setter, why = getattr(cls, "SET_ELSEWHERE", (None, "", ""))
    if whole is None:
        return
    own = {f.name for f in dataclasses.fields(cls)} | set(flat_paths(cls)) | set(flag_dests(cls))
    theirs = {f.name for f in dataclasses.fields(whole)} | set(flat_paths(whole)) | set(flag_dests(whole))
    for key, value in values.items():
        if key not in own and key in theirs:
            raise refused_setting(source, f"{name}.{key}" if name else key, "no setting here", setter, why, value)


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` on top, mappings inside merged too (a nested config's nested config keeps the
    defaults its parent gave it)."""
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) \
            else value
    return merged


def flags_as_fields(cls: type, values: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """`values` with each key that names a flag of a nested field (`knn_index`, or `knn: faiss` where `--knn`
    sets `knn.backend`) moved into the mapping of that nested field; a mapping under a key that is no field but
    the prefix of flags (`edit: {strength: 2}` for `--edit-strength`) is read as those flags; a key that names a
    field of a flat part (`lr` for `optim.lr`, `edit` for `negatives.edit`) moves into that part's mapping."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    dests = flag_dests(cls)
    values = copy.deepcopy(values)  # the nested mappings are filled in below; the caller's stay as they were
    for key in [key for key, value in values.items() if key not in fields and isinstance(value, dict)
                and value and all(f"{key}_{inner}" in dests for inner in value)]:
        values.update({f"{key}_{inner}": value for inner, value in values.pop(key).items()})  # edit: {strength: 2}
    routed = {key: value for key, value in values.items()
              if key in fields and not (_nested(hints[key]) is not None and not isinstance(value, dict)
                                        and "." in dests.get(key, ""))}
    paths = {**flat_paths(cls), **{flag: dest for flag, dest in dests.items() if "." in dest}}
    for key, value in values.items():
        if key in routed or str(key) not in paths:
            routed.setdefault(key, value)  # a plain field, or an unknown key for the caller to name
            continue
        key = str(key)
        *path, name = paths[key].split(".")
        target = routed
        for part in path:
            inner = target.setdefault(part, {})
            if not isinstance(inner, dict):
                raise LaceInputError(f"{source}: field '{key}' sets '{paths[key]}', but field '{part}' is not "
                                     f"a mapping (got {inner!r})")
            target = inner
        if name in target and target[name] != value:
            raise LaceInputError(f"{source}: field '{key}' sets '{paths[key]}', which is also given "
                                 f"({target[name]!r}, not {value!r})")
        target[name] = value
    return routed


def _typed_value(annotation: Any, value: Any, where: str) -> Any:
    """`value` as a field of type `annotation` holds it, or a `LaceInputError` naming `where`."""
    base = _base_type(annotation)
    if value is None and base is not annotation:
        return None
    if _nested(annotation) is not None and not isinstance(value, base):
        raise LaceInputError(f"{where}: expected a mapping of {base.__name__} fields (got {value!r})")
    if isinstance(value, str) and base is not str:
        try:
            return _parse_value(annotation, value)
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise LaceInputError(f"{where}: {error}") from error
    origin, args = typing.get_origin(base), typing.get_args(base)
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (tuple, list) and isinstance(value, (list, tuple)):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if args and len(value) != len(args):
                raise LaceInputError(f"{where}: expected {len(args)} items (got {value!r})")
            items = [_typed_value(a, v, where) for a, v in zip(args, value)] if args else list(value)
        else:
            items = [_typed_value(args[0], v, where) for v in value] if args else list(value)
        return tuple(items) if origin is tuple else items
    if isinstance(value, bool) and base in (int, float):  # a bool is an int to Python, not to a config
        raise LaceInputError(f"{where}: expected {getattr(base, '__name__', base)}, not true/false (got {value!r})")
    if base is int and is_number and float(value).is_integer():
        return int(value)
    if base is float and is_number:
        return float(value)
    if base is str and is_number:
        return str(value)
    if isinstance(base, type) and isinstance(value, base):
        return value
    if not isinstance(base, type) and origin is None:  # a type this loader does not check (Any, a TypeVar)
        return value
    expected = getattr(base, "__name__", str(base))
    raise LaceInputError(f"{where}: expected {'a list' if origin in (tuple, list) else expected}"
                         f"{' or none' if base is not annotation else ''} (got {value!r})")


def load_config(cls: type[ConfigT], path: str | Path) -> ConfigT:
    """Read a YAML file of field values into `cls`."""
    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: config file not found")
    try:  # config sits beside lace.io, not above it, so it reads the file itself
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise LaceInputError(f"{path}: not UTF-8 text ({error})") from error
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise LaceInputError(f"{path}: not valid YAML ({error})") from error
    if not isinstance(values, dict):
        raise LaceInputError(f"{path}: expected a mapping of field: value at the top level")
    return config_from_dict(cls, values, source=str(path))


def config_from_args(cls: type[ConfigT], args: argparse.Namespace, yaml_path: str | Path | None = None,
                     prefix: str = "", base: ConfigT | None = None) -> ConfigT:
    """Defaults (`base`, or `cls()`), then the YAML file (if any), then the flags the user actually gave (added
    with the same `prefix` by `add_config_arguments`)."""
    if yaml_path:
        base = load_config(cls, yaml_path)
    return _with_flags(base if base is not None else cls(), args, prefix)


def _with_flags(config: Any, args: argparse.Namespace, prefix: str) -> Any:
    """`config` with the flags the user gave (dest `prefix + name`), nested configs included."""
    hints = typing.get_type_hints(type(config))
    overrides = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if _nested(hints[field.name]) is not None and value is not None:
            nested = _with_flags(value, args, f"{prefix}{field.name}.")
            if nested != value:
                overrides[field.name] = nested
        elif getattr(args, prefix + field.name, None) is not None:
            overrides[field.name] = getattr(args, prefix + field.name)
    return dataclasses.replace(config, **overrides) if overrides else config


def with_changes(config: ConfigT, changes: dict[str, Any], source: str = "changes") -> ConfigT:
    """`config` with `changes`: values by field, or by the keys YAML takes (a flat part's field, a flag's name);
    a mapping given for a nested config changes only the fields it names. Values are taken as given (no parsing:
    `config_from_dict` reads text)."""
    changes = flags_as_fields(type(config), changes, source)
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(str(key) for key in set(changes) - names)
    if unknown:
        refuse_set_elsewhere(type(config), changes, None, source)
        raise LaceInputError(f"{source}: unknown field(s) {unknown} for {type(config).__name__}; expected some of "
                             f"{sorted(names | set(flat_paths(type(config))))}")
    resolved = {}
    for name, value in changes.items():
        current = getattr(config, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            refuse_set_elsewhere(type(current), value, name, source)
            value = with_changes(current, value, f"{source}: field '{name}'")
        resolved[name] = value
    return dataclasses.replace(config, **resolved)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config (paths as strings, tuples as lists), the fields of its flat parts (`FLAT_PARTS`)
    at the top by the names YAML takes for them: the form a config is written in (run folders' config.json, stage
    keys, results), which reads back through `config_from_dict` like any YAML."""
    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if dataclasses.is_dataclass(value):
            return config_to_dict(value)
        return value

    values = {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    for part in getattr(config, "FLAT_PARTS", ()):
        values.update(values.pop(part))
    return values
