#!/usr/bin/env python3
"""Stage 3: train the reward model on the preference labels of one or more segment DBs.

Examples:
    python 03_reward_train.py -n v0 -o saves/reward db/v0 [db/v1 ...]
    python 03_reward_train.py --evaluate saves/reward/reward-v0.pt db/v1 [db/v2 ...]   # score, no training

The best model (lowest test loss) goes to OUTDIR/reward-NAME.pt, for 01_a2c.py -r and 04_play.py.
"""

from lib.core.errors import run_cli
from lib.reward.cli import main

if __name__ == "__main__":
    run_cli(main)
