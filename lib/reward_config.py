"""Stage 3's settings: the reward networks' names, the diff net's default block, and
``TrainConfig``, the one place ``03_reward_train.py``'s flags take their defaults from
(``lib/reward_cli.py``). Imports no torch, so that ``--help`` stays fast."""

from __future__ import annotations

from dataclasses import dataclass

ARCHS = ("diff", "book")  # the first is 03_reward_train.py's default
# The diff net averages (rows, cols) blocks of its 84x84 input. 12x12 (a 7x7 grid) was the first
# default and is what diff checkpoints without a "diff_block" field were made with. 4x12 (21 rows of
# 7) keeps SeaQuest's reserve subs (rows 8-11) apart from the score (rows 3-6): with 12-row blocks a
# lost life looked like points (+1.6 to +3.2 std paid on the step a life goes) and the fine-tune
# learned to die (round benchmark, same v0 and labels: 333 +- 33 against 428 +- 55 with 4x12).
DIFF_BLOCK = (4, 12)
INPUTS = {"full": 1, "half": 2}  # --input of the book's net -> TrainConfig.downscale (2x2 average)

# Epochs without a better test loss before training stops, per arch. 4 is the book's. The diff net's
# epochs cost ~nothing (cached features), and on experiments/quality.py (300 labels, 3 splits) 20 agreed
# better on every DB and teacher measured: 86.4 -> 88.8% and 85.7 -> 88.7% (score), 83.9 -> 86.4%
# (oxygen); 40 and 100 gave exactly 20's models (the best epoch always came before 20 more).
PATIENCE = {"diff": 20, "book": 4}


@dataclass
class TrainConfig:
    """Hyper-parameters. Batch 16 and lr 3e-4 replace the book's 64 and 1e-4: on experiments/quality.py
    (300 oracle labels, 3 splits) they agreed better with the true score on never-seen segments
    every time (+0.6 to +4.0 points) at the same cost per pair. ``patience`` None: the arch's
    (``PATIENCE``). Each field but ``downscale`` and ``device`` is the flag of the same name."""

    epochs: int = 100
    batch: int = 16
    lr: float = 3e-4
    seed: int = 42
    test_ratio: float = 0.2
    patience: int | None = None
    noise: bool = False
    ensemble: int = 1
    micro_frames: int = 100
    downscale: int = 1  # --input: 1 full, 2 half (INPUTS)
    device: str = "cpu"  # --dev, resolved (lib.model.resolve_device)
    arch: str = ARCHS[0]
    mask_rows: int = 0
    diff_block: tuple[int, int] = DIFF_BLOCK
    diff_signed: bool = False
    diff_flow: bool = False


@dataclass
class FollowConfig:
    """``--follow``'s settings (``lib/reward_follow.py``). 20 labels a version: a few minutes of a
    person's labelling, and about 4 more held-out pairs to judge it by at the default --test-ratio."""

    retrain_every: int = 20  # --retrain-every: new labels (new or edited answers) between versions
    poll: float = 5.0  # --poll: seconds between looks at the label files


MAX_POLL = 3600.0
