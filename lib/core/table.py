"""The one table format every benchmark prints: figure | value | unit | setting."""

from __future__ import annotations

import sys

HEADER = ("figure", "value", "unit", "setting")


def print_table(title: str, rows: list[tuple[str, str, str, str]]) -> None:
    """Print ``rows`` as a Markdown table under ``## title``; values are right-aligned."""
    w = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(4)]
    print(f"\n## {title}")
    print(f"| {HEADER[0]:<{w[0]}} | {HEADER[1]:>{w[1]}} | {HEADER[2]:<{w[2]}} | {HEADER[3]:<{w[3]}} |")
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for f, v, u, s in rows:
        print(f"| {f:<{w[0]}} | {v:>{w[1]}} | {u:<{w[2]}} | {s:<{w[3]}} |")
    sys.stdout.flush()


class Rows(list):
    """A benchmark's rows that also go to stderr as each is measured: a run stopped before its
    table (a time limit, Ctrl-C) still leaves every figure it got in the log."""

    def append(self, row: tuple[str, str, str, str]) -> None:
        super().append(row)
        print("  row: " + " | ".join(row), file=sys.stderr, flush=True)
