"""Every fine-tune of one seed's rounds on one picture: the over-optimisation view of the
frozen-model test (docs/results.md). One curve per arm (a TensorBoard run under ``--out/tb`` named
``round-<arm>...``): the evaluation score, the learned return of the training games, the KL to the
start policy, the evaluation games' length and their share of steps at the surface.

    python -m experiments.compare_arms --out runs/round/seed1 --png docs/frozen_s1.png
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.round_report import _binned
from experiments.stages import tb_scalars
from lib.core.errors import UserError, run_cli
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import setting

PANELS = [
    ("eval/score_mean", "mean eval score (10 games)", False),
    ("finetune/learned_return", "learned return per training game", True),
    ("finetune/kl_to_start", "KL(pi || pi_start), training batches", True),
    ("eval/length_mean", "eval game length (agent steps)", False),
    ("eval/surface_share", "eval steps at the surface", False),
]


def arm_runs(tb: Path) -> list[str]:
    """The fine-tunes' run names under ``tb`` (v0 left out), each once."""
    names = {p.name.split("__")[0] for p in tb.glob("round-*__a2c__*") if p.is_dir()}
    return sorted(n for n in names if n != "round-v0")


def label(run: str) -> str:
    """A short legend label: the arm, and what its round directory says beyond the teacher."""
    short = run.removeprefix("round-").removesuffix("-r1").replace("-score-100", "")
    short = short.replace("ftterminalnonerewardscale0.05rewardnormlabels", "papers")
    return short.replace("ftrewardscale0.05rewardnormlabels", "std0.05+labels")[:48]


def figure(tb: Path):
    """The panels as a matplotlib figure, and (arm, mean eval score from 50% of the steps on, last
    eval score) per arm. An arm has one colour in every panel, also where another arm has no curve
    (the control has no learned return)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = arm_runs(tb)
    if not runs:
        raise UserError(f"no fine-tune runs (round-*__a2c__*) under {tb}")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.8))
    summary = []
    for i, run in enumerate(runs):
        for ax, (tag, _, dense) in zip(axes, PANELS, strict=True):
            steps, values = tb_scalars(tb, run, tag)
            if steps:
                x, y = _binned(steps, values) if dense else (np.asarray(steps), np.asarray(values))
                ax.plot(x, y, marker=None if dense else "o", label=label(run), color=f"C{i % 10}")
        steps, scores = tb_scalars(tb, run, "eval/score_mean")
        late = [v for s, v in zip(steps, scores, strict=True) if steps and s >= max(steps) / 2]
        summary.append((run, float(np.mean(late)) if late else math.nan, scores[-1] if scores else math.nan))
    for ax, (_, title, _) in zip(axes, PANELS, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("fine-tune agent steps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    return fig, summary


def plot(tb: Path, png: Path) -> list[tuple[str, float, float]]:
    """Draw the panels into ``png``; returns :func:`figure`'s summary."""
    import matplotlib.pyplot as plt

    fig, summary = figure(tb)
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return summary


@dataclass(frozen=True)
class CompareArmsSettings:
    """What ``python -m experiments.compare_arms`` is told, one field per flag."""

    out: Path = setting(Path("runs/round/seed0"), "one seed's directory of the rounds", group="files")
    png: Path | None = setting(None, "where the picture goes (default: --out/arms.png)", group="files", type=Path)


def build_parser() -> argparse.ArgumentParser:
    """The flags (``--help``), one per ``CompareArmsSettings`` field."""
    groups = {"files": "the rounds and the picture"}
    return settings_parser(CompareArmsSettings, "python -m experiments.compare_arms", __doc__.split("\n\n")[0], groups)


def main(argv: list[str] | None = None) -> None:
    args = CompareArmsSettings(**vars(build_parser().parse_args(argv)))
    tb = args.out / "tb"
    if not tb.is_dir():
        raise UserError(f"no TensorBoard directory {tb}: run python -m experiments.round first")
    png = args.png or args.out / "arms.png"
    for run, late, last in plot(tb, png):
        print(f"{run}: mean eval score from half-way on {late:.0f}, last {last:.0f}")
    print(png)


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
