"""The ``--help`` formatter of the stages' command lines."""

from __future__ import annotations

import argparse


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
