"""What ``experiments.round`` prints and draws: rows per round and arm, the targets, the seeds
together, and ``round.png``.

A row (``arm_row``) holds the mean of the arm's evaluation games: score with its 95% interval,
length; beside them the book's figure, the best single life over the games (its score and length),
and the evaluation that saved the run's best checkpoint (its mean score and step); and for SeaQuest
the behaviour figures: voluntary refills, lives lost, the share of lost
lives lost to oxygen and to coming up with no diver aboard, low-gauge climbs toward the surface
(what the surface teacher rewards) and the share of steps spent at the surface (the reward-hacking
watch: the book's third round ended with an agent parked there), divers rescued (picked up) per
game and the share of steps with a diver aboard (what a refill needs).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lib.atari.games import best_of_lives

ARMS = ("v0", "control", "rlhf", "oracle")  # oracle: only with --oracle-arm
Z95 = 1.96  # normal approximation of the 95% interval of a mean
# (key in a row, column title, format); a cell reads "n/a" where the row lacks the key (behaviour
# figures of other games, an evaluation cached before the figure existed). What a format holds after
# its first field is filled from the row: "{:.0f} in {best_life_steps:.0f} steps".
COLUMNS = (
    ("length", "length", "{:.0f}"),
    ("best_life", "best life", "{:.0f} in {best_life_steps:.0f} steps"),
    ("best_ckpt", "best checkpoint", "{:.0f} at {best_ckpt_kstep:.0f}k"),
    ("refills", "refills/game", "{:.2f}"),
    ("deaths", "lives lost/game", "{:.2f}"),
    ("oxygen_share", "lost to oxygen", "{:.0%}"),
    ("surfacing_share", "lost surfacing empty", "{:.0%}"),
    ("climbs", "low-gauge climbs/game", "{:.2f}"),
    ("surface_share", "at surface", "{:.1%}"),
    ("rescues", "divers rescued/game", "{:.2f}"),
    ("diver_share", "diver aboard", "{:.0%}"),
)


def mean_ci95(values) -> tuple[float, float]:
    """(mean, half-width of its 95% interval); the half-width is NaN with fewer than 2 values."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if len(v) == 0:
        return math.nan, math.nan
    half = Z95 * v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else math.nan
    return float(v.mean()), float(half)


def arm_row(d: dict[str, Any]) -> dict[str, float]:
    """One arm's evaluation games (``evaluate_arm``'s record) -> its row."""
    score, half = mean_ci95(d["scores"])
    out = {"score": score, "score_ci": half, "length": float(np.mean(d["lengths"])), "games": len(d["scores"])}
    if (best := best_of_lives([life for game in d.get("lives", []) for life in game])) is not None:
        out["best_life"], out["best_life_steps"] = best[0], float(best[1])
    if ckpt := d.get("best_checkpoint"):
        out["best_ckpt"], out["best_ckpt_kstep"] = float(ckpt["score"]), ckpt["step"] / 1000
    if all(v is not None for v in d["refills"]):
        deaths = sum(d["deaths"])
        out["refills"] = float(np.mean(d["refills"]))
        out["deaths"] = float(np.mean(d["deaths"]))
        out["oxygen_deaths"] = float(np.mean(d["oxygen_deaths"]))
        out["oxygen_share"] = sum(d["oxygen_deaths"]) / deaths if deaths else 0.0
        if d.get("surfacing_deaths") and all(v is not None for v in d["surfacing_deaths"]):
            out["surfacing_share"] = sum(d["surfacing_deaths"]) / deaths if deaths else 0.0
    if d.get("climbs") and all(v is not None for v in d["climbs"]):
        out["climbs"] = float(np.mean(d["climbs"]))
        steps = sum(d["lengths"])
        out["surface_share"] = sum(d["surface_steps"]) / steps if steps else 0.0
    if d.get("rescues") and all(v is not None for v in d["rescues"]):
        out["rescues"] = float(np.mean(d["rescues"]))
        out["diver_share"] = sum(d["diver_steps"]) / sum(d["lengths"]) if sum(d["lengths"]) else 0.0
    return out


def _cell(row: dict[str, float], key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    ci = row.get(f"{key}_ci")
    first, _, rest = fmt.partition("}")  # the figure's own format; the rest names other figures
    first += "}"
    text = first.format(v)
    if ci is not None and not math.isnan(ci) and key != "length":
        text += f" ± {first.format(ci)}"
    return text + rest.format(**row)


def table(
    rounds: list[dict[str, dict[str, float]]], arms: tuple[str, ...] = ARMS, names: list[str] | None = None
) -> str:
    """One row per round and arm (v0 once, first; an arm a round lacks is left out); a score
    ``a ± b``: b is the 95% interval. ``names``: what the round column says (default 1, 2, ...)."""
    head = "| round | arm | score | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [head, "|---|---|---:|" + "---:|" * len(COLUMNS)]
    for k, rows in enumerate(rounds, start=1):
        for arm in arms:
            if (arm == "v0" and k > 1) or arm not in rows:
                continue
            r = rows[arm]
            score = f"{r['score']:.0f} ± {r['score_ci']:.0f}" if not math.isnan(r["score_ci"]) else f"{r['score']:.0f}"
            cells = [_cell(r, key, fmt) for key, _, fmt in COLUMNS]
            name = "0" if arm == "v0" else names[k - 1] if names else str(k)
            lines.append(f"| {name} | {arm} | {score} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The target sets each teacher's round report checks (``targets``, ``model_targets``).
REPORTS: dict[str, tuple[str, ...]] = {
    "score": ("score_each_round",),
    "oxygen": ("refills",),
    "surface": ("refills", "behaviour_labels"),
    "refill": ("refills",),
    "moves": ("refills",),
}


def targets(teacher: str, rounds: list[dict[str, dict[str, float]]]) -> list[tuple[str, bool]]:
    """The targets of the teacher's report (``REPORTS``), each with whether
    it held: ``score_each_round`` in every round, ``refills`` after the last."""
    report = REPORTS.get(teacher, ())
    out: list[tuple[str, bool]] = []
    if "score_each_round" in report:
        out += [
            (f"round {k}: rlhf scores at least 0.9x control", r["rlhf"]["score"] >= 0.9 * r["control"]["score"])
            for k, r in enumerate(rounds, start=1)
        ]
    if "refills" in report:
        out += refill_targets(rounds)
    return out


def refill_targets(rounds: list[dict[str, dict[str, float]]]) -> list[tuple[str, bool]]:
    """The oxygen teachers' targets after the last round: the agent refills, loses fewer lives to
    oxygen, and scores no less."""
    last = rounds[-1]
    rl, ctl = last["rlhf"], last["control"]
    if "refills" not in rl:
        return []
    return [
        ("rlhf refills at least once per game", rl["refills"] >= 1.0),
        (
            "rlhf loses at most half the control's share of lives to oxygen",
            rl["oxygen_share"] <= 0.5 * ctl["oxygen_share"],
        ),
        ("rlhf scores no less than control", rl["score"] >= ctl["score"]),
        ("stretch: rlhf scores at least 1.5x control", rl["score"] >= 1.5 * ctl["score"]),
    ]


BEHAVIOUR_RULES = ("diver_climb", "refill")  # the surface teacher's rules the held-out agreement targets
MIN_RULE_AGREEMENT, MIN_BEHAVIOUR_LABELS = 0.8, 0.25


def model_targets(teacher: str, rounds: list[dict[str, Any]]) -> list[tuple[str, bool | None]]:
    """The reward-model targets per round of a teacher whose report has ``behaviour_labels`` (the
    surface teacher; ``run_round``'s ``reward_model`` and ``evidence``): from round 2 on, held-out
    agreement of at least 80% on the diver-climb and refill pairs (None: no such held-out pair);
    every round, at least 25% of the labels decided by a rule the score does not pay for
    (``behaviour``: that count)."""
    if "behaviour_labels" not in REPORTS.get(teacher, ()):
        return []
    out: list[tuple[str, bool | None]] = []
    for k, r in enumerate(rounds, start=1):
        ev = r["evidence"]
        share = behaviour_share(ev)
        out.append((f"round {k}: at least 25% of labels decided by a rule the score does not pay for", share >= 0.25))
        if k < 2:
            continue
        by_rule = r["reward_model"].get("by_rule", {})
        for rule in BEHAVIOUR_RULES:
            got = by_rule.get(rule)
            ok = None if not got or not got.get("pairs") else got["agreement"] >= MIN_RULE_AGREEMENT
            out.append((f"round {k}: held-out agreement at least 80% on {rule} pairs", ok))
    return out


SCORE_RULES = ("score", "tie", "noise", "cant_tell")  # rules that are the score, or no preference


def behaviour_share(ev: dict[str, Any]) -> float:
    """The share of a round's labels decided by a rule the score does not pay for within the clip
    (death, refill, diver_climb, rescue, idle, oxygen_death, climb), by the rule each recorded."""
    labels = ev.get("labels", 0)
    return sum(n for rule, n in ev.get("rules", {}).items() if rule not in SCORE_RULES) / labels if labels else 0.0


def across_seeds(per_seed: list[list[dict[str, dict[str, float]]]]) -> list[dict[str, dict[str, float]]]:
    """Rounds of several seeds -> one set of rows: each figure the mean over the seeds, its
    ``_ci`` the 95% interval across them (``score_ci`` too: the seeds' spread, not the games')."""
    if len(per_seed) == 1:
        return per_seed[0]
    out = []
    for k in range(min(len(s) for s in per_seed)):
        rows = {}
        for arm in ARMS:
            if not all(arm in s[k] for s in per_seed):
                continue
            keys = set.intersection(*(set(s[k][arm]) for s in per_seed)) - {"score_ci"}
            row: dict[str, float] = {}
            for key in sorted(k2 for k2 in keys if not k2.endswith("_ci")):
                row[key], row[f"{key}_ci"] = mean_ci95([s[k][arm][key] for s in per_seed])
            rows[arm] = row
        out.append(rows)
    return out


def _binned(steps: list, values: list, bins: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A dense per-game or per-batch series as means over ``bins`` equal spans of steps."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(x) <= bins:
        return x, y
    edges = np.linspace(x.min(), x.max() + 1, bins + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
    keep = np.bincount(which, minlength=bins) > 0
    mx = np.bincount(which, x, bins)[keep] / np.bincount(which, minlength=bins)[keep]
    my = np.bincount(which, y, bins)[keep] / np.bincount(which, minlength=bins)[keep]
    return mx, my


ARM_STYLES = {"control": {"color": "tab:grey", "linestyle": "--"}, "rlhf": {}, "oracle": {"linestyle": "-."}}
# the over-optimisation picture, per training game or batch (binned): panels shown where an arm has them
FINETUNE_PANELS = [
    ("finetune/learned_return", None, "learned return per training game"),
    ("finetune/kl_to_start", None, "KL(pi || pi_start), training batches"),
]


def plot(path: Path, curves: list[dict[str, dict[str, tuple[list, list]]]], v0: dict[str, float], title: str):
    """round.png: eval figures during each round's fine-tunes, one curve per round and arm (rlhf
    solid and coloured by round, the oracle arm dash-dotted in the same colour, control grey
    dashed), v0 dotted; where the arms logged them, the learned return of the training games and
    the KL to the start policy (binned means)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels: list[tuple[str, str | None, str]] = [("eval/score_mean", "score", "mean eval score")]
    if "refills" in v0:
        panels += [
            ("eval/refills_per_game", "refills", "voluntary refills per game"),
            ("eval/oxygen_death_share", "oxygen_share", "share of lives lost to oxygen"),
        ]
    if "climbs" in v0:
        panels.append(("eval/low_climbs_per_game", "climbs", "low-gauge climbs per game"))
    panels += [p for p in FINETUNE_PANELS if any(rc[a].get(p[0], ([], []))[0] for rc in curves for a in rc)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    colours = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, max(len(curves), 1)))
    for ax, (tag, key, label) in zip(axes[0], panels, strict=True):
        dense = tag.startswith("finetune/")
        for k, (rc, colour) in enumerate(zip(curves, colours, strict=True), start=1):
            for arm, style in ARM_STYLES.items():
                steps, values = rc.get(arm, {}).get(tag, ([], []))
                if not steps:
                    continue
                x, y = _binned(steps, values) if dense else (np.asarray(steps), np.asarray(values))
                ax.plot(x, y, marker=None if dense else "o", label=f"{arm} round {k}", **{"color": colour, **style})
        if key is not None and key in v0:
            ax.axhline(v0[key], color="black", linestyle=":", linewidth=1, label="v0")
        ax.set_xlabel("fine-tune agent steps (each round from its start policy)")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k"))  # 6-digit ticks overlap
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
