"""Every command line declares its settings the one way (``lib.core.settings``): for every stage and
experiment, each field is in ``--help`` with its default, and each field's own check refuses a bad
value in one line that names the flag (the stages turn that line into exit 2)."""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from lib.core.errors import UserError
from lib.core.settings import check_fields, flag_of

ROOT = Path(__file__).resolve().parents[1]

# (module of the settings class, its name, module of the parser, its builder)
COMMAND_LINES = [
    ("lib.a2c.config", "A2CConfig", "lib.a2c.cli", "build_parser"),
    ("lib.label_ui.config", "LabelConfig", "lib.label_ui.config", "build_parser"),
    ("lib.reward.config", "RewardArgs", "lib.reward.cli", "build_parser"),
    ("lib.play.config", "PlayConfig", "lib.play.cli", "build_parser"),
    ("experiments.branch", "BranchCommand", "experiments.branch", "build_parser"),
    ("experiments.compare_arms", "CompareArmsSettings", "experiments.compare_arms", "build_parser"),
    ("experiments.live", "DemoSettings", "experiments.live", "build_parser"),
    ("experiments.probe", "ProbeSettings", "experiments.probe", "build_parser"),
    ("experiments.quality", "QualitySettings", "experiments.quality", "build_parser"),
    ("experiments.reward_path", "RewardPathSettings", "experiments.reward_path", "build_parser"),
    ("experiments.round_settings", "RoundSettings", "experiments.round", "build_parser"),
    ("experiments.sampling", "SamplingSettings", "experiments.sampling", "build_parser"),
]
# Values tried on each checked field until one of its checks refuses it.
BAD_VALUES = [-1, -0.5, 0, 10**15, math.nan, math.inf, "", "..", "no/such", "0x0", "not-a-choice", [], ["x"], (0, 0)]


def _settings(entry):
    cls = getattr(importlib.import_module(entry[0]), entry[1])
    parser = getattr(importlib.import_module(entry[2]), entry[3])()
    return cls, parser, [f for f in fields(cls) if "group" in f.metadata]


def _default(f):
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]


def _refused(check, value) -> bool:
    try:
        return not check[0](value)
    except Exception:  # a value of another type than the check reads: not a test of it
        return False


@pytest.mark.parametrize("entry", COMMAND_LINES, ids=[e[1] for e in COMMAND_LINES])
def test_each_field_is_in_help_with_its_default(entry) -> None:
    cls, parser, settings = _settings(entry)
    text = " ".join(parser.format_help().split())
    assert settings, f"{entry[1]} declares no setting"
    for f in settings:
        name = (f.metadata["arg"].get("metavar") or f.name) if f.metadata["positional"] else flag_of(f)
        assert name.lower() in text.lower(), f"{entry[1]}.{f.name}: {name} not in --help"
        default = _default(f)
        if default in (None, "", []) or isinstance(default, bool) or f.metadata["positional"]:
            continue
        action = next(a for a in parser._actions if a.dest == f.name)
        shown = " ".join(parser._get_formatter()._expand_help(action).split()) if action.help else ""
        assert str(action.default) in shown or "default" in shown, f"{entry[1]}.{f.name}: default not in its help"


@pytest.mark.parametrize("entry", COMMAND_LINES, ids=[e[1] for e in COMMAND_LINES])
def test_each_check_refuses_a_bad_value_in_one_line_naming_its_flag(entry) -> None:
    cls, _, settings = _settings(entry)
    checked = [f for f in settings if f.metadata["checks"]]
    for f in checked:
        base = object.__new__(cls)
        for g in fields(cls):
            object.__setattr__(base, g.name, _default(g))
        bad = next((v for v in BAD_VALUES if any(_refused(c, v) for c in f.metadata["checks"])), MISSING)
        if bad is MISSING:  # a check no value of BAD_VALUES fails (a cross-type one): the stage's own tests
            continue
        repeated = f.metadata["arg"].get("action") == "append"  # a flag given more than once: each value checked
        object.__setattr__(base, f.name, [bad] if repeated else bad)
        with pytest.raises(UserError) as e:
            check_fields(base)
        line = str(e.value)
        assert "\n" not in line and line, f"{entry[1]}.{f.name}: {line!r}"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["01_a2c.py", "-n", "x", "--envs", "0"], "--envs"),
        (["03_reward_train.py", "-n", "../x", "-o", "out", "db"], "-n"),
        (["04_play.py", "-m", "x.pt", "--episodes", "0"], "-n"),
        (["-m", "experiments.probe", "--states", "s", "--policy", "p.pt", "--tries", "0"], "--tries"),
    ],
    ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a,
)
def test_a_stage_refuses_a_bad_value_in_one_line_exit_2(argv: list[str], flag: str, tmp_path: Path) -> None:
    """Through the real script: the field's check is one line on stderr naming the flag, exit code
    2, nothing written."""
    cmd = [sys.executable, *argv] if argv[0] == "-m" else [sys.executable, str(ROOT / argv[0]), *argv[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and flag in lines[0], r.stderr
    assert not any(tmp_path.iterdir())
