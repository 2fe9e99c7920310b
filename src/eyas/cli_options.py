"""The `eyas` verbs of the stages, generated from their pydantic configs: one definition per option.

A stage's option is its config field: the flag is the field's name with dashes, the help is its
description with its default and choices, the type follows the annotation. Every verb spells options
the same way: a boolean is `--name/--no-name`; a `Literal` is a choice among its values (shown as `<a|b>`); a list of
numbers is one comma-separated value (`--layers 2,16,29`); a list of paths is repeated (`--data a
--data b`); a mapping is YAML (`--chat-template-kwargs '{enable_thinking: false}'`). A field marked
`ARGUMENT` is the positional argument instead. Every option defaults to "not given", so that the
config file and the dotted overrides fill what the flags leave (`eyas.config.load_stage_config`).

Typer builds the command from the generated function's signature; pydantic validates the values,
so a bad value is refused with the same message from a flag, a config file or an override.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import typer
import yaml
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from eyas.config import ARGUMENT_KEY, StageConfig, load_stage_config, load_yaml
from eyas.errors import EyasError

_CONFIG = inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
    Optional[Path], typer.Option("--config", "-c", help="YAML file with stage sections (docs/config.md).")])
_OVERRIDES = inspect.Parameter("overrides", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
    Optional[list[str]], typer.Argument(help="Dotted overrides, e.g. train.lr=3e-4 (docs/config.md).")])


def _bare(annotation: Any) -> Any:
    """Return `annotation` without `None` and pydantic's `Annotated` constraints (`PositiveInt` -> int)."""
    if typing.get_origin(annotation) is Annotated:
        return _bare(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (Union, types.UnionType):
        kept = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(kept) == 1:
            return _bare(kept[0])
    return annotation


def _help(field: FieldInfo) -> str:
    """Return the option's help: the field's description and its default."""
    text = field.description or ""
    if not field.is_required() and field.default not in (None, PydanticUndefined) and field.default_factory is None:
        shown = field.default if not isinstance(field.default, bool) else str(field.default).lower()
        text += f" (default {shown})"
    return text


def _option(name: str, field: FieldInfo) -> tuple[inspect.Parameter, Callable[[Any], Any], bool]:
    """Return the typer parameter of config field `name`, the function turning its CLI value into the
    config value, and whether it is the positional argument; refuses (TypeError) an annotation the CLI
    cannot spell, a bug in a config class that the CLI tests meet."""
    kind = _bare(field.annotation)
    flag = "--" + name.replace("_", "-")
    convert: Callable[[Any], Any] = lambda value: value  # noqa: E731 - the identity
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if kind is bool:
        cli_type: Any = Optional[bool]
        declared = (f"{flag}/--no-{name.replace('_', '-')}",)
    elif typing.get_origin(kind) is Literal:  # typer shows and checks the choices
        cli_type, declared = Optional[kind], (flag,)
    elif typing.get_origin(kind) is list and _bare(typing.get_args(kind)[0]) is Path:
        cli_type, declared = Optional[list[Path]], (flag,)
    elif typing.get_origin(kind) is list and _bare(typing.get_args(kind)[0]) is int:
        cli_type, declared = Optional[str], (flag,)
        convert = _int_list(flag)
    elif typing.get_origin(kind) is dict:
        cli_type, declared = Optional[str], (flag,)
        convert = _mapping(flag)
    elif kind in (Path, int, float, str):
        cli_type, declared = Optional[kind], (flag,)
    else:
        raise TypeError(f"{name}: {field.annotation!r} has no command-line spelling")
    help_text = _help(field)
    if extra.get(ARGUMENT_KEY):
        marker: Any = typer.Argument(help=help_text, show_default=False)
    else:
        marker = typer.Option(*declared, help=help_text, show_default=False)
    parameter = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=Annotated[cli_type, marker])
    return parameter, convert, bool(extra.get(ARGUMENT_KEY))


def _int_list(flag: str) -> Callable[[str], list[int]]:
    def parse(value: str) -> list[int]:
        try:
            return [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise EyasError(f"{flag} {value!r}: expected comma-separated integers, e.g. 2,16,29") from None
    return parse


def _mapping(flag: str) -> Callable[[str], dict[str, Any]]:
    def parse(value: str) -> dict[str, Any]:
        try:
            mapping = load_yaml(value)
        except yaml.YAMLError:  # a duplicate key included
            mapping = None
        if not isinstance(mapping, dict):
            raise EyasError(f"{flag} {value!r}: expected a YAML mapping, e.g. '{{enable_thinking: false}}'")
        return mapping
    return parse


def config_command(config_class: type[StageConfig], stage: str, work: Callable[[Any], None],
                   doc: str) -> Callable[..., None]:
    """Return the typer command of `stage`: one option per field of `config_class`, then `--config` and
    the overrides; it loads the config (flags over the file, overrides over both) and calls `work` with it."""
    arguments, options, converters = [], [], {}
    for name, field in config_class.model_fields.items():
        parameter, converters[name], positional = _option(name, field)
        (arguments if positional else options).append(parameter)

    def command(**given: Any) -> None:
        config_file, overrides = given.pop("config"), given.pop("overrides")
        flags = {name: converters[name](value) for name, value in given.items() if value is not None}
        work(load_stage_config(config_class, stage, config_file, flags, overrides))

    command.__signature__ = inspect.Signature([*arguments, *options, _CONFIG, _OVERRIDES])  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = stage.replace("-", "_")
    return command
