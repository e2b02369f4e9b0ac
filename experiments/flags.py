"""What the experiments' command lines share, beside ``lib.settings`` (the one way a setting is
declared): the settings several experiments take alike, each with its one default (a device, a
seed, a JSON file of rows), a check of a count, and the ``--help`` formatter of an
experiment whose description is its module docstring, laid out as written."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lib.cli_help import DefaultsOnceFormatter
from lib.seeds import SEED_CHECKS
from lib.settings import Check, setting


def at_least_one(message: str) -> tuple[Check]:
    """A check that a count is at least 1, refused with ``message``."""
    return ((lambda v: v >= 1, message),)


def dev_setting(help: str, group: str) -> Any:
    """``--dev``: the torch device the experiment's stages run on (cpu, the default)."""
    return setting("cpu", help, group=group)


def seed_setting(help: str, group: str) -> Any:
    """``--seed``: 0 by default, in the one range every stage takes (``lib.seeds``)."""
    return setting(0, help, group=group, checks=SEED_CHECKS)


def rows_out_setting(group: str) -> Any:
    """``--out``: a JSON file the experiment's rows are written to (none by default)."""
    return setting(None, "write the rows as JSON here", group=group, type=Path)


class RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter, DefaultsOnceFormatter):
    """``lib.settings``' ``--help`` (each default shown once) with the description's lines kept as
    written: for a description that is a module docstring with lists and commands."""
