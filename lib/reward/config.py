"""Stage 3's settings: the reward networks' names, ``RewardArgs``, the one place each flag of
``03_reward_train.py`` is declared (``lib/reward/cli.py`` builds the parser from it), and the training
code's inputs made from it, ``TrainConfig`` and ``FollowConfig``. Imports no torch: ``--help`` is fast."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from lib.atari.envs import POLICY_FRAME
from lib.core.settings import SEED_CHECKS, Check, check_between, check_fields, setting
from lib.models.reward_spec import ARCHS, DIFF_BLOCK, MAX_ENSEMBLE, check_block
from lib.models.teachers import DEFAULT_DEATH_PENALTY, DEFAULT_TEACHER, TEACHERS, teacher_help

INPUTS = ("full",)  # --input of the book's net: its frames as recorded (the book's)
# Settings the measurements retired: each refused in one line that says why (lib.core.settings ``retired``).
RETIRED_INPUTS = {
    "half": "was retired after commit a8a38db: the book's net on 105x80 frames reached 68.9-70.4% held-out "
    "agreement against the diff net's 90.8-92.5% on the same labels (docs/results.md); give full"
}

# Epochs without a better test loss before training stops, per arch: the book's 4. The diff net's
# epochs cost almost nothing (cached features), and 20 agreed better on every DB and teacher
# measured; more gave the same models (docs/results.md).
PATIENCE = {"diff": 20, "book": 4}
MAX_LR = 1.0
MAX_RETRAIN_EVERY = 1_000_000
MAX_POLL = 3600.0
AT_LEAST_ONE: tuple[Check] = ((lambda v: v is None or v >= 1, "{flag} must be at least 1, got {v}"),)


@dataclass
class FollowConfig:
    """``--follow``'s settings (``lib/reward/follow.py``). 20 labels a version: a few minutes of a
    person's labelling, and about 4 more held-out pairs to judge it by at the default --test-ratio."""

    retrain_every: int = 20  # --retrain-every: new labels (new or edited answers) between versions
    poll: float = 5.0  # --poll: seconds between looks at the label files


def _is_block(block: Any) -> bool:
    try:
        check_block(block)
    except ValueError:
        return False
    return True


def block_arg(text: str) -> tuple[int, int]:
    """--diff-block ROWSxCOLS -> (rows, cols); whether they divide 84 is checked with the rest."""
    rows, sep, cols = text.lower().partition("x")
    if not sep or not rows.strip().isdigit() or not cols.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 4x12, got {text!r}")
    return int(rows), int(cols)


def _plain_name(name: str | None) -> bool:
    """``-n`` names a file in OUTDIR: a plain name only (None: not given, training asks for it)."""
    return name is None or not ("/" in name or "\0" in name or name.startswith(".") or len(name) > 100)


@dataclass(frozen=True, kw_only=True)
class RewardArgs:
    """Everything ``03_reward_train.py`` is told: each field is one flag (``setting``), in
    ``--help`` order. None for --teacher, --death-penalty, --retrain-every, --poll: not given (each
    belongs to one mode, which holds its default). ``TrainConfig`` runs the same checks on a config
    made in code."""

    # core: what to do, where, and the optimiser
    evaluate: str | None = setting(
        None,
        "train nothing: score this reward model on the DBs' segments with true rewards (oracle agreement "
        "over all pairs whose true returns differ, return and per-step correlation, and the agreement with "
        "--teacher's own answers over all pairs it prefers one of, per deciding rule too), one line per DB "
        "and a total",
        group="core",
        metavar="MODEL",
    )
    teacher: str | None = setting(
        None,
        f"--evaluate: whose rule the model is scored against beside the bare score (default "
        f"{DEFAULT_TEACHER}): " + teacher_help(),
        group="core",
        choices=TEACHERS,
    )
    death_penalty: float | None = setting(
        None,
        f"--evaluate with the score teacher: each life lost in a clip costs P points of its sum, as "
        f"02_label_ui.py --oracle labels (default {DEFAULT_DEATH_PENALTY:g}; 0: the bare score's order)",
        group="core",
        type=float,
        metavar="P",
    )
    dev: str = setting("cpu", "torch device to train on: cpu or cuda", group="core")
    epochs: int = setting(100, "maximum epochs (early stopping usually ends sooner)", group="core", checks=AT_LEAST_ONE)
    # Batch 16 and lr 3e-4 replace the book's 64 and 1e-4: better agreement with the true score on
    # never-seen segments at the same cost per pair (docs/results.md).
    batch: int = setting(16, "labeled pairs per optimiser step (the book: 64)", group="core", checks=AT_LEAST_ONE)
    lr: float = setting(
        3e-4,
        "Adam learning rate (the book: 1e-4)",
        group="core",
        checks=[(lambda v: 0 < v <= MAX_LR, f"{{flag}} must be positive and at most {MAX_LR:g}, got {{v}}")],
    )
    seed: int = setting(42, "seed of the train/test split, shuffling and weights", group="core", checks=SEED_CHECKS)
    test_ratio: float = setting(
        0.2,
        "share of the labels held out for testing (--follow: about this share, chosen by a hash of the pair "
        "and --seed, so that a label held out for one version stays held out)",
        group="core",
        checks=[(lambda v: 0 < v < 1, "{flag} must be between 0 and 1, got {v}")],
    )
    patience: int | None = setting(
        None,
        "stop after this many epochs without a better test loss (default: 20 for --arch diff, "
        "whose epochs are cheap; the book's 4 for --arch book)",
        group="core",
        type=int,
        checks=AT_LEAST_ONE,
    )
    micro_frames: int = setting(
        100,
        "steps per forward/backward pass (gradients accumulate up to --batch): bounds memory",
        group="core",
        checks=AT_LEAST_ONE,
    )
    # follow: keep running and retrain as labels arrive
    follow: bool = setting(
        False,
        "stay running: train a new version whenever --retrain-every new labels have arrived in the DBs' "
        "labels.jsonl (a new pair's answer or an edited one; can't-tell and retracted lines do not count), "
        "starting from the installed model's weights; keep each as OUTDIR/reward-NAME-vK.pt, log it in "
        "OUTDIR/reward-NAME-versions.jsonl, and install it as OUTDIR/reward-NAME.pt only when its held-out "
        "loss is not higher than the installed model's on the same held-out labels (held out by a hash of "
        "the pair: a label held out once stays held out). The first version installs when there is no "
        "model. Ctrl-C or SIGTERM stops it (a training in progress is dropped; exit code 130)",
        group="follow",
    )
    retrain_every: int | None = setting(
        None,
        f"--follow: new labels between two versions (default: {FollowConfig.retrain_every})",
        group="follow",
        type=int,
        metavar="K",
        checks=[
            (
                lambda v: v is None or (type(v) is int and 1 <= v <= MAX_RETRAIN_EVERY),
                f"{{flag}} must be an integer in 1..{MAX_RETRAIN_EVERY:,}, got {{v}}",
            )
        ],
    )
    poll: float | None = setting(
        None,
        f"--follow: how often to look at the label files (default: {FollowConfig.poll:g})",
        group="follow",
        type=float,
        metavar="SECONDS",
        checks=[  # NaN fails too
            (
                lambda v: v is None or 0 < v <= MAX_POLL,
                f"{{flag}} must be a number of seconds above 0 and at most {MAX_POLL:g}, got {{v}}",
            )
        ],
    )
    # model: the reward network and its ensemble
    diff_block: tuple[int, int] = setting(
        DIFF_BLOCK,
        f"--arch diff: the block its frame and change are averaged over, each a divisor of 84 "
        f"(default {DIFF_BLOCK[0]}x{DIFF_BLOCK[1]}); finer rows keep apart what sits in different rows of the "
        f"screen (in SeaQuest the score, rows 3-6, and the reserve subs, rows 8-11)",
        group="model",
        type=block_arg,
        metavar="ROWSxCOLS",
        checks=[
            (_is_block, f"{{flag}}: the diff block must be two divisors of {POLICY_FRAME} (rows, cols), got {{v}}")
        ],
    )
    diff_flow: bool = setting(
        False,
        "--arch diff: also the scene's vertical and horizontal shift between the frame and the next "
        "(least squares over the whole frame), two features that say 'moved up' wherever it happens, where "
        "the block means must learn each place from labels (in SeaQuest: the sub climbing)",
        group="model",
    )
    diff_flow_scene: bool = setting(
        False,
        "--diff-flow: also each shift times each block of the frame, so that the model can pay a move by "
        "what the screen shows (in SeaQuest: a climb by the oxygen gauge)",
        group="model",
    )
    ensemble: int = setting(
        1,
        "train K models on bootstrap samples; predict their mean, log their disagreement",
        group="model",
        metavar="K",
        checks=[*AT_LEAST_ONE, (lambda v: v <= MAX_ENSEMBLE, f"{{flag}} must be at most {MAX_ENSEMBLE}, got {{v}}")],
    )
    # labels: the segment DBs and how their answers are read
    dbs: list[str] = setting(
        help="segment DB directories with labels (labels.jsonl)",
        group="labels",
        positional=True,
        nargs="+",
        metavar="DB",
    )
    noise: bool = setting(
        False, "assume 10%% of the answers are random (p' = 0.9 p + 0.05), as in the paper", group="labels"
    )
    env: str | None = setting(
        None, "game of legacy DBs whose segments don't name one (default SeaquestNoFrameskip-v4)", group="labels"
    )
    # output: where the model and the logs go
    name: str | None = setting(
        None,
        "name of the run: the model is OUTDIR/reward-NAME.pt (needed to train)",
        group="output",
        flags=("-n", "--name"),
        checks=[(_plain_name, "-n must be a plain name (no '/', no leading '.', at most 100 characters), got {v!r}")],
    )
    out: str | None = setting(
        None, "directory for the model (needed to train)", group="output", flags=("-o", "--out"), metavar="OUTDIR"
    )
    runs_dir: str = setting("runs", "TensorBoard log directory", group="output")
    no_progress: bool = setting(
        False, "no progress bar (logs only); it is off anyway when stderr is not a terminal", group="output"
    )
    # baselines: the book's network and the paper's score masking, to compare with
    arch: str = setting(
        ARCHS[0],
        "network: diff = grey 84x84 frame and its change to the frame the step led to (sees where "
        "points are scored); book = the book's net on the colour frame the action is chosen on",
        group="baselines",
        choices=ARCHS,
    )
    mask_rows: int = setting(
        0,
        "--arch diff: blank the top N rows of its 84x84 input, as the paper masks the score "
        "(10 covers SeaQuest's score): the model must then learn from the scene",
        group="baselines",
        metavar="N",
        checks=[
            (
                lambda v: 0 <= v < POLICY_FRAME,
                f"{{flag}} must be in 0..{POLICY_FRAME - 1} (rows of the {POLICY_FRAME}x{POLICY_FRAME} input), "
                "got {v}",
            )
        ],
    )
    input: str = setting(
        "full",
        "--arch book's input: full = the 210x160 colour frames, as the book trains on them",
        group="baselines",
        choices=INPUTS,
        retired=RETIRED_INPUTS,
    )

    def check(self) -> None:
        """UserError with one line for the first flag value that cannot work: each flag's own checks
        in ``--help`` order, then the ones between flags (a flag of one mode given in another)."""
        check_fields(self)
        wrong = [
            (self.follow and self.evaluate, "--follow trains and --evaluate only scores a model: give one of them"),
            (self.retrain_every is not None and not self.follow, "--retrain-every applies to --follow only"),
            (self.poll is not None and not self.follow, "--poll applies to --follow only"),
            (self.teacher is not None and not self.evaluate, "--teacher applies to --evaluate only"),
            (self.death_penalty is not None and not self.evaluate, "--death-penalty applies to --evaluate only"),
        ]
        check_between(wrong)

    def follow_config(self) -> FollowConfig:
        """--follow's settings: the ones given, FollowConfig's defaults for the others."""
        given = {"retrain_every": self.retrain_every, "poll": self.poll}
        return FollowConfig(**{k: v for k, v in given.items() if v is not None})


@dataclass
class TrainConfig:
    """The training code's input (``lib/reward/train.py``): each field but ``device`` is the ``RewardArgs``
    flag of the same name, with its default and its checks. ``patience`` None: the arch's (``PATIENCE``)."""

    epochs: int = RewardArgs.epochs
    batch: int = RewardArgs.batch
    lr: float = RewardArgs.lr
    seed: int = RewardArgs.seed
    test_ratio: float = RewardArgs.test_ratio
    patience: int | None = RewardArgs.patience
    noise: bool = RewardArgs.noise
    ensemble: int = RewardArgs.ensemble
    micro_frames: int = RewardArgs.micro_frames
    device: str = RewardArgs.dev  # --dev, resolved (lib.models.policy.resolve_device)
    arch: str = RewardArgs.arch
    mask_rows: int = RewardArgs.mask_rows
    diff_block: tuple[int, int] = RewardArgs.diff_block
    diff_flow: bool = RewardArgs.diff_flow
    diff_flow_scene: bool = RewardArgs.diff_flow_scene

    def check(self) -> None:
        """UserError with one line for the first value that cannot work: the checks of the
        ``RewardArgs`` field of each name, then the network flags that apply to --arch diff only.
        The CLI runs it before reading the DBs (bounds before work), and training again."""
        check_fields(self, declared_by=RewardArgs)
        diff_only = {
            "--mask-rows": self.mask_rows != 0,
            "--diff-block": tuple(self.diff_block) != tuple(DIFF_BLOCK),
            "--diff-flow": self.diff_flow,
            "--diff-flow-scene": self.diff_flow_scene,
        }
        only = diff_only.items()
        check_between(
            [
                *((given and self.arch != "diff", f"{flag} applies to --arch diff only") for flag, given in only),
                (self.diff_flow_scene and not self.diff_flow, "--diff-flow-scene needs --diff-flow"),
            ]
        )
