"""Pairs of clips that differ only in the climb, labelled by a teacher of the climb (surface, refill, moves).

A recorded clip that climbs differs from one that does not in everything else too (the depth, the
enemies, the divers), and a whole-clip label does not say which steps earned it. Here a policy
plays SeaQuest in one emulator; at a step with a low gauge and a diver aboard, below the surface,
the emulator's state is saved and two clips are played from it: in one the policy may only choose
actions with UP in them ("climb"), in the other any action but those ("stay"). The surface teacher
labels the pair, and both clips and the label go into a new DB that 03_reward_train.py takes
beside the round's label DBs:

    python -m experiments.branch --policy runs/round/seed0/v0 --db runs/branch/seed0/db --pairs 150
    python 03_reward_train.py --diff-flow runs/round/seed0/surface-100/r1/label-db runs/branch/seed0/db

**Death pairs** (``--kind death``, ``experiments.round --death-pairs N``): the policy plays on
freely; where it loses a life, the state ``--steps`` agent steps before that loss is played again,
freely, up to ``tries`` times, until one replay loses a life within ``--steps`` steps and one does
not lose one within ``--steps`` + ``DEATH_TAIL`` (a sub hit by an enemy vanishes for about 20 steps
before the game takes the life: a replay whose loss falls just after the clip would look alive in
it). The pair (meta ``"branch"``: ``"dies"`` / ``"lives"``) differs only in what the sub did in
those steps; the teacher's death rule decides it, and a model trained on it learns which steps led
into the death. The learned reward of the branch rounds paid the steps heading into a death about
the median step (docs/results.md), and their agents died ever sooner.

The emulator is stepped as stage 1's ``AtariVec`` steps it: 4 frames an agent step, the frame the
agent sees the maximum of the last two, the policy input the grey 84x84 frames of the last 4 steps
(a lost life starts the stack again).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.flags import seed_setting
from lib.atari.saved_states import SingleGame
from lib.atari.seaquest import (
    HIGH_OXYGEN,
    LOW_OXYGEN,
    SURFACE_ROW,
    divers_aboard,
    in_gauge_band,
    oxygen_levels,
    sub_rows,
)
from lib.core.errors import UserError, run_cli
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_between, check_fields, in_range, setting
from lib.label_ui.oracle import label_extra
from lib.models.policy import AtariA2C, load_policy, policy_file
from lib.models.teachers import TEACHERS, Teacher, death_penalty_for, segment_facts
from lib.store.labels import Label, append_labels
from lib.store.segment_writer import claim_db, save_segment, segment_relpath
from lib.store.segments import Segment, list_segments, read_segment

ENV_ID = "SeaquestNoFrameskip-v4"
CLIMB_TEACHERS = ("surface", "refill", "moves")  # the teachers that pay the climb itself: they label the climb pairs
MIN_DEPTH = 20  # rows below the surface row a branch point must be: a climb there has rows to gain
BRANCHES = ("climb", "stay")
DEATH_BRANCHES = ("dies", "lives")
CLIMB_STEPS, DEATH_STEPS = 15, 40  # default clip lengths of the two kinds of pair
DEATH_TAIL = 24  # agent steps a replay is watched past a death clip's end: a hit sub's life is taken ~20 steps later


def up_actions(meanings: tuple[str, ...]) -> np.ndarray:
    """(n_actions,) bool: the actions that move the sub up (UP, UPRIGHT, ..., UPLEFTFIRE)."""
    return np.array(["UP" in m for m in meanings])


GAUGES = ("low", "high")  # --gauge: where a climb pair's branch point is


def at_branch_point(frame: np.ndarray, gauge: str = "low") -> bool:
    """A low gauge (draining or not; ``gauge="high"``: at least HIGH_OXYGEN, where the surface
    teacher does not ask for the climb), a diver aboard, and the sub at least MIN_DEPTH rows down."""
    level, row = int(oxygen_levels(frame)), int(sub_rows(frame))
    return bool(in_gauge_band(level, gauge)) and int(divers_aboard(frame)) > 0 and row >= SURFACE_ROW + MIN_DEPTH


@dataclass
class Clip:
    """What one branch recorded, in ``Segment``'s terms (frames: the frame each action was chosen on)."""

    frames: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    dones: list[bool] = field(default_factory=list)
    game_over: list[bool] = field(default_factory=list)
    lives: list[int] = field(default_factory=list)


Picker = Callable[[np.ndarray, np.ndarray | None], int]


def policy_picker(net: AtariA2C, rng: np.random.Generator) -> Picker:
    """(policy input, allowed actions or None) -> an action sampled from the policy's softmax,
    renormalised over the allowed actions."""

    def pick(stack: np.ndarray, allowed: np.ndarray | None) -> int:
        with torch.no_grad():
            logits = net(torch.from_numpy(stack[None]))[0][0]
        p = torch.softmax(logits.double(), 0).numpy()
        if allowed is not None:
            p = p * allowed
        return int(rng.choice(len(p), p=p / p.sum()))

    return pick


def play_clip(game: SingleGame, pick: Picker, allowed: np.ndarray, steps: int) -> Clip:
    """Up to ``steps`` agent steps from the game's state with only ``allowed`` actions (fewer
    when the game ends)."""
    clip = Clip()
    for _ in range(steps):
        clip.frames.append(game.frame.copy())
        clip.lives.append(int(game.ale.lives()))
        a = pick(game.stack, allowed)
        r, lost, over = game.step(a)
        clip.actions.append(a)
        clip.rewards.append(r)
        clip.dones.append(lost)
        clip.game_over.append(over)
        if over:
            break
    return clip


def to_segment(clip: Clip, meanings: tuple[str, ...], env: int, step: int, policy: str, branch: str) -> Segment:
    return Segment(
        frames=np.stack(clip.frames),
        actions=np.array(clip.actions, dtype=np.int64),
        rewards=np.array(clip.rewards, dtype=np.float32),
        dones=np.array(clip.dones, dtype=bool),
        game_over=np.array(clip.game_over, dtype=bool),
        lives=np.array(clip.lives, dtype=np.int32),
        env_id=ENV_ID,
        action_meanings=meanings,
        env_index=env,
        step=step,
        checkpoint=policy,
        time=time.time(),
        meta={"branch": branch},
    )


def save_pair(
    db: Path,
    clips: list[Clip],
    meanings: tuple[str, ...],
    names: tuple[str, str],
    envs: tuple[int, int],
    counters: list[int],
    policy: str,
    judge: Teacher,
    sampling: str,
    order_rng: np.random.Generator,
) -> str:
    """Both clips of a pair into ``db`` (clip k under env directory ``envs[k]``, meta branch
    ``names[k]``; ``counters`` moves on), shown in a random order and labelled by ``judge``; the
    rule that decided."""
    rels, facts = [], []
    for k, clip in enumerate(clips):
        seg = to_segment(clip, meanings, envs[k], counters[k], policy, names[k])
        save_segment(db, seg)
        rels.append(segment_relpath(envs[k], counters[k]))
        facts.append(segment_facts(seg.frames, seg.rewards, seg.dones, "seaquest"))
        counters[k] += len(seg)
    first = int(order_rng.random() < 0.5)  # which clip is shown as #1
    a, b = first, 1 - first
    answer, rule = judge.answer_rule(facts[a], facts[b])
    extra = label_extra(facts[a], facts[b], rule, judge.name, sampling=sampling, death_penalty=judge.death_penalty)
    append_labels(db, [Label(rels[a], rels[b], answer, time=time.time(), source="oracle", extra=extra)])
    return rule


@dataclass
class BranchSettings:
    pairs: int = 150
    steps: int = CLIMB_STEPS
    every: int = 5  # agent steps between two branch points of one low-gauge stretch
    seed: int = 0
    env_base: int = 90  # the climb clips go to env directory env_base, the stay clips to env_base + 1
    max_games: int = 0  # stop after this many games with fewer pairs (a policy that seldom gets there); 0: never
    tries: int = 8  # death pairs: replays of one state at most, to find one that dies and one that lives
    teacher: str = "surface"  # the teacher that labels them (climb pairs: one of CLIMB_TEACHERS)
    gauge: str = "low"  # climb pairs: branch points with a low gauge, or a high one (at_branch_point)


def _player(policy: Path, db: Path, seed: int, teacher: str) -> tuple[SingleGame, Picker, Teacher, np.random.Generator]:
    """What both kinds of pair are made with: the game (``seed``), the policy's picker, the teacher
    that labels and the generator of the order shown; ``db`` claimed for SeaQuest's actions."""
    game = SingleGame(seed)
    net, _ = load_policy(policy, ENV_ID, "seaquest", (4, 84, 84), len(game.actions))
    net.eval()
    claim_db(db, ENV_ID, game.meanings)
    pick = policy_picker(net, np.random.default_rng(seed + 1))
    judge = Teacher(teacher, death_penalty=death_penalty_for(teacher, None))
    return game, pick, judge, np.random.default_rng(seed + 2)


def make_pairs(
    policy: Path,
    db: Path,
    s: BranchSettings,
    at: Callable[[np.ndarray], bool] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Play games until ``s.pairs`` pairs are in ``db`` (or ``s.max_games`` games are over), branching
    where ``at`` holds (default: ``at_branch_point`` at ``s.gauge``); returns how many labels each
    rule decided."""
    if at is None:
        at = lambda frame: at_branch_point(frame, s.gauge)  # noqa: E731
    if s.teacher not in CLIMB_TEACHERS:
        raise ValueError(
            f"climb pairs are labelled by a teacher of the climb ({', '.join(CLIMB_TEACHERS)}), not {s.teacher}"
        )
    game, pick, judge, order_rng = _player(policy, db, s.seed, s.teacher)
    up = up_actions(game.meanings)
    counters = [0, 0]
    rules: dict[str, int] = {}
    made, games, started = 0, 0, time.time()
    while made < s.pairs:
        if s.max_games and games >= s.max_games:
            log(f"warning: {made} of {s.pairs} pairs after {games} games: the policy seldom reaches a branch point")
            break
        game.reset()
        games += 1
        wait, over = 0, False
        while not over and made < s.pairs:
            wait -= 1
            if wait <= 0 and at(game.frame):
                state = game.save()
                clips = []
                for allowed in (up, ~up):
                    game.load(state)
                    clips.append(play_clip(game, pick, allowed, s.steps))
                game.load(state)
                envs = (s.env_base, s.env_base + 1)
                rule = save_pair(
                    db, clips, game.meanings, BRANCHES, envs, counters, str(policy), judge, "branch", order_rng
                )
                rules[rule] = rules.get(rule, 0) + 1
                made += 1
                wait = s.every
                if made % 10 == 0 or made == s.pairs:
                    log(f"{made}/{s.pairs} pairs, {games} games, {time.time() - started:.0f} s; decided by {rules}")
            _, _, over = game.step(pick(game.stack, None))
    return rules


def _lost_at(clip: Clip) -> int | None:
    """The step of a clip's first lost life (None: none)."""
    return next((t for t, lost in enumerate(clip.dones) if lost), None)


def make_death_pairs(policy: Path, db: Path, s: BranchSettings, log: Callable[[str], None] = print) -> dict[str, int]:
    """Death pairs (module docstring) until ``s.pairs`` are in ``db`` (or ``s.max_games`` games are
    over), labelled by ``s.teacher``; returns how many labels each rule decided."""
    from collections import deque

    game, pick, judge, order_rng = _player(policy, db, s.seed, s.teacher)
    free = np.ones(len(game.actions), dtype=bool)
    counters = [0, 0]
    rules: dict[str, int] = {}
    made, games, deaths, started = 0, 0, 0, time.time()
    while made < s.pairs:
        if s.max_games and games >= s.max_games:
            log(f"warning: {made} of {s.pairs} pairs after {games} games ({deaths} lives lost): too few replays differ")
            break
        game.reset()
        games += 1
        before: deque[tuple[Any, np.ndarray, np.ndarray]] = deque(maxlen=s.steps)
        over = False
        while not over and made < s.pairs:
            before.append(game.save())
            _, lost, over = game.step(pick(game.stack, None))
            if not lost:
                continue
            deaths += 1
            if len(before) == s.steps:  # a whole clip of this life before the loss
                now = game.save()
                found: list[Clip | None] = [None, None]  # dies, lives
                for _ in range(s.tries):
                    game.load(before[0])
                    clip = play_clip(game, pick, free, s.steps + DEATH_TAIL)
                    at = _lost_at(clip)
                    if at is not None and at < s.steps and found[0] is None:
                        found[0] = clip
                    elif at is None and len(clip.actions) == s.steps + DEATH_TAIL and found[1] is None:
                        found[1] = clip
                    if found[0] is not None and found[1] is not None:
                        break
                game.load(now)
                if found[0] is not None and found[1] is not None:
                    cut = [Clip(*(getattr(c, f.name)[: s.steps] for f in fields(Clip))) for c in found if c is not None]
                    envs = (s.env_base + 2, s.env_base + 3)
                    rule = save_pair(
                        db,
                        cut,
                        game.meanings,
                        DEATH_BRANCHES,
                        envs,
                        counters,
                        str(policy),
                        judge,
                        "death-branch",
                        order_rng,
                    )
                    rules[rule] = rules.get(rule, 0) + 1
                    made += 1
                    if made % 10 == 0 or made == s.pairs:
                        log(
                            f"{made}/{s.pairs} death pairs, {games} games, {deaths} lives lost, "
                            f"{time.time() - started:.0f} s; decided by {rules}"
                        )
            before.clear()  # the next life's clips start after the loss
    return rules


def climb_gap(reward: Path, db: Path, ref_db: Path, ref_names: list[str], dev: str = "cpu") -> dict[str, float]:
    """What a reward model pays a climbing and a still low-gauge diver step (``readouts.diver_step_flags``)
    of the clips of ``db``, in the units the learner would see on ``ref_names`` of ``ref_db``
    (their median step 0, their std 1): a test of the climb on clips that start alike."""
    from experiments.readouts import diver_step_flags, diver_step_means
    from lib.models.reward import load_reward_model
    from lib.reward.eval import predict_segments

    rm = load_reward_model(reward, device=dev)
    ref = predict_segments(rm, ref_db, ref_names).pred_steps.astype(np.float64)
    if not len(ref):
        raise UserError(f"no readable segment of {ref_db} to take the units from")
    mid, sd = float(np.median(ref)), float(ref.std()) or 1.0
    preds = predict_segments(rm, db, list_segments(db, warn=None))
    flags = [diver_step_flags(read_segment(db, rel).frames) for rel in preds.names]
    m = diver_step_means((preds.pred_steps.astype(np.float64) - mid) / sd, flags)
    out = {"climb_z": m["diver_climb_z"], "climb_steps": m["diver_climb_steps"]}
    out.update({"still_z": m["diver_still_z"], "still_steps": m["diver_still_steps"]})
    return {**out, "gap": out["climb_z"] - out["still_z"]}


def measure(models: list[Path], db: Path, ref_db: Path, ref_split: Path) -> None:
    """``--measure``: ``climb_gap`` of each model, one row each."""
    import json

    try:
        ref_names = json.loads(ref_split.read_text())["holdout"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--ref-split {ref_split}: not a round's split.json with a holdout list ({e})") from None
    print("| reward model | low-gauge diver step: climbing / still (steps) | climbing - still |")
    print("|---|---:|---:|")
    for m in models:
        g = climb_gap(m, db, ref_db, ref_names)
        print(
            f"| {m} | {g['climb_z']:+.2f} / {g['still_z']:+.2f} ({g['climb_steps']} / {g['still_steps']}) "
            f"| **{g['gap']:+.2f}** |"
        )


GROUPS = {  # --help's groups, in order, and their titles
    "where": "the policy and the DB",
    "measure": "measuring instead of playing",
    "pairs": "the pairs",
}


@dataclass(frozen=True, kw_only=True)
class BranchCommand:
    """What ``python -m experiments.branch`` is told, one field per flag in ``--help`` order; the
    pairs' settings take their defaults from ``BranchSettings``."""

    policy: Path | None = setting(
        None, "the policy that plays: a checkpoint or a run directory", group="where", type=Path
    )
    db: Path = setting(help="a new directory for the clips and labels.jsonl", group="where", type=Path)
    measure: list[Path] | None = setting(
        None,
        "instead of playing: what each reward model pays a climbing and a still low-gauge diver step of "
        "--db's clips, in the units of --ref-db's held-out steps (their median 0, std 1)",
        group="measure",
        type=Path,
        nargs="+",
        metavar="MODEL",
    )
    ref_db: Path | None = setting(
        None, "--measure: the round's DB whose held-out steps give the units", group="measure", type=Path
    )
    ref_split: Path | None = setting(
        None, "--measure: that DB's split.json (its holdout list)", group="measure", type=Path
    )
    pairs: int = setting(BranchSettings.pairs, "pairs to make", group="pairs", checks=in_range("--pairs", 1, 100_000))
    kind: str = setting(
        "climb",
        "climb: one clip may only climb, one may not (--teacher surface, refill or moves labels them); death: the "
        "state "
        "--steps before a lost life played again until one replay dies and one lives (module docstring)",
        group="pairs",
        choices=("climb", "death"),
    )
    steps: int | None = setting(
        None,
        f"agent steps per clip (default {CLIMB_STEPS} for climb pairs: a climb ends before the surface; 50: most "
        "climbs reach it, and a sub with a diver aboard refills there (refill pairs); "
        f"{DEATH_STEPS} for death pairs: the ~20 steps a hit sub takes to lose its life and the steps before it)",
        group="pairs",
        type=int,
        checks=[(lambda v: v is None or 2 <= v <= 1000, "--steps must be in 2..1000, got {v}")],
    )
    tries: int = setting(
        BranchSettings.tries,
        "death pairs: replays of one state at most",
        group="pairs",
        checks=in_range("--tries", 1, 1000),
    )
    teacher: str = setting(
        BranchSettings.teacher,
        "the teacher that labels the pairs (climb pairs: surface, refill or moves)",
        group="pairs",
        checks=[(lambda v: v in TEACHERS, f"--teacher must be one of {', '.join(TEACHERS)}, got {{v!r}}")],
    )
    every: int = setting(
        BranchSettings.every,
        "agent steps between two branch points of one stretch",
        group="pairs",
        checks=[(lambda v: v >= 1, "--every must be at least 1, got {v}")],
    )
    gauge: str = setting(
        BranchSettings.gauge,
        f"climb pairs: branch where the gauge is low (at most {LOW_OXYGEN} of 63), or high (at least {HIGH_OXYGEN}: "
        "the teacher does not ask for the climb there, so the pairs show a model that the gauge decides)",
        group="pairs",
        choices=GAUGES,
    )
    seed: int = seed_setting("emulator, policy sampling and #1/#2 order", group="pairs")
    max_games: int = setting(
        BranchSettings.max_games,
        "stop after this many games with fewer pairs (0: never)",
        group="pairs",
        checks=[(lambda v: v >= 0, "--max-games must be 0 or more, got {v}")],
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags in groups (``--help``), one per ``BranchCommand`` field."""
    return settings_parser(
        BranchCommand,
        "python -m experiments.branch",
        __doc__.split("\n\n")[0],
        GROUPS,
        epilog="The labels are --teacher's (lib/models/teachers.py); the DB's clips are meta "
        '"branch": "climb" or "stay" (death pairs: "dies" or "lives").',
    )


def main(argv: list[str] | None = None) -> None:
    """Check the command (one line for a bad value), then measure or make the pairs."""
    args = BranchCommand(**vars(build_parser().parse_args(argv)))
    if args.db.exists() and not args.db.is_dir():
        raise UserError(f"--db {args.db} is not a directory: give a new directory (or, with --measure, a DB)")
    check_fields(args)
    if args.measure:
        if args.ref_db is None or args.ref_split is None:
            raise UserError("--measure needs --ref-db and --ref-split")
        for path in (*args.measure, args.db, args.ref_db):
            if not path.exists():
                raise UserError(f"{path} does not exist")
        if not list_segments(args.db, warn=None):
            raise UserError(f"--db {args.db} holds no segments to measure: give the DB this tool made")
        measure(args.measure, args.db, args.ref_db, args.ref_split)
        return
    check_between(
        [
            (args.policy is None, "give --policy (the policy that plays) or --measure"),
            (
                args.kind == "climb" and args.teacher not in CLIMB_TEACHERS,
                f"climb pairs are labelled by a teacher of the climb: --teacher {', '.join(CLIMB_TEACHERS)}",
            ),
            (args.kind == "death" and args.gauge != "low", "--gauge is for climb pairs"),
        ]
    )
    play(args)


def play(args: BranchCommand) -> None:
    """Make the pairs into a new --db; a run stopped before its first pair leaves no directory."""
    assert args.policy is not None
    policy = policy_file(args.policy)
    if args.db.exists() and list_segments(args.db, warn=None):
        raise UserError(f"{args.db} holds segments already: give a new directory")
    made = [d for d in (args.db, *args.db.parents) if not d.exists()]  # innermost first
    args.db.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (DEATH_STEPS if args.kind == "death" else CLIMB_STEPS)
    s = BranchSettings(
        args.pairs,
        steps,
        args.every,
        args.seed,
        max_games=args.max_games,
        tries=args.tries,
        teacher=args.teacher,
        gauge=args.gauge,
    )
    try:
        rules = make_death_pairs(policy, args.db, s) if args.kind == "death" else make_pairs(policy, args.db, s)
    except BaseException:
        if made and not list_segments(args.db, warn=None):  # stopped before a pair: no empty DB left behind
            shutil.rmtree(args.db, ignore_errors=True)
            for d in made[1:]:
                with contextlib.suppress(OSError):
                    d.rmdir()  # only while empty
        raise
    print(f"{sum(rules.values())} pairs in {args.db}; decided by {rules}")


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
