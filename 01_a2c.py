#!/usr/bin/env python3
"""Stage 1: train an A2C agent; record segments (--db-path) or learn from a reward model (-r).

Examples:
    python 01_a2c.py -n v0 --db-path db/v0
    python 01_a2c.py -n v1 -m saves/v0/best_....pt -r saves/reward/reward.pt --finetune --db-path db/v1
    python 01_a2c.py -n v1 -m saves/v0 -r saves/reward/reward-v1.pt --reward-reload --finetune --db-path db/v1
        (a live round: switches to each new version 03_reward_train.py --follow installs there)
"""

from lib.a2c.cli import main
from lib.core.errors import run_cli

if __name__ == "__main__":
    run_cli(main)
