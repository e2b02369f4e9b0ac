#!/usr/bin/env python3
"""Stage 4: play a saved policy for full games, print the scores, record gameplay videos.

Examples:
    python 04_play.py -m saves/v0 -n 10                              # v0's best policy, 10 games
    python 04_play.py -m saves/v1/last.pt -r videos/v1               # one MP4 per game
    python 04_play.py -m saves/v1 -r videos/v1 --reward saves/reward/reward-v1.pt --gif
"""

from lib.core.errors import run_cli
from lib.play.cli import main

if __name__ == "__main__":
    run_cli(main)
