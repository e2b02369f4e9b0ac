"""Plot the evaluation curves (``eval/score_mean`` with its std band) of one or more 01_a2c.py
runs from their TensorBoard logs, one line per run: a before/after learning check at a glance.

    python -m bench.plot_eval runs/v0__a2c__seaquest__s0__... runs/v0b__... --labels before after -o eval.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def curve(run: Path, tag: str) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return [], []
    events = acc.Scalars(tag)
    return [e.step for e in events], [e.value for e in events]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="TensorBoard run directories of 01_a2c.py")
    ap.add_argument("--labels", nargs="+", help="one legend label per run (default: the directory names)")
    ap.add_argument("-o", "--out", type=Path, default=Path("eval.png"), help="the PNG to write")
    ap.add_argument("--title", default="evaluation score (10 full games)", help="the plot's title")
    args = ap.parse_args()
    labels = args.labels or [r.name for r in args.runs]
    if len(labels) != len(args.runs):
        print("error: give one --labels entry per run", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run, label in zip(args.runs, labels, strict=True):
        steps, mean = curve(run, "eval/score_mean")
        if not steps:
            print(f"error: {run} has no eval/score_mean scalars", file=sys.stderr)
            return 2
        _, std = curve(run, "eval/score_std")
        (line,) = ax.plot(steps, mean, marker="o", label=label)
        if len(std) == len(mean):
            lo = [m - s for m, s in zip(mean, std, strict=True)]
            hi = [m + s for m, s in zip(mean, std, strict=True)]
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("agent steps")
    ax.set_ylabel("score (mean ± std)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
