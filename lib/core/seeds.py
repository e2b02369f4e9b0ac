"""The one bound on every ``--seed``. ALE seeds env i with ``seed + i`` as a C++ int, and evaluation
uses ``seed + EVAL_SEED_OFFSET + i``, so a seed and both offsets must fit in 31 bits; one bound for
every stage, so a seed one stage takes is never refused by the next."""

from __future__ import annotations

EVAL_SEED_OFFSET = 10_000  # evaluation games use seeds apart from the training envs'
MAX_SEED = 2**31 - 1 - 2 * EVAL_SEED_OFFSET


# A --seed setting's check (lib.core.settings): a seed out of 0..MAX_SEED is one line (None: not given).
SEED_CHECKS = ((lambda v: v is None or 0 <= v <= MAX_SEED, f"{{flag}} must be in 0..{MAX_SEED}, got {{v}}"),)
