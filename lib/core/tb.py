"""TensorBoard runs of every stage: one naming scheme, one hyper-parameter table, one tag scheme.
Run directories: ``<runs>/<name>__<stage>__<game>__s<seed>__<YYYYmmdd-HHMMSS>`` (CleanRL's habit).
Tags by prefix: ``charts/`` (scores, lengths, lr, speed), ``losses/``, ``eval/`` (held-out
measures), ``reward_model/`` (the learned reward in a run with -r), ``recorder/``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def run_dir(runs_dir: str | Path, name: str, stage: str, game: str, seed: int) -> Path:
    """Where one run's event files go (see the module doc)."""
    return Path(runs_dir) / f"{name}__{stage}__{game}__s{seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def hparams_table(rows: dict[str, Any]) -> str:
    """The hyper-parameters as a markdown table (TensorBoard's Text tab), sorted by name."""
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in sorted(rows.items()))
