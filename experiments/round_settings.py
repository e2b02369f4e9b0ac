"""``experiments.round``'s settings, declared once: each field of ``RoundSettings`` is one flag
(``lib.core.settings.setting``: its default, ``--help`` text and group, the checks of its own value).
The checks between flags and those of the flags passed through to the stages are
``experiments.round.check``'s. A module of its own so that the stages the round runs
(``experiments.stages``, ``experiments.live``) name what they are given without importing the
round; it imports no torch, so that ``--help`` stays fast."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from experiments.flags import at_least_one, dev_setting
from lib.core.settings import in_range, setting, within
from lib.label_ui.sampling import RETIRED_SAMPLING_MODES, SAMPLING_MODES
from lib.models.teachers import DEFAULT_DEATH_PENALTY, TEACHERS

ROUND_MODES = tuple(m for m in SAMPLING_MODES if m != "exploits")  # the modes that need no fine-tuning DB
FT_LAYERS = ("frozen", "full")
V0_STEPS = 2_500_000  # the default v0: one that needs air (measured 2026-12-01, docs/results.md)
MAX_SCALE = 1000.0
MAX_ROUNDS = 50
GROUPS = {  # --help's groups, in order, and their titles
    "round": "the round: teacher, budget, seeds",
    "labels": "labels: what is recorded and labelled, how the reward model is trained",
    "finetune": "fine-tunes: what they train, how they are watched, the modes that skip or replace them",
}


def seed_list(text: str) -> list[int]:
    """--seeds 0,1,2 -> [0, 1, 2]."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds such as 0,1,2, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return seeds


@dataclass
class RoundSettings:
    """Everything a round is told, one field per flag in ``--help`` order, and ``seed``: the one
    seed of ``--seeds`` a seed's run is made with (``experiments.round.seed_args``). Not frozen:
    ``check`` resolves ``--death-penalty``'s default for the teacher in place."""

    # the round: teacher, budget, seeds
    teacher: str = setting("oxygen", "who labels (lib/models/teachers.py)", group="round", choices=TEACHERS)
    teacher_noise: float = setting(
        0.0, "share of random answers of the teacher", group="round", checks=within("--teacher-noise", 0, 1)
    )
    labels: int = setting(
        300,
        "labeled pairs for the reward model",
        group="round",
        checks=at_least_one("--labels must be at least 1, got {v}"),
    )
    v0_steps: int = setting(
        V0_STEPS,
        "agent steps of the from-scratch v0 run (2.5M: a v0 that runs out of air in most lives, so the low "
        "gauge the surface teacher is about is common; docs/results.md)",
        group="round",
        checks=at_least_one("--v0-steps and --ft-steps must be at least 1"),
    )
    ft_steps: int = setting(
        500_000,
        "agent steps of each fine-tune arm",
        group="round",
        checks=at_least_one("--v0-steps and --ft-steps must be at least 1"),
    )
    eval_games: int = setting(
        30,
        "full games each of v0, control and rlhf plays",
        group="round",
        checks=at_least_one("--eval-games must be at least 1, got {v}"),
    )
    out: Path = setting(Path("runs/round"), "where every stage's output is kept", group="round")
    scale: float = setting(
        1.0,
        "multiply every step count by this (10 for a GPU)",
        group="round",
        checks=[
            (
                lambda v: math.isfinite(v) and 0 < v <= MAX_SCALE,
                f"--scale must be a number in (0, {MAX_SCALE:g}], got {{v}}",
            )
        ],
    )
    dev: str = dev_setting("torch device of every stage: cpu, cuda or cuda:N", group="round")
    seeds: list[int] = setting(
        [0],
        "run everything once per seed (v0, the splits, the labels, the fine-tunes), each under --out/seed<S>; "
        "the report gives means with 95%% intervals across the seeds",
        group="round",
        type=seed_list,
        metavar="S,S,...",
    )
    rounds: int = setting(
        1,
        "label-retrain-finetune rounds (round k labels round k-1's DB)",
        group="round",
        checks=in_range("--rounds", 1, MAX_ROUNDS),
    )
    start: str = setting(
        "best",
        "where each round's fine-tunes start: best = round k-1's best policy of the same arm (the book's "
        "way), v0 = v0's best policy every round",
        group="round",
        flags=("--from",),
        choices=("best", "v0"),
    )
    # labels: what is recorded and labelled, how the reward model is trained
    record_prob: float = setting(
        0.001,
        "v0's per-step chance to start recording a segment (0.001: ~1,000 segments per 1M steps)",
        group="labels",
        checks=within("--record-prob", 0, 1, "(]"),
    )
    holdout: float = setting(
        0.2, "share of the DB's segments never labeled", group="labels", checks=within("--holdout", 0, 1, "()")
    )
    sampling: str = setting(
        "rare",
        "which pairs the teacher labels (02_label_ui.py --sampling): rare, the default (no model: the "
        "segments that look least like the others first, each with a random partner; it doubled the surface "
        "teacher's held-out agreement on diver-climb pairs over random, docs/results.md); random; or the first "
        "third at random and each further third picked by a reward model trained on the labels so far "
        "(uncertain, disagree)",
        group="labels",
        choices=ROUND_MODES,
        retired=RETIRED_SAMPLING_MODES,
    )
    death_penalty: float | None = setting(
        None,
        "the score teacher: each life lost in a clip costs P points of its sum (02_label_ui.py "
        f"--death-penalty; default {DEFAULT_DEATH_PENALTY:g}, 0 for the other teachers); names the round's "
        "directory",
        group="labels",
        type=float,
        metavar="P",
    )
    branch_pairs: int = setting(
        0,
        "the surface teacher: every round also N pairs of clips played twice from one saved emulator state "
        "of the policy the round's rlhf arm starts from, one clip that may only climb and one that may not "
        "(experiments/branch.py), trained on beside the labels in this and every later round; 0: none. With "
        '--reward-args "--diff-flow" they made round 1\'s model pay a climbing low-gauge diver step +0.57 std over '
        "a still one (docs/results.md); names the round's directory",
        group="labels",
        metavar="N",
        checks=in_range("--branch-pairs", 0, 100_000),
    )
    branch_steps: int = setting(
        15,
        "agent steps of each branch clip (15: a climb ends before the surface; 50: most climbs reach it and "
        "refill there, so the surface teacher's refill rule decides most pairs)",
        group="labels",
        checks=in_range("--branch-steps", 2, 1000),
    )
    death_pairs: int = setting(
        0,
        "every round also N death pairs: where the policy the round's rlhf arm starts from loses a life, the "
        "state --death-steps before it is played again until one replay loses the life and one does not "
        "(experiments/branch.py --kind death), labelled by the round's teacher and trained on beside the labels "
        "in this and every later round; 0: none. They teach which steps lead into a death; names the round's "
        "directory",
        group="labels",
        metavar="N",
        checks=in_range("--death-pairs", 0, 100_000),
    )
    death_steps: int = setting(
        40,
        "agent steps of each death-pair clip (40: a hit sub takes ~20 steps to lose its life, and the steps "
        "before the hit)",
        group="labels",
        checks=in_range("--death-steps", 2, 1000),
    )
    reward_args: str = setting(
        "",
        '03_reward_train.py flags for every reward model of the round, e.g. "--ensemble 3" (disagree '
        "needs an ensemble); they name the round's directory, so that rounds with other flags never share one",
        group="labels",
        metavar='"FLAGS"',
    )
    # fine-tunes: what they train, how they are watched, the modes that skip or replace them
    ft_layers: str = setting(
        "frozen",
        "what each fine-tune trains, both arms alike: frozen = the heads only, the conv layers frozen "
        "(01_a2c.py --finetune, the book's way), full = every layer, at the same learning rate",
        group="finetune",
        choices=FT_LAYERS,
    )
    ft_args: str = setting(
        "",
        '01_a2c.py flags for the rlhf (and oracle) fine-tunes, e.g. "--terminal none --reward-scale 0.05 '
        "--reward-norm labels\"; they name the round's directory, as --reward-args do",
        group="finetune",
        metavar='"FLAGS"',
    )
    oracle_arm: bool = setting(
        False,
        "add an arm fine-tuned on the TRUE per-step score sent through exactly the rlhf arm's reward path "
        "(python -m experiments.lab_a2c --reward-oracle, -r MODEL and the same --ft-args: normalisation, scale, "
        "clip, terminal): "
        "what the path costs apart from what the model's errors cost",
        group="finetune",
    )
    reward_only: bool = setting(
        False,
        "the cheap inner loop: v0 (reused when done), round 1's labels and reward model, and its held-out "
        "agreement per deciding rule; no fine-tune and no evaluation games",
        group="finetune",
    )
    live: bool = setting(
        False,
        "the same teacher, labels and agent steps, live (experiments/live.py): round 1's labels and model, "
        "then ONE fine-tune of --rounds x --ft-steps from v0 while the teacher labels the other "
        "(--rounds - 1) x --labels pairs of the agent's newest clips and the reward model is retrained as they "
        "arrive; its row is printed beside the staged rounds' (run those first for the comparison)",
        group="finetune",
    )
    evals: int = setting(
        5,
        "evaluations during each fine-tune (the round.png curve)",
        group="finetune",
        checks=at_least_one("--evals and --test-episodes must be at least 1"),
    )
    test_episodes: int = setting(
        10,
        "games per evaluation during training",
        group="finetune",
        checks=at_least_one("--evals and --test-episodes must be at least 1"),
    )
    seed: int = 0  # not a flag: set per seed of --seeds (seed_args)
