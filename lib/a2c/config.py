"""Stage 1's settings: the book's hyper-parameters, the bounds a run checks, and ``A2CConfig``,
the one place ``01_a2c.py``'s flags take their defaults from (``lib/a2c/cli.py``), with its checks.
Imports no torch, so that ``--help`` stays fast."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import Field, dataclass, fields, replace
from pathlib import Path
from typing import Any

from lib.a2c.recorder import DEFAULT_RECORD_PROB, DEFAULT_SEGMENT_STEPS, MAX_SEGMENT_STEPS
from lib.atari.envs import DEFAULT_ENV, rom_name
from lib.core.errors import UserError
from lib.core.settings import SEED_CHECKS, at_least, check_between, check_fields, flag_of, setting, within
from lib.models.reward_path import BOOK_NORM_WINDOW, DEFAULT_NORM_WINDOW, REWARD_NORMS, RewardPath, clip_value
from lib.store.segments import MAX_ENV_INDEX

# The book's hyper-parameters (Lapan, ch. 19 / ch. 12).
GAMMA = 0.99
LEARNING_RATE = 7e-4
FINETUNE_LEARNING_RATE = 7e-5
ENTROPY_BETA = 0.01
BATCH_SIZE = 128
REWARD_STEPS = 5
CLIP_GRAD = 0.1
ADAM_EPS = 1e-5
LR_DECAY_STEPS = 10_000_000
MAX_STEP_COUNT = 10**13  # agent steps a flag or a last.pt may name (a 10M-step run is 10**7)
TERMINALS = ("life", "none")  # --terminal: what ends the learner's episode
DEFAULT_START_SHARE = 0.5  # --start-share: half of the resets and lost lives jump to a saved state
DEFAULT_REWARD_CLIP = "5"  # --reward-clip: |normalised reward| at most 5 std; "sign": ptan's np.sign, as the book
MAX_KL_TARGET = 100.0
# --kl's default for a fine-tune on a learned reward (-r from a start policy): the one setting that held
# the frozen-model test on both seeds (docs/results.md); every other run's default is 0
KL_LEARNED_REWARD = 1.0
PRECISIONS = ("fp32", "bf16", "auto")  # --precision; auto is resolved by lib.a2c.run.resolve_precision
MAX_RECORD_ENVS = MAX_ENV_INDEX + 1  # segment DB env directories are two digits (NN/SSSSSSSS.dat)


def _book_value(
    default: float, help: str, flag: str, lo: float, hi: float, ends: str = "[]", metavar: str | None = None
):
    """A setting of the A2C's learning rule (``--gamma``, ``--entropy``, ...): the book's value as its
    default, in the policy group, checked to lie in the range ``_within`` writes."""
    return setting(default, help, group="policy", metavar=metavar, checks=within(flag, lo, hi, ends))


@dataclass(frozen=True)
class A2CConfig:
    """Everything a run is told: each field is one flag of ``01_a2c.py`` (``setting``), listed in
    ``--help`` order; ``check`` runs each flag's own checks, then those between flags."""

    # core
    name: str = setting(
        help="run name: checkpoints go to saves/<name>, logs to runs/",
        group="core",
        flags=("-n", "--name"),
        checks=[(lambda v: v and "/" not in v and v not in (".", ".."), "--name must be plain, got {v!r}")],
    )
    env: str = setting(DEFAULT_ENV, "ALE game, e.g. SeaquestNoFrameskip-v4 or BreakoutNoFrameskip-v4", group="core")
    dev: str = setting("cpu", "torch device for the networks: cpu, cuda or cuda:N", group="core")
    max_steps: int = setting(
        0,
        "stop cleanly after this many agent steps, summed over all envs (0: run until Ctrl-C)",
        group="core",
        checks=[
            (lambda v: v <= MAX_STEP_COUNT, "--max-steps must be at most 1e13, got {v}"),
            (lambda v: v >= 0, "--max-steps must be >= 0, got {v}"),
        ],
    )
    seed: int = setting(
        0,
        "random seed for envs, network init and recording",
        group="core",
        checks=SEED_CHECKS,
    )
    envs: int = setting(
        16,
        "number of games played side by side",
        group="core",
        checks=[
            (lambda v: v >= 1, "--envs must be at least 1, got {v}"),
            (lambda v: v <= 4096, "--envs must be at most 4096, got {v}"),
        ],
    )
    start_states: str | None = setting(
        None,
        "SeaQuest: a DB of saved emulator states (python -m experiments.probe's finder writes one) that lives "
        "may start from: each reset and, with probability --start-share, each lost life jumps to a random one "
        "(a new game for the learner; the training scores are then scores of parts of games). The envs are "
        "emulators stepped in this thread; evaluation games start as always",
        group="core",
        metavar="DIR",
    )
    start_share: float = setting(
        DEFAULT_START_SHARE,
        "with --start-states: the share of resets and lost lives that jump to a saved state",
        group="core",
        checks=within("--start-share", 0, 1),
    )
    # policy: where it starts, how it learns
    model: str | None = setting(
        None,
        "start from this saved policy (.pt) instead of from scratch; a run directory (saves/v0) means its best",
        group="policy",
        flags=("-m", "--model"),
    )
    finetune: bool = setting(
        False, f"freeze the conv layers of -m and train the heads with lr {FINETUNE_LEARNING_RATE}", group="policy"
    )
    lr: float | None = setting(
        None,
        f"learning rate (default {LEARNING_RATE}, {FINETUNE_LEARNING_RATE} with --finetune); "
        "decays linearly to 0 over --lr-decay-steps",
        group="policy",
        type=float,
        checks=[(lambda v: v is None or 0 < v < 1, "--lr must be a number in (0, 1), got {v}")],
    )
    lr_decay_steps: int = setting(
        0,
        f"agent steps over which the lr decays to 0 (0: --max-steps if given, else {LR_DECAY_STEPS:,})",
        group="policy",
        checks=at_least("--lr-decay-steps"),
    )
    terminal: str = setting(
        "life",
        "what ends the learner's episode (the game resets as always): life = every lost life (DeepMind's), "
        "none = nothing (the papers' one continuous episode under a learned reward: the n-step return "
        "bootstraps across a reset; the time limit stays a truncation)",
        group="policy",
        choices=TERMINALS,
        retired={
            "game": "was retired after commit 546964c: never measured, no paper's formulation "
            "(docs/results.md); give life or none"
        },
    )
    kl: float | None = setting(
        None,
        "add B * KL(pi || pi_start) to the loss, a pull toward the policy -m starts from "
        "(finetune/kl_to_start in TensorBoard is logged for every run from -m). Default: "
        f"{KL_LEARNED_REWARD:g} for a fine-tune on a learned reward (-r with -m, or resuming one; without it "
        "the agent games a frozen reward model: docs/results.md), 0 otherwise; --kl 0 turns it off",
        group="policy",
        metavar="B",
        type=float,
        checks=[(lambda v: v is None or 0 <= v < 1e6, "--kl must be in [0, 1,000,000), got {v}")],
    )
    kl_target: float | None = setting(
        None,
        "adapt the --kl coefficient each update so that the mean KL(pi || pi_start) per step tracks T (Ziegler et "
        "al. 2019's proportional controller: the coefficient times 1 + clip(KL/T - 1, -0.2, 0.2) x 128/10,000 per "
        f"update); it starts at --kl (default {KL_LEARNED_REWARD:g}); finetune/kl_coef in TensorBoard",
        group="policy",
        metavar="T",
        type=float,
        checks=[
            (lambda v: v is None or 0 < v <= MAX_KL_TARGET, f"--kl-target must be in (0, {MAX_KL_TARGET:g}], got {{v}}")
        ],
    )
    # the book's constants, each a flag with the book's value as its default
    gamma: float = _book_value(GAMMA, "discount of the n-step returns", "--gamma", 0, 1, "(]")
    entropy: float = _book_value(ENTROPY_BETA, "entropy bonus of the loss", "--entropy", 0, 1000, "[)", "BETA")
    n_steps: int = _book_value(REWARD_STEPS, "rewards summed before bootstrapping", "--n-steps", 1, 1000)
    clip_grad: float = _book_value(CLIP_GRAD, "gradient-norm clip of each update", "--clip-grad", 0, 1e9, "()")
    resume: bool = setting(
        False,
        "continue the run <name> from saves/<name>/last.pt: its weights, optimizer, counters and lr schedule, "
        "and how it learns (-r and the reward's path, --terminal, --kl-target, ...; a flag given again must agree)",
        group="policy",
    )
    force: bool = setting(
        False,
        "start the run <name> over even though saves/<name> holds checkpoints (its best_*.pt and last.pt "
        "are removed first)",
        group="policy",
    )
    # labels: the reward it learns from, the segments it records
    reward: str | None = setting(
        None,
        "learn from this reward model (.pt from 03_reward_train.py) instead of the game score",
        flags=("-r", "--reward"),
        group="labels",
    )
    reward_reload: bool = setting(
        False,
        "live rounds: keep watching the -r file (a stat about once a second) and switch to each new version "
        "between two steps, without stopping (03_reward_train.py --follow installs them); its normalisation "
        "restarts from the new model's stored stats; a broken or wrong-game file is skipped with one warning; "
        "TensorBoard's reward_model/version names the version in use",
        group="labels",
    )
    reward_scale: float = setting(
        1.0,
        "-r: the std of the learned reward the learner gets (the papers: 0.05, near the clipped score's 0.11)",
        group="labels",
        metavar="S",
        checks=within("--reward-scale", 0, 1e6, "()"),
    )
    reward_norm: str = setting(
        "running",
        "-r: where the reward's centre and std come from: running = the agent's own last 10,000 predictions "
        "(median-centred), labels = fixed, the mean and std over the labelled clips stored in the checkpoint "
        "(each version's own under --reward-reload), window = each env's own last --norm-window steps (mean-"
        "centred: the book's, which pays a step for being better than the steps just before it)",
        group="labels",
        choices=REWARD_NORMS,
    )
    norm_window: int = setting(
        BOOK_NORM_WINDOW,
        f"--reward-norm window: agent steps per env the mean and std are taken over ({BOOK_NORM_WINDOW}: the book's "
        "100 frames)",
        group="labels",
        metavar="W",
        checks=[(lambda v: 2 <= v <= 1_000_000, "--norm-window must be in 2..1,000,000, got {v}")],
    )
    reward_clip: str = setting(
        DEFAULT_REWARD_CLIP,
        "-r: the normalised reward is clipped to [-C, C] std, or with 'sign' replaced by its sign (-1, 0 or +1: "
        "ptan's ClipRewardEnv after the book's normalisation), before --reward-scale",
        group="labels",
        metavar="C|sign",
        checks=[
            (
                lambda v: clip_value(v) is not None,
                "--reward-clip must be a number in (0, 1000] or sign, got {v!r}",
            )
        ],  # noqa: E501
    )
    reward_plus_score: bool = setting(
        False,
        "-r: the learner gets the game's sign-clipped score plus the learned reward (after its norm, "
        "clip and --reward-scale) instead of the learned reward alone",
        group="labels",
    )
    db_path: str | None = setting(
        None, "record segments into this DB directory (recording is off without it)", group="labels"
    )
    record_prob: float = setting(
        DEFAULT_RECORD_PROB,
        "per agent step and env, probability to start recording a segment "
        "(the default gives ~2,500 segments over 10M steps)",
        group="labels",
        checks=within("--record-prob", 0, 1),
    )
    segment_steps: int = setting(
        DEFAULT_SEGMENT_STEPS,
        "agent steps per recorded segment",
        group="labels",
        checks=[(lambda v: 1 <= v <= MAX_SEGMENT_STEPS, f"--segment-steps must be in 1..{MAX_SEGMENT_STEPS}")],
    )
    # output: checkpoints, evaluation, logs
    save: str | None = setting(None, "checkpoint directory (default: saves/<name>)", group="output")
    test_every: int = setting(
        100_000,
        "evaluate every this many agent steps (0: never)",
        group="output",
        checks=at_least("--test-every"),
    )
    test_episodes: int = setting(
        10,
        "full games (all lives) per evaluation, played side by side",
        group="output",
        checks=[(lambda v: v >= 1, "--test-episodes must be at least 1, got {v}")],
    )
    runs_dir: str = setting("runs", "TensorBoard log root", group="output")
    # speed
    precision: str = setting(
        "auto",
        "the networks' forward passes: auto (bf16 where the CPU has it natively, AVX512-BF16 or AMX, or "
        "on a GPU that has it; else fp32), fp32, or bf16 (bfloat16 autocast; weights and loss stay "
        "float32; on a CPU without it emulated and slow). Recorded in each checkpoint",
        group="speed",
        choices=PRECISIONS,
    )
    threads: int = setting(0, "torch CPU threads (0: one per core)", group="speed", checks=at_least("--threads"))
    env_threads: int = setting(
        0,
        "emulator threads of every vector env (training and evaluation; 0: the cores this process may "
        "use, divided among the ranks of a torchrun on this machine)",
        group="speed",
        metavar="N",
        checks=at_least("--env-threads"),
    )

    @property
    def bf16(self) -> bool:
        """The forward passes run in bf16 autocast (``precision`` resolved: never "auto" in a run)."""
        return self.precision == "bf16"

    @property
    def save_dir(self) -> Path:
        return Path(self.save or Path("saves") / self.name)

    def reward_path(self) -> RewardPath | None:
        """How -r's raw predictions become what the learner is paid (``lib.models.reward_path``),
        from the flags that shape it; None for a run on the game's score. Checked flags only."""
        if not self.reward:
            return None
        window = self.norm_window if self.reward_norm == "window" else DEFAULT_NORM_WINDOW
        clip = clip_value(self.reward_clip)
        return RewardPath(self.reward_norm, window, clip, float(self.reward_scale), self.reward_plus_score)

    def given(self, name: str) -> bool:
        """Whether the setting ``name`` was given: it is not at its default (a flag given, the checks
        between flags say, is a flag used)."""
        return getattr(self, name) != _DEFAULTS[name]

    def check(self) -> None:
        """UserError with one line for the first flag value that cannot work: each flag's own checks
        (``setting``) in ``--help`` order, then the ones between flags."""
        check_fields(self)
        given = self.given
        wrong = [
            (self.finetune and not (self.model or self.resume), "--finetune needs a policy: give -m MODEL"),
            (self.reward_reload and not self.reward, "--reward-reload watches the reward model: give -r MODEL"),
            ((self.kl or 0) > 0 and not (self.model or self.resume), "--kl pulls toward the policy -m starts from: give -m"),  # noqa: E501
            (self.kl_target is not None and not (self.model or self.resume), "--kl-target pulls toward the policy -m starts from: give -m"),  # noqa: E501
            (self.kl_target is not None and self.kl == 0, "--kl-target adapts the coefficient --kl starts it at: give --kl above 0 or leave it out"),  # noqa: E501
            (given("reward_norm") and not self.reward, f"--reward-norm {self.reward_norm} normalises a learned reward: give -r"),  # noqa: E501
            (given("reward_scale") and not self.reward, "--reward-scale scales a learned reward: give -r"),
            (given("norm_window") and not self.reward, "--norm-window is --reward-norm window's: give -r with --reward-norm window"),  # noqa: E501
            (given("norm_window") and self.reward_norm != "window", f"--norm-window is --reward-norm window's: --reward-norm {self.reward_norm} has none"),  # noqa: E501
            (given("reward_clip") and not self.reward, "--reward-clip clips a learned reward: give -r"),  # noqa: E501
            (self.reward_plus_score and not self.reward, "--reward-plus-score adds a learned reward to the score: give -r"),  # noqa: E501
            (given("record_prob") and not self.db_path, "--record-prob is the chance to record a segment: give --db-path"),  # noqa: E501
            (given("segment_steps") and not self.db_path, "--segment-steps is a recorded segment's length: give --db-path"),  # noqa: E501
            (given("test_episodes") and not self.test_every, "--test-episodes is the games of an evaluation: --test-every 0 turns evaluation off"),  # noqa: E501
            (self.start_states is not None and rom_name(self.env) != "seaquest", f"--start-states restores SeaQuest states: --env {self.env} is another game"),  # noqa: E501
            (given("start_share") and self.start_states is None, "--start-share is the share of lives that start from --start-states: give it"),  # noqa: E501
            (self.resume and self.force, "--resume continues the run, --force starts it over: give one of them"),
            (self.resume and bool(self.model), "--resume continues saves/<name>/last.pt; do not also give -m"),
        ]  # fmt: skip
        check_between(wrong)


_DEFAULTS = {f.name: f.default for f in fields(A2CConfig)}  # each setting's default (-n has none: always given)


def kl_beta(cfg: A2CConfig, has_start: bool, resume_ck: dict | None) -> float:
    """--kl in effect (its default decided here, beside its declaration): as given; unset, the B the
    resumed run had, else ``KL_LEARNED_REWARD`` for a fine-tune on a learned reward (-r with a start
    policy) and 0 for any other run."""
    if cfg.kl is not None:
        return cfg.kl
    if resume_ck is not None and resume_ck.get("kl") is not None:
        return float(resume_ck["kl"])
    return KL_LEARNED_REWARD if (cfg.reward or cfg.kl_target is not None) and has_start else 0.0


# How a run learns, besides where its policy started, its lr and --finetune (fields of their own in
# last.pt): last.pt records these settings and --resume goes on with them; a flag given again must
# say the same. The paths are recorded resolved: a run may be resumed from another directory.
LEARNED_WITH = (
    "reward", "reward_reload", "reward_scale", "reward_norm", "norm_window", "reward_clip", "reward_plus_score",
    "terminal", "kl_target", "start_states", "start_share", "gamma", "entropy", "n_steps",
    "clip_grad",
)  # fmt: skip
_PATHS = ("reward", "start_states")


def learned_with(cfg: A2CConfig) -> dict[str, Any]:
    """What last.pt records of how ``cfg``'s run learns: the ``LEARNED_WITH`` settings, paths resolved."""
    out = {k: getattr(cfg, k) for k in LEARNED_WITH}
    return {k: str(Path(v).resolve()) if k in _PATHS and v is not None else v for k, v in out.items()}


def _kind_ok(f: Field, v: Any) -> bool:
    """Whether a recorded value is of the kind the setting takes (the type its flag parses to; None
    only where None is its default), before its own checks compare numbers with it."""
    if v is None:
        return f.default is None
    want = type(f.default) if f.default is not None else f.metadata["arg"].get("type", str)
    if want is bool:
        return isinstance(v, bool)
    if want is int:
        return type(v) is int
    if want is float:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return isinstance(v, str) and len(v) <= 4096


def _shown(f: Field, v: Any) -> str:
    """A setting's value as its flag reads: ``--terminal none``, ``--reward-plus-score``, ``no --reward``."""
    flag = flag_of(f)
    if v is None or v is False:
        return f"no {flag}"
    return flag if v is True else f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {v}"


def resumed_config(cfg: A2CConfig, ck: dict[str, Any], path: Path, say: Callable[[str], None] = print) -> A2CConfig:
    """``cfg`` for a run resumed from ``ck`` (its last.pt at ``path``): the settings it learned with,
    as last.pt records them (``LEARNED_WITH``, its lr, --finetune), where the command line leaves them
    at their defaults, said in one line; a flag that gives another value is refused in one line. A
    last.pt from before the record resumes with the settings as given. --kl, given, wins (its own
    rule: ``kl_beta``)."""
    declared = {f.name: f for f in fields(A2CConfig)}
    recorded = ck.get("settings") or {}
    if not isinstance(recorded, dict):
        raise UserError(f"checkpoint {path}: field 'settings' must be a dict, got {type(recorded).__name__}")

    def contradicts(f: Field, had: Any, given: Any) -> UserError:
        flag = flag_of(f)
        return UserError(
            f"--resume: {path} learned with {_shown(f, had)}; {_shown(f, given)} contradicts it: resume without "
            f"{flag}, or start a new run from it with -m {path} -n NEW"
        )

    if cfg.lr is not None and "lr" in ck and not math.isclose(cfg.lr, ck["lr"], rel_tol=1e-9):
        raise contradicts(declared["lr"], float(ck["lr"]), cfg.lr)
    if cfg.finetune and not ck.get("finetune", False):
        raise contradicts(declared["finetune"], False, True)
    taken: dict[str, Any] = {}
    for name in LEARNED_WITH:
        if name not in recorded:
            continue  # a last.pt from before this setting was recorded: as given
        f, had, given = declared[name], recorded[name], getattr(cfg, name)
        if not _kind_ok(f, had):
            raise UserError(f"checkpoint {path}: its recorded {flag_of(f)} is {type(had).__name__} {repr(had)[:40]}")
        same = (
            given is not None and had is not None and Path(given).resolve() == Path(had).resolve()
            if name in _PATHS
            else given == had
        )
        if cfg.given(name) and not same:
            raise contradicts(f, had, given)
        if not cfg.given(name) and had != f.default:
            taken[name] = had
    out = replace(cfg, finetune=bool(ck.get("finetune", cfg.finetune)), **taken)
    try:
        out.check()
    except UserError as e:
        raise UserError(f"--resume with what {path} records: {e}") from None
    if taken:
        say(f"--resume: goes on with what {path} records: {' '.join(_shown(declared[k], v) for k, v in taken.items())}")
    return out
