"""Training, oracle labeling and the round import nothing of video: imageio-ffmpeg (a 68 MB wheel
with an ffmpeg binary) may be missing where no video is written, e.g. on a GPU training box."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import sys
sys.modules["imageio_ffmpeg"] = None  # any import of it now raises ImportError
import lib.a2c.train, lib.play.play, lib.label_ui.oracle, lib.label_ui.clips, lib.reward.train, lib.a2c.reward_env
from lib.core.errors import UserError
from lib.atari.video import _ffmpeg
try:
    _ffmpeg()
except UserError as e:
    print("refused:", e)
"""


def test_stages_import_without_imageio_ffmpeg():
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "refused: writing video needs imageio-ffmpeg" in r.stdout
