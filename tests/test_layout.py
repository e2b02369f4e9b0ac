"""The layout's rules (docs/design.md, "The layout"), read from the code's imports by
``bench.bench_layout``: core imports nothing of ours; atari -> core; store -> atari, core; models ->
those three; the four stage packages -> the shared layers and never each other; lib/ never imports
experiments/ or bench/, and those two never each other; no module flat in lib/; no circles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.bench_layout import ROOT, STAGES, broken_rules, circles, count, reach, read_modules


def test_no_import_breaks_the_rules_and_none_runs_in_a_circle() -> None:
    mods = read_modules()
    assert broken_rules(mods) == []
    assert circles(mods) == []


def test_the_reader_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    (tmp_path / "lib" / "core").mkdir(parents=True)
    (tmp_path / "lib" / "models").mkdir()
    for d in ("experiments", "bench"):
        (tmp_path / d).mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "core" / "__init__.py").write_text("")
    (tmp_path / "lib" / "core" / "a.py").write_text("def f():\n    from lib.models import b\n")
    (tmp_path / "lib" / "models" / "__init__.py").write_text("")
    (tmp_path / "lib" / "models" / "b.py").write_text("from . import c\n")
    (tmp_path / "lib" / "models" / "c.py").write_text("import lib.core.a\n")
    for script in STAGES:
        (tmp_path / script).write_text("")
    mods = read_modules(tmp_path)
    assert mods["lib.core.a"].imports >= {"lib.models.b"}
    assert "lib.models.c" in mods["lib.models.b"].imports
    assert broken_rules(mods) == ["lib.core.a -> lib.models.b: core imports the layer above it (models)"]
    assert circles(mods) == [["lib.core.a", "lib.models.b", "lib.models.c"]]
    assert reach("lib.core.a", mods) >= {"lib.models.b", "lib.models.c"}


WRONG = [
    ("lib/play/play.py", "from lib.a2c.config import A2CConfig", "a stage imports another stage (lib.a2c)"),
    ("lib/core/stats.py", "from lib.store.labels import Label", "core imports the layer above it (store)"),
    ("lib/atari/games.py", "import lib.models.policy", "atari imports the layer above it (models)"),
    ("lib/models/teachers.py", "from lib.reward.config import RewardArgs", "a shared layer imports a stage"),
    ("lib/store/labels.py", "from experiments.flags import check_out", "lib/ never imports experiments/"),
    ("experiments/flags.py", "from bench.dbs import make_square_db", "experiments/ never imports bench/"),
    ("bench/dbs.py", "from experiments.probe import find_states", "bench/ never imports experiments/"),
    ("lib/sneaky.py", "", "a module flat in lib/"),
    ("04_play.py", "import experiments.flags", "a stage's script goes past its own package and core"),
    ("01_a2c.py", "from lib.reward.cli import main", "a stage's script goes past its own package and core"),
    ("lib/misc/__init__.py", "", "lib.misc, which is not in the layout"),
]


@pytest.mark.parametrize("where, line, why", WRONG, ids=[w[0] for w in WRONG])
def test_one_wrong_import_added_to_the_tree_is_named(tmp_path: Path, where: str, line: str, why: str) -> None:
    for d in ("lib", "experiments", "bench"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    for script in STAGES:
        shutil.copy(ROOT / script, tmp_path / script)
    target = tmp_path / where
    target.parent.mkdir(exist_ok=True)
    target.write_text((target.read_text() if target.exists() else "") + f"\n\ndef _later():\n    {line or 'pass'}\n")
    broken = broken_rules(read_modules(tmp_path))
    assert len(broken) == 1 and why in broken[0], broken


def test_each_stage_reaches_only_its_own_package_and_the_shared_layers() -> None:
    mods = read_modules()
    for script, stage in STAGES.items():
        reached = reach(script, mods)
        places = {n.split(".")[1] for n in reached if n.startswith("lib.") and n.count(".") >= 1}
        assert places <= {stage, "core", "atari", "store", "models"}, (script, places)
        assert not any(n.startswith(("experiments", "bench")) for n in reached), script
        assert count(reached, mods)[0] > 0
