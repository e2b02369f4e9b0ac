"""The ``--help`` formatter of the stages' command lines."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class DefaultsOnceFormatter(argparse.HelpFormatter):
    """``--help`` with each flag's default shown once: appended as ``(default: X)`` unless the help
    text already names its default, and left out where there is none (``None``, a switch, a
    required flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "(default" in text
            or action.required
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


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
