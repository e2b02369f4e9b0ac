"""What the experiments' command lines share, beside ``lib.core.settings`` (the one way a setting is
declared): the settings several experiments take alike, each with its one default (a device, a
seed, a JSON file of rows), a check of a count, the ``--help`` formatter of an experiment whose
description is its module docstring, laid out as written; and the two ways an experiment talks to
a stage it runs as a process: a config written as the stage's flags (``to_argv``), and the flags a
person passed through to it read as that stage reads them (``given_flags``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from lib.core.errors import UserError
from lib.core.settings import SEED_CHECKS, Check, DefaultsOnceFormatter, setting

if TYPE_CHECKING:
    from lib.a2c.config import A2CConfig


def at_least_one(message: str) -> tuple[Check]:
    """A check that a count is at least 1, refused with ``message``."""
    return ((lambda v: v >= 1, message),)


def dev_setting(help: str, group: str) -> Any:
    """``--dev``: the torch device the experiment's stages run on (cpu, the default)."""
    return setting("cpu", help, group=group)


def seed_setting(help: str, group: str) -> Any:
    """``--seed``: 0 by default, in the one range every stage takes (``lib.core.settings``)."""
    return setting(0, help, group=group, checks=SEED_CHECKS)


def rows_out_setting(group: str) -> Any:
    """``--out``: a JSON file the experiment's rows are written to (none by default)."""
    return setting(None, "write the rows as JSON here", group=group, type=Path)


def check_out(out: Path | None, kind: str = ".json") -> None:
    """``--out`` checked before the work: a file name (``kind``) in a directory this process can
    write (the missing directories are made at the end); None passes."""
    if out is None:
        return
    if out.is_dir():
        raise UserError(f"--out {out} is a directory: give a file name ({kind})")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write --out {out}: {parent} is not a writable directory")


class RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter, DefaultsOnceFormatter):
    """``lib.core.settings``' ``--help`` (each default shown once) with the description's lines kept as
    written: for a description that is a module docstring with lists and commands."""


def to_argv(parser: argparse.ArgumentParser, cfg: Any) -> list[str]:
    """``cfg`` as the documented flags of ``parser`` (the long names), for a caller that runs the
    stage as a process: parsing the result gives ``cfg`` back. Only what differs from the
    defaults is written, so the command reads as a person would type it."""
    argv: list[str] = []
    for action in parser._actions:
        if action.dest in ("help", argparse.SUPPRESS):  # -h, and a retired flag (``lib.core.settings.retire``)
            continue
        value = getattr(cfg, action.dest)
        if not action.option_strings:
            if value != action.default or action.default is None:
                argv += [str(value)] if not isinstance(value, list) else [str(v) for v in value]
            continue
        if value == action.default and not action.required:
            continue
        flag = max(action.option_strings, key=len)
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            argv += [flag]
        elif isinstance(value, list):
            argv += (
                [flag, *map(str, value)]
                if action.nargs not in (None, "?")
                else [f for v in value for f in (flag, str(v))]
            )  # noqa: E501
        else:
            argv += [flag, str(value)]
    return argv


def a2c_argv(cfg: A2CConfig) -> list[str]:
    """``cfg`` as ``01_a2c.py``'s documented flags: ``parse_config(a2c_argv(cfg)) == cfg``."""
    from lib.a2c.cli import build_parser

    return to_argv(build_parser(), cfg)


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The settings ``argv`` gives, read by ``parser`` as its script reads them (a prefix such as
    ``--sav``, an attached ``-m/x``, ``--kl=1``), by destination: a flag given is kept even at its
    default, one not given is left out. ValueError with argparse's one line for what the script would
    refuse. ``parser`` is changed (its defaults dropped): pass a fresh one."""

    def refuse(message: str) -> NoReturn:
        raise ValueError(message)

    def asked_for_help(status: int = 0, message: str | None = None) -> NoReturn:
        raise ValueError("-h / --help asks for the help text")

    for action in parser._actions:
        if action.option_strings:
            action.default, action.required = argparse.SUPPRESS, False
    parser.error, parser.exit, parser.print_help = refuse, asked_for_help, lambda file=None: None  # type: ignore[method-assign]
    return vars(parser.parse_args(argv))
