"""The benchmarks' one table format (lib/core/table.py)."""

from __future__ import annotations

import pytest

from lib.core.table import Rows, print_table


def test_rows_reach_stderr_as_measured_and_the_table_comes_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    rows = Rows()
    rows.append(("A2C training", "2,781", "agent steps/s", "16 envs, cuda"))
    first = capsys.readouterr()
    # Before any table: a run stopped here still leaves the figure in its log.
    assert first.err == "  row: A2C training | 2,781 | agent steps/s | 16 envs, cuda\n" and first.out == ""
    rows.append(("cores", "16", "cores", "this process may use"))
    print_table("bench", rows)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "## bench" and out[-2].startswith("| A2C training | 2,781 |") and out[-1].startswith("| cores")
