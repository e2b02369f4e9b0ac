"""What a reward model can be, torch-free so that the stages' ``--help`` never waits for torch: its
architectures, the diff net's averaging block, and the bound on its ensemble. The networks
themselves are ``lib.models.reward``'s."""

from __future__ import annotations

from typing import Any

from lib.atari.envs import POLICY_FRAME

ARCHS = ("diff", "book")  # the first is 03_reward_train.py's default
# The diff net averages (rows, cols) blocks of its 84x84 input. 4x12 keeps SeaQuest's reserve subs
# (rows 8-11) apart from the score (rows 3-6): with 12x12 a lost life looked like points and the
# fine-tune learned to die (docs/results.md).
DIFF_BLOCK = (4, 12)
MAX_ENSEMBLE = 64  # members of one reward model (--ensemble; a checkpoint's state_dicts)


def check_block(block: Any) -> tuple[int, int]:
    """(rows, cols) of a diff net's averaging block, each a divisor of 84; ValueError otherwise
    (a checkpoint's field is untrusted: anything else is refused with one line)."""
    try:
        rows, cols = (int(v) for v in block)
        ok = all(isinstance(v, int | float) and not isinstance(v, bool) and int(v) == v for v in block)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        ok = False
    if not ok or not all(0 < v <= POLICY_FRAME and POLICY_FRAME % v == 0 for v in (rows, cols)):
        raise ValueError(f"the diff block must be two divisors of {POLICY_FRAME} (rows, cols), got {str(block)[:40]}")
    return rows, cols
