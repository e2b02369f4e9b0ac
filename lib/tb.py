"""TensorBoard runs of every stage: one naming scheme, one hyper-parameter table, one tag scheme.

Run directories: ``<runs>/<name>__<stage>__<game>__s<seed>__<YYYYmmdd-HHMMSS>`` (CleanRL's habit:
what, which stage, which game, which seed, when), e.g. ``runs/v0__a2c__seaquest__s0__20261122-114500``.

Tags, by prefix:
- ``charts/``        how the run goes: game scores and lengths, lr, speed
- ``losses/``        the learner's losses (A2C: policy, value, entropy...; reward model: train, test)
- ``eval/``          held-out measures: A2C evaluation games, the reward model's test metrics
- ``reward_model/``  the learned reward inside a fine-tuning run (-r)
- ``recorder/``      segments written
"""

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
