"""Does a round of labels change what the agent does? Rounds with no person, one command.

Per seed (``--seeds``, each under ``--out/seed<S>``):

1. v0: A2C from scratch for --v0-steps, recording a segment DB (``01_a2c.py --db-path``);
2. round k: --holdout of the round's DB is set aside; a synthetic teacher (``lib/models/teachers.py``)
   labels --labels random pairs of the rest (``02_label_ui.py --oracle``'s code). Round 1's DB
   is v0's; round k > 1's is the DB the rlhf fine-tune of round k-1 recorded of its own play,
   where a new behaviour first shows (the book's rounds). All of a round's labels come from its
   newest DB: what the person of the book labelled;
3. a reward model with stage 3's defaults trained on EVERY label so far (all the rounds' DBs,
   and with ``--branch-pairs N`` every round's N pairs of clips played twice from one saved state
   of the policy its rlhf arm starts from, one that may only climb, and with ``--death-pairs N``
   N pairs played twice from the state before one of its lost lives, one replay that loses the
   life and one that does not: ``experiments/branch.py``),
   scored on the held-out segments of the round's DB: agreement with the teacher over every pair
   it prefers one of, per-step correlation of predicted and true reward;
4. arm ``rlhf``: fine-tuned on that reward model (``-r --finetune``) for --ft-steps, from round
   k-1's best rlhf policy (v0's in round 1; the book's way) or, with ``--from v0``, from v0's
   every round (the book's own suggestion); it records its DB for the next round. Arm
   ``control``: the same on the true score, from round k-1's best control policy (or v0's), so
   both arms have had the same fine-tune steps (shared by every teacher of the same --out);
5. v0 and each round's control and rlhf play --eval-games full games with the same seeds.

Prints one table row per round and arm (score with its 95% interval, length, refills per game,
lives lost, the share lost to oxygen, low-gauge climbs toward the surface, the share of steps
at the surface), the reward model's figures and which rule decided the labels per round,
a reward-hacking watch per round (correlation of the rlhf arm's predicted and true game returns
during its fine-tune; its time at the surface), whether the round's targets hold, and writes
``round.png`` and ``round.json`` under ``--out/seed<S>/<teacher>-<labels>...`` (``round_name``: what
else differs, with a short hash of the settings where the text could be shared); with several seeds
also the rows averaged over the seeds (intervals across seeds) in ``--out/<teacher>-<labels>....json``.
Every stage's output is kept and reused when the command runs again: a stopped run continues;
a run made for other steps (--v0-steps, --ft-steps, --scale) is refused, not extended.

    python -m experiments.round --teacher surface --rounds 3 --labels 100   # the book's three rounds
    python -m experiments.round --teacher score --seeds 0,1
    python -m experiments.round --scale 10 --dev cuda                      # every step count x10, on a GPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from experiments.flags import given_flags
from experiments.live import report_live, run_live
from experiments.readouts import LIFE_LOSS_LEAD, own_clip_figures
from experiments.round_report import ARMS, across_seeds, arm_row, model_targets, plot, table, targets
from experiments.round_settings import GROUPS, RoundSettings
from experiments.stages import (
    CURVE_TAGS,
    NO_MODEL_MODES,
    SeedRun,
    best_policy,
    cached_json,
    evaluate_arm,
    file_digest,
    ft_config,
    ft_settings,
    print_evidence,
    print_model_figures,
    reward_round,
    rlhf_start,
    split_db,
    tb_scalars,
    train_a2c,
)
from lib.a2c.config import A2CConfig
from lib.core.errors import UserError, run_cli
from lib.core.files import atomic_write
from lib.core.settings import MAX_SEED, check_between, check_fields
from lib.core.settings import build_parser as settings_parser
from lib.core.signals import PARENT_SIGNALS, SignalStop
from lib.models.teachers import death_penalty_for
from lib.store.segments import list_segments

V0_EVALS = 10  # evaluations during v0: its best checkpoint is the policy both arms start from
PROG = "python -m experiments.round"
DESCRIPTION = (
    "A whole RLHF round with a synthetic teacher: v0, labels, reward model, fine-tune on the reward model (rlhf) "
    "and on the score (control), then the same evaluation games for all three."
)
PASS_THROUGH = ("--reward-args", "--ft-args")  # their value is another program's flags


class RoundParser(argparse.ArgumentParser):
    """argparse takes a lone value that starts with "-" for a flag of its own, so ``--reward-args
    "--diff-flow"`` was "expected one argument" (a value with a space, "--diff-block 2x12", was
    not). The word after a pass-through flag is always its value: it is glued on as FLAG=VALUE.
    What it reads is a ``RoundSettings``."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        words, glued = list(sys.argv[1:] if args is None else args), []
        i = 0
        while i < len(words):
            if words[i] in PASS_THROUGH and i + 1 < len(words):
                glued.append(f"{words[i]}={words[i + 1]}")
                i += 2
            else:
                glued.append(words[i])
                i += 1
        return super().parse_known_args(glued, RoundSettings() if namespace is None else namespace)


def build_parser() -> RoundParser:
    """The round's flags in groups (``--help``), one per ``RoundSettings`` field: ``lib.core.settings``'
    parser, read by a ``RoundParser``."""
    fields = settings_parser(RoundSettings, PROG, DESCRIPTION, GROUPS)
    return RoundParser(
        prog=PROG, description=DESCRIPTION, formatter_class=fields.formatter_class, add_help=False, parents=[fields]
    )


def check(args: RoundSettings) -> None:
    """Every bad value is one line (UserError) before anything runs: each flag's own checks
    (``RoundSettings``), the ones between flags, then --reward-args and --ft-args read and checked
    by their stages. Resolves --death-penalty's default for the teacher in ``args``."""
    check_fields(args)
    for flag, value in (("--reward-args", args.reward_args), ("--ft-args", args.ft_args)):
        try:
            shlex.split(value)
        except ValueError as e:
            raise UserError(f"{flag} cannot be split into flags ({e}): {value!r}") from None
    try:
        args.death_penalty = death_penalty_for(args.teacher, args.death_penalty)
    except ValueError as e:
        raise UserError(str(e)) from None
    seeds_wrong = any(not 0 <= s <= MAX_SEED for s in args.seeds) or len(set(args.seeds)) != len(args.seeds)
    from experiments.branch import CLIMB_TEACHERS

    check_between([
        (min(int(args.v0_steps * args.scale), int(args.ft_steps * args.scale)) < 1, f"--scale {args.scale:g} leaves less than one agent step of --v0-steps {args.v0_steps} or --ft-steps {args.ft_steps}: give a larger --scale"),  # noqa: E501
        # one value, but its message writes the seeds as they were given
        (seeds_wrong, f"--seeds must be distinct numbers in 0..{MAX_SEED}, got {','.join(map(str, args.seeds))}"),
        (args.oracle_arm and (args.live or args.reward_only), "--oracle-arm is an arm of the staged rounds"),
        (args.sampling not in NO_MODEL_MODES and args.labels < 3, "--sampling needs --labels 3 or more (in thirds)"),
        (args.live and args.reward_only, "--live and --reward-only exclude each other"),
        (args.live and args.rounds < 2, "--live needs --rounds 2 or more (round 1's labels come first)"),
        (args.live and args.sampling not in NO_MODEL_MODES, f"--live labels the pairs no model picks: --sampling {', '.join(NO_MODEL_MODES)}"),  # noqa: E501
        (args.live and args.start == "v0", "--live fine-tunes once, from v0: --from does not apply"),
        (
            args.branch_pairs > 0 and args.teacher not in CLIMB_TEACHERS,
            "--branch-pairs are labelled by the round's teacher, which must pay the climb: give --teacher "
            + ", ".join(CLIMB_TEACHERS),
        ),
        (args.branch_pairs > 0 and args.live, "--branch-pairs is a stage of the staged rounds, not of --live"),
        (args.death_pairs > 0 and args.live, "--death-pairs is a stage of the staged rounds, not of --live"),
    ])  # fmt: skip
    check_pass_through(args)
    if args.sampling == "disagree" and ensemble_of(args) < 2:
        raise UserError("--sampling disagree needs an ensemble: --reward-args '--ensemble 3'")


# --- the settings of the stages -----------------------------------------------------------------


def ensemble_of(args: RoundSettings) -> int:
    """The --ensemble K of --reward-args, as stage 3 reads it (1 when not given)."""
    return int(pass_through("--reward-args", args.reward_args).get("ensemble", 1))


# What the round sets itself, by the stage's destination: --ft-args (01_a2c.py, per arm) and
# --reward-args (03_reward_train.py, per reward model) may not set them
FT_RESERVED = ("name", "model", "reward", "save", "db_path", "max_steps", "seed", "resume", "force", "runs_dir")
FT_RESERVED += ("test_every", "test_episodes", "dev")
REWARD_RESERVED = ("name", "out", "dev", "seed", "runs_dir", "no_progress", "evaluate", "follow")
REWARD_RESERVED += ("retrain_every", "poll")
A_DB = "DB"  # stage 3's DB argument while --reward-args are read: the round gives the DBs


def pass_through(flag: str, text: str) -> dict[str, Any]:
    """--ft-args or --reward-args (``flag``) read by its stage's own parser (01_a2c.py's, 03_reward_train.py's)
    as that stage reads them, prefixes and attached short options too: the settings given, by destination,
    a flag given at the stage's default kept. UserError (one line) for what the stage would refuse to
    parse and for a setting the round makes itself."""
    from lib.a2c.cli import build_parser as a2c_parser
    from lib.reward.cli import build_parser as reward_parser

    ft = flag == "--ft-args"
    if ft:
        stage, parser, reserved = "01_a2c.py", a2c_parser(), FT_RESERVED
    else:
        stage, parser, reserved = "03_reward_train.py", reward_parser(), REWARD_RESERVED
    options = {a.dest: " / ".join(a.option_strings) for a in parser._actions}
    words = shlex.split(text)
    try:
        given = given_flags(parser, words if ft else [A_DB, *words])
    except ValueError as e:
        raise UserError(f"{flag} {text!r}: not flags {stage} takes ({e}; see python {stage} --help)") from None
    dbs = given.pop("dbs", [A_DB])[1:]
    if dbs:
        raise UserError(f"{flag} may not name DBs ({' '.join(dbs)}): the round gives each reward model its DBs")
    taken = [options[dest] for dest in reserved if dest in given]
    if taken:
        per = "arm" if ft else "reward model"
        raise UserError(f"{flag} may not set {', '.join(taken)}: the round sets it for each {per}")
    return given


def check_pass_through(args: RoundSettings) -> None:
    """--ft-args and --reward-args parsed (``pass_through``) and checked by their stage's own checks on
    the settings the round will run them with: a wrong value is one line now, not an arm's failure
    after v0, the labels and a reward model."""
    from lib.reward.cli import build_parser as reward_parser
    from lib.reward.cli import config_from_args
    from lib.reward.config import RewardArgs

    pass_through("--reward-args", args.reward_args)
    parsed = reward_parser().parse_args([A_DB, "-n", "x", "-o", "x", *shlex.split(args.reward_args)])
    try:
        RewardArgs(**vars(parsed)).check()  # each flag's own checks: a retired value (--input half) too
        config_from_args(parsed, "cpu").check()
    except UserError as e:
        raise UserError(f"--reward-args {args.reward_args!r}: {e}") from None
    pass_through("--ft-args", args.ft_args)
    start, reward = Path("start.pt"), Path("reward.pt")  # stand-ins: the checks read no file
    arms = [rlhf_config(args, "rlhf", Path("rlhf"), start, reward)]
    arms += [replace(arms[0], reward_reload=True)] if args.live else []
    arms += [rlhf_config(args, "oracle", Path("oracle"), start, reward, oracle=True)] if args.oracle_arm else []
    for cfg in arms:
        try:
            cfg.check()
        except UserError as e:
            raise UserError(f"--ft-args {args.ft_args!r}: {e}") from None


def rlhf_config(
    args: RoundSettings, name: str, save: Path, start: Path, reward: Path, oracle: bool = False
) -> A2CConfig:
    """A fine-tune on a reward model, with --ft-args: the rlhf arm (recording its DB beside ``save``,
    for the next round) or, ``oracle``, the oracle arm's (no DB: --ft-args' recording flags are the
    rlhf arm's, and 01_a2c.py refuses them without --db-path); ``train_a2c(..., reward_oracle=True)``
    then sends the true score through the same path (``experiments.lab_a2c``)."""
    where = {} if oracle else {"db_path": str(save.parent / "rlhf-db")}
    cfg = ft_config(
        args,
        name=name,
        save=str(save),
        max_steps=int(args.ft_steps * args.scale),
        model=str(start),
        reward=str(reward),
        record_prob=args.record_prob,
        **where,
        **ft_settings(args.ft_layers),
    )
    return replace(cfg, record_prob=A2CConfig.record_prob, segment_steps=A2CConfig.segment_steps) if oracle else cfg


def round_settings(args: RoundSettings) -> dict[str, Any]:
    """What makes a round's labels, models or fine-tunes differ, --reward-args and --ft-args parsed:
    what its directory is named for."""
    keys = ("teacher", "labels", "teacher_noise", "sampling", "death_penalty", "start", "ft_layers")
    keys += ("branch_pairs", "branch_steps", "death_pairs", "death_steps")
    settings: dict[str, Any] = {k: getattr(args, k, None) for k in keys}
    for k, n in (("branch_steps", "branch_pairs"), ("death_steps", "death_pairs")):
        settings[k] = settings[k] if settings[n] else None  # their clips' length only matters with pairs
    settings["reward_args"] = pass_through("--reward-args", args.reward_args)
    settings["ft_args"] = pass_through("--ft-args", getattr(args, "ft_args", ""))
    return settings


def _readable_name(args: RoundSettings) -> str:
    """Teacher, labels, and whatever else makes a round differ, as text (the name of rounds made before
    ``round_name`` added a hash): it leaves out "-" and rounds floats, so it may be shared."""
    name = f"{args.teacher}-{args.labels}"
    name += f"-noise{args.teacher_noise:g}" if args.teacher_noise else ""
    name += f"-{args.sampling}" if args.sampling != "rare" else ""  # rare: the default
    name += f"-death{args.death_penalty:g}" if getattr(args, "death_penalty", 0) else ""
    if getattr(args, "branch_pairs", 0):
        name += f"-branch{args.branch_pairs}" + (f"x{args.branch_steps}" if args.branch_steps != 15 else "")
    if getattr(args, "death_pairs", 0):
        name += f"-deathpairs{args.death_pairs}" + (f"x{args.death_steps}" if args.death_steps != 40 else "")
    flags = re.sub(r"[^A-Za-z0-9.]+", "", args.reward_args)
    name += f"-{flags}" if flags else ""
    ft_flags = re.sub(r"[^A-Za-z0-9.]+", "", getattr(args, "ft_args", ""))
    name += f"-ft{ft_flags}" if ft_flags else ""
    name += "-fromv0" if getattr(args, "start", "best") == "v0" else ""
    return name + (f"-{args.ft_layers}" if getattr(args, "ft_layers", "frozen") != "frozen" else "")


def round_name(args: RoundSettings) -> str:
    """The teacher's directory under a seed's directory: ``_readable_name``, and where that text may
    be shared by other settings (pass-through flags, a float ``:g`` rounds) the first 8 hex digits of
    a hash of the parsed settings (``round_settings``), so that two settings never share a directory."""
    name = _readable_name(args)
    floats = [getattr(args, k, None) for k in ("teacher_noise", "death_penalty")]
    lossy = args.reward_args or getattr(args, "ft_args", "") or any(x and float(f"{x:g}") != x for x in floats)
    if not lossy:
        return name
    text = json.dumps(round_settings(args), sort_keys=True, default=str)
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


SETTINGS_FILE = "settings.json"  # in a round's directory: the settings it was made for (round_settings)


def round_dir(args: RoundSettings) -> Path:
    """The round's directory under ``args.out`` (the seed's), made if missing. A round made before
    ``round_name`` added a hash (named ``_readable_name``) is still found, unless it records other
    settings (its settings file, else its round.json's); found, it records these."""
    new, old = args.out / round_name(args), args.out / _readable_name(args)
    tdir = old if not new.exists() and old != new and old.is_dir() and _made_for(old, args) else new
    tdir.mkdir(parents=True, exist_ok=True)
    settings = round_settings(args)
    if not (tdir / SETTINGS_FILE).exists():
        atomic_write(tdir / SETTINGS_FILE, json.dumps(settings, indent=1, sort_keys=True, default=str).encode())
    return tdir


def _made_for(tdir: Path, args: RoundSettings) -> bool:
    """Whether an old round directory was made with ``args``' settings, or records none."""
    want = json.loads(json.dumps(round_settings(args), sort_keys=True, default=str))
    try:
        return json.loads((tdir / SETTINGS_FILE).read_text()) == want
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return False
    try:
        made = json.loads((tdir / "round.json").read_text())["settings"]
        return round_settings(argparse.Namespace(**{**vars(args), **made})) == round_settings(args)
    except FileNotFoundError:
        return True  # a stopped round of before the record: these settings claim it
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return False


# --- the rounds ---------------------------------------------------------------------------------


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def seed_args(args: RoundSettings, seed: int) -> RoundSettings:
    """``args`` for one seed: its own directory under --out."""
    return replace(args, seed=seed, out=args.out / f"seed{seed}")


def run_v0(args: RoundSettings) -> SeedRun:
    """v0 and its DB (stage 1), the DB's split; the teacher's directory."""
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out}: {e.strerror or e}") from None
    db = args.out / "db"
    v0 = A2CConfig(
        name="round-v0",
        save=str(args.out / "v0"),
        max_steps=int(args.v0_steps * args.scale),
        db_path=str(db),
        record_prob=args.record_prob,
    )
    train_a2c(v0, V0_EVALS, args)
    tdir = round_dir(args)
    return SeedRun(args, tdir, db, split_db(db, args.out, args.holdout, args.seed), best_policy(args.out / "v0"))


def fine_tune_arms(sr: SeedRun, k: int, reward: Path) -> dict[str, tuple[str, Path]]:
    """Round ``k``'s control and rlhf fine-tunes: (TensorBoard name, save directory) per arm."""
    args, rdir = sr.args, sr.tdir / f"r{k}"
    steps, fresh = int(args.ft_steps * args.scale), k == 1 or args.start == "v0"
    ctl_base = args.out / ("control" if args.ft_layers == "frozen" else f"control-{args.ft_layers}")
    ctl_dir = ctl_base / f"r{1 if args.start == 'v0' else k}"
    ctl_start = sr.v0_policy if fresh else best_policy(ctl_base / f"r{k - 1}")
    ctl_name = f"round-{ctl_base.name}-{ctl_dir.name}"
    control = A2CConfig(
        name=ctl_name, save=str(ctl_dir), max_steps=steps, model=str(ctl_start), **ft_settings(args.ft_layers)
    )
    train_a2c(control, args.evals, args)
    rl_name = f"round-rlhf-{sr.tdir.name}-r{k}"
    train_a2c(rlhf_config(args, rl_name, rdir / "rlhf", rlhf_start(sr, k), reward), args.evals, args)
    arms = {"control": (ctl_name, ctl_dir), "rlhf": (rl_name, rdir / "rlhf")}
    if args.oracle_arm:  # the true score through the rlhf arm's path: -r's stats, --ft-args, no DB
        or_start = sr.v0_policy if fresh else best_policy(sr.tdir / f"r{k - 1}" / "oracle")
        or_name = f"round-oracle-{sr.tdir.name}-r{k}"
        oracle_cfg = rlhf_config(args, or_name, rdir / "oracle", or_start, reward, oracle=True)
        train_a2c(oracle_cfg, args.evals, args, reward_oracle=True)
        arms["oracle"] = (or_name, rdir / "oracle")
    return arms


def run_round(sr: SeedRun, k: int) -> dict[str, Any]:
    """Round ``k``: ``reward_round``, both fine-tunes, the evaluation games; its rows, reward-model
    figures, label evidence, watch and curves."""
    args, rdir = sr.args, sr.tdir / f"r{k}"
    reward, figures = reward_round(sr, k)
    figs = figures["reward_model"]
    arms = fine_tune_arms(sr, k, reward)
    policies = {"v0": sr.v0_policy, **{arm: d / "last.pt" for arm, (_, d) in arms.items()}}
    evals = args.out / "eval"
    caches = {"v0": evals / "v0.json", "control": evals / f"control-{arms['control'][1].name}.json"}
    caches["rlhf"] = rdir / "eval.json"
    caches["oracle"] = rdir / "eval-oracle.json"
    rows = {arm: arm_row(evaluate_arm(policies[arm], caches[arm], args)) for arm in ARMS if arm in policies}
    tb, rl_name = args.out / "tb", arms["rlhf"][0]
    figs["step_corr_finetune"] = _mean(tb_scalars(tb, rl_name, "reward_model/step_corr")[1])
    own_db = rdir / "rlhf-db"
    if list_segments(own_db, warn=None):
        figs["own_clips"] = cached_json(
            rdir / "own_clips.json",
            lambda: own_clip_figures(own_db, reward, args.dev),
            {"reward": file_digest(reward), "segments": len(list_segments(own_db, warn=None))},
        )
    watch = {
        "return_corr": _mean(tb_scalars(tb, rl_name, "reward_model/true_vs_pred_corr")[1]),
        "surface_share": rows["rlhf"].get("surface_share", math.nan),
    }
    curves = {arm: {tag: tb_scalars(tb, name, tag) for tag in CURVE_TAGS} for arm, (name, _) in arms.items()}
    return {"rows": rows, **figures, "watch": watch, "curves": curves}


def print_reward_notes(k: int, r: dict[str, Any]) -> None:
    """The reward model's held-out figures (overall, per deciding rule, on low-gauge diver steps)
    and how the round's labels were decided."""
    rm = r["reward_model"]
    if "previous_on_new_labels" in rm:
        print(
            f"round {k}: round {k - 1}'s reward model agreed with {100 * rm['previous_on_new_labels']:.1f}% of this "
            f"round's {rm['previous_on_new_pairs']} new labels (its agent's own clips) before training on them"
        )
    print_model_figures(f"round {k}: reward model", rm)
    if "life_loss_z" in rm:
        print(
            f"  normalised reward where a life is lost {rm['life_loss_z']:+.2f} ({rm['life_losses']} losses), "
            f"the {LIFE_LOSS_LEAD} steps before {rm['pre_loss_z']:+.2f} (the median step is 0)"
        )
    print_evidence(r["evidence"])


def print_round_notes(k: int, r: dict[str, Any]) -> None:
    """``print_reward_notes``, what the model pays for a death on the rlhf agent's own clips, and
    the reward-hacking watch."""
    print_reward_notes(k, r)
    if own := r["reward_model"].get("own_clips"):
        print(
            f"  on the rlhf agent's own {own['segments']} clips: normalised reward where a life is lost "
            f"{own['life_loss_z']:+.2f} ({own['life_losses']} losses), the {LIFE_LOSS_LEAD} steps before "
            f"{own['pre_loss_z']:+.2f} (the median step is 0)"
            + (f", the mean step {own['mean_z']:+.3f}" if "mean_z" in own else "")
        )
    w = r["watch"]
    print(
        f"  reward-hacking watch: rlhf's paid (normalised) vs true game return correlation {w['return_corr']:+.2f} "
        f"(mean over its fine-tune), share of its eval steps at the surface "
        f"{100 * w['surface_share']:.1f}%"
    )


def report_seed(sr: SeedRun, results: list[dict[str, Any]], t0: float) -> list[dict[str, dict[str, float]]]:
    """One seed's table, notes, targets, round.png and round.json; returns its rows per round."""
    args = sr.args
    rounds = [r["rows"] for r in results]
    title = f"{args.teacher} teacher, {args.rounds} round(s) of {args.labels} {args.sampling} labels, "
    title += f"v0 {int(args.v0_steps * args.scale):,} steps, fine-tunes {int(args.ft_steps * args.scale):,} "
    title += f"steps from {'v0' if args.start == 'v0' else 'the best of the round before'}"
    title += f", reward model {args.reward_args}" if args.reward_args else ""
    plot(sr.tdir / "round.png", [r["curves"] for r in results], rounds[0]["v0"], title)
    print(f"\n## Rounds: {title}, {args.eval_games} eval games (one seed: {args.seed})\n")
    print(table(rounds) + "\n")
    for k, r in enumerate(results, start=1):
        print_round_notes(k, r)
    checks = targets(args.teacher, rounds) + model_targets(args.teacher, results)
    for what, ok in checks:
        print(f"target: {what}: {'n/a (no such pair)' if ok is None else 'met' if ok else 'MISSED'}")
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rounds": [{key: r[key] for key in ("rows", "reward_model", "evidence", "watch")} for r in results],
        "targets": {what: ok for what, ok in checks},
    }
    atomic_write(sr.tdir / "round.json", json.dumps(report, indent=1).encode())
    print(f"\n{sr.tdir / 'round.png'}, {sr.tdir / 'round.json'} ({(time.time() - t0) / 60:.1f} min so far)")
    return rounds


def report_seeds(args: RoundSettings, per_seed: list[list[dict[str, dict[str, float]]]], name: str) -> None:
    """The rows averaged over the seeds (each ``±``: the 95% interval across seeds) and the targets,
    written to ``--out/<name>.json`` (``name``: the seeds' round directory)."""
    rows = across_seeds(per_seed)
    seeds = ",".join(map(str, args.seeds))
    print(
        f"\n## {args.teacher} teacher, seeds {seeds}: means over {len(per_seed)} seeds (± 95% interval across them)\n"
    )
    print(table(rows) + "\n")
    checks = targets(args.teacher, rows)
    for what, ok in checks:
        print(f"target (mean of the seeds): {what}: {'met' if ok else 'MISSED'}")
    path = args.out / f"{name}.json"
    report = {"seeds": args.seeds, "rounds": rows, "targets": {what: ok for what, ok in checks}}
    atomic_write(path, json.dumps(report, indent=1).encode())
    print(f"\n{path}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check(args)
    t0 = time.time()
    per_seed, names = [], set()
    for seed in args.seeds:
        sr = run_v0(seed_args(args, seed))
        names.add(sr.tdir.name)
        if args.live:
            per_seed.append(report_live(sr, run_live(sr), t0))
            continue
        if args.reward_only:  # the inner loop: round 1's labels and reward model, no fine-tune
            reward, figures = reward_round(sr, 1)
            print(f"\n## seed {seed}: {sr.tdir.name}, reward model {reward}\n")
            print_reward_notes(1, figures)
            continue
        results = [run_round(sr, k) for k in range(1, args.rounds + 1)]
        per_seed.append(report_seed(sr, results, t0))
    if len(args.seeds) > 1 and not args.reward_only and not args.live:
        report_seeds(args, per_seed, names.pop() if len(names) == 1 else round_name(args))


def cli() -> None:
    try:
        with SignalStop(at_once=True, signals=PARENT_SIGNALS):  # SIGTERM and SIGHUP: the Ctrl-C path
            run_cli(main)
    except KeyboardInterrupt:
        print("\ninterrupted: every finished stage is kept; run the same command to continue", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
