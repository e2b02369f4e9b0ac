"""Every stage's ``--help`` lists exactly the flags users and scripts rely on (a flag is renamed or
dropped only on purpose, here), and ``--help`` imports no torch, so it answers at once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FLAGS = {
    "01_a2c.py": [
        "-h", "--help", "-n", "--name", "--env", "--dev", "--max-steps", "--seed", "--envs", "--start-states",
        "--start-share", "-m", "--model",
        "--finetune", "--lr", "--lr-decay-steps", "--terminal", "--kl", "--kl-target", "--gamma", "--entropy",
        "--n-steps",
        "--clip-grad", "--resume", "--force", "-r", "--reward", "--reward-reload",
        "--reward-scale", "--reward-norm", "--norm-window", "--reward-clip",
        "--reward-plus-score",
        "--db-path", "--record-prob",
        "--segment-steps",
        "--save", "--test-every", "--test-episodes", "--runs-dir", "--precision", "--threads", "--env-threads",
    ],
    "02_label_ui.py": [
        "-h", "--help", "-d", "--db", "--seed", "--labeler", "--host", "--port", "--token", "--token-file",
        "--no-token", "--public-host", "--fps", "--cache-dir", "--pairs", "--reward", "--sampling", "--pool",
        "--control-rate", "--recent", "--oracle", "--teacher", "--teacher-noise", "--teacher-ties",
        "--death-penalty", "--follow", "--schedule", "--label-rate", "--poll",
    ],
    "03_reward_train.py": [
        "-h", "--help", "--evaluate", "--teacher", "--death-penalty", "--dev", "--epochs", "--batch", "--lr",
        "--seed", "--test-ratio",
        "--patience", "--micro-frames", "--diff-block", "--diff-flow", "--diff-flow-scene", "--arch", "--ensemble",
        "--noise", "--env",
        "-n", "--name", "-o", "--out", "--runs-dir", "--no-progress", "--mask-rows", "--input", "--follow",
        "--retrain-every", "--poll",
    ],
    "04_play.py": [
        "-h", "--help", "-m", "--model", "-e", "--env", "-n", "--episodes", "--dev", "--seed", "--greedy",
        "--max-steps", "-r", "--record", "--reward", "--gif", "--env-threads",
    ],
}  # fmt: skip


def help_text(script: str, *python_args: str) -> str:
    r = subprocess.run(
        [sys.executable, *python_args, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def flags_in_help(text: str) -> list[str]:
    """The option strings of every argument line of argparse's help (``  -m MODEL, --model MODEL  help``)."""
    out = []
    for line in text.splitlines():
        if re.match(r"  -", line):  # an argument's line; its help's continuation lines are indented deeper
            invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            out += re.findall(r"(?:^|, )(-{1,2}[A-Za-z][\w-]*)", invocation)
    return out


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_lists_the_same_flags(script: str) -> None:
    assert sorted(flags_in_help(help_text(script))) == sorted(FLAGS[script])


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_imports_no_torch(script: str) -> None:
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{script!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == "NO TORCH", r.stderr


@pytest.mark.parametrize(
    "reward, extra, msg",
    [
        ("broken", (), "reward model"),
        ("no-stats", ("--reward-norm", "labels"), "--reward-norm running"),
    ],
)
def test_a_bad_reward_model_leaves_no_new_db(tmp_path: Path, reward: str, extra: tuple[str, ...], msg: str) -> None:
    """01_a2c.py -r BAD --db-path NEW: one line, exit 2, and no NEW/db.json (the reward model is
    checked before the recorder writes anything)."""
    import torch

    from lib.models.reward import RewardModel, reward_checkpoint, save_reward_checkpoint

    path = tmp_path / "r.pt"
    if reward == "broken":
        path.write_bytes(b"not a checkpoint at all")
    else:
        torch.manual_seed(0)
        model = RewardModel(18, (210, 160, 3)).eval()
        save_reward_checkpoint(reward_checkpoint([model], "SeaquestNoFrameskip-v4", "seaquest", None), path)
    new = tmp_path / "NEW"
    cmd = [sys.executable, str(ROOT / "01_a2c.py"), "-n", "x", "-r", str(path), "--db-path", str(new)]
    cmd += ["--max-steps", "32", "--save", str(tmp_path / "saves"), "--runs-dir", str(tmp_path / "runs"), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and msg in err[0], p.stderr
    assert not (new / "db.json").exists()
    assert not (tmp_path / "saves").exists()


def argument_blocks(text: str) -> list[str]:
    """Each argument of argparse's help with its help text, continuation lines joined."""
    blocks: list[str] = []
    for line in text.splitlines():
        if re.match(r"  -", line):
            blocks.append(line.strip())
        elif blocks and re.match(r"\s{8,}\S", line):
            blocks[-1] += " " + line.strip()
        else:
            blocks.append("")
    return [b for b in blocks if b]


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_shows_each_default_once_and_none_where_there_is_none(script: str) -> None:
    """``lib.core.settings.DefaultsOnceFormatter``: no "(default: None)" or "(default: False)", and no
    flag whose help names its default and gets it appended again."""
    for block in argument_blocks(help_text(script)):
        assert "(default: None)" not in block and "(default: False)" not in block, block
        assert len(re.findall(r"\(default\b", block)) <= 1, block


def _demo_a2c_lines() -> list[list[str]]:
    """The 01_a2c.py command lines of scripts/demo.sh, continuation lines joined, as argument lists."""
    import shlex

    text = (ROOT / "scripts" / "demo.sh").read_text().replace("\\\n", " ")
    lines = [shlex.split(line) for line in text.splitlines() if line.startswith("$PY 01_a2c.py")]
    return [[a.replace("$REWARD", "r.pt") for a in words[2:]] for words in lines]


def test_the_callers_of_01_a2c_give_no_flag_without_the_flag_it_needs(tmp_path: Path, monkeypatch) -> None:
    """01_a2c.py refuses a flag given without the one it needs (--record-prob without --db-path, ...): the
    demo's command lines and every arm of a round (--oracle-arm records nothing, so --ft-args' recording
    flags stay the rlhf arm's) still pass its checks."""
    from experiments.round import build_parser as round_parser
    from experiments.round import check
    from lib.a2c.cli import parse_config

    monkeypatch.chdir(tmp_path)
    lines = _demo_a2c_lines()
    assert len(lines) == 2
    for argv in lines:
        parse_config(argv)
    ft_args = "--record-prob 0.01 --segment-steps 20 --reward-norm window --norm-window 30"
    for extra in ([], ["--oracle-arm"], ["--oracle-arm", "--ft-args", ft_args]):
        args = round_parser().parse_args(["--out", str(tmp_path), "--teacher", "score", "--labels", "15", *extra])
        check(args)
