"""User-facing errors: one clear line and exit code 2, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C (128 + SIGINT): a script chain stops there


class UserError(Exception):
    """A mistake the user can fix (wrong path, wrong game, empty DB...). The message is one line
    that says what is wrong and what to do."""


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's main; a UserError becomes ``error: <message>`` on stderr and exit 2."""
    try:
        rc = main()
    except UserError as e:
        fail(str(e))
    raise SystemExit(rc or 0)


def warn(message: str) -> None:
    """A problem that was skipped (a broken segment, a bad label line): one line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)
