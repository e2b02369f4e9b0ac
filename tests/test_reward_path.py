"""experiments/reward_path.py: a reward model's predictions sent through each of stage 1's reward
paths offline (the running median or each env's window; the ±5 clip or the sign)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import reward_path
from lib.core.errors import UserError
from lib.models.reward_path import WindowNorm, normalised

ROOT = Path(__file__).resolve().parents[1]


def test_each_path_pays_what_the_learner_would_get() -> None:
    rng = np.random.default_rng(0)
    preds = [rng.normal(size=12) * 3 + 1, rng.normal(size=9) - 4]
    running = reward_path.path_rewards(preds, "running", "5")
    np.testing.assert_allclose(np.concatenate(running), np.clip(normalised(np.concatenate(preds)), -5, 5), rtol=1e-6)
    window = reward_path.path_rewards(preds, "window", "5", window=4)
    for p, z in zip(preds, window, strict=True):  # each clip its own env, its window restarted
        wn = WindowNorm(4, 1)
        np.testing.assert_allclose(z, [np.clip(wn.normalise(np.array([x]))[0], -5, 5) for x in p], rtol=1e-6)
    signed = reward_path.path_rewards(preds, "window", "sign", window=4)
    assert all(set(np.unique(z)) <= {-1.0, 0.0, 1.0} for z in signed)
    np.testing.assert_array_equal(np.concatenate(signed), np.sign(np.concatenate(window)))
    # a model paying height: through the window the climb is paid, through the running median the place
    height = [np.r_[np.zeros(10), np.arange(1, 11), np.full(10, 10.0)]]
    climb = np.zeros(30, dtype=bool)
    climb[10:20] = True
    w, r = reward_path.path_rewards(height, "window", "5", 5)[0], reward_path.path_rewards(height, "running", "5")[0]
    assert w[climb].mean() > w[20:].mean() + 0.5 and r[20:].mean() > r[climb].mean()


def test_the_figures_average_the_flagged_steps() -> None:
    z = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([-1.0, 0.0, 5.0, -2.0])]
    flags = [
        (np.array([1, 1, 0, 0], bool), np.array([1, 0, 0, 0], bool)),
        (np.array([0, 1, 1, 0], bool), np.array([0, 1, 0, 0], bool)),
    ]
    lost = [np.zeros(4, bool), np.array([0, 0, 0, 1], bool)]
    f = reward_path.path_figures(z, flags, lost)
    assert (f["diver_climb_z"], f["diver_still_z"], f["gap"]) == (0.5, 3.5, -3.0)
    assert f["life_loss_z"] == -2.0 and f["life_losses"] == 1 and f["mean_z"] == 1.5
    assert np.isclose(f["pre_loss_z"], np.mean([-1.0, 0.0, 5.0]))  # within the clip that lost it
    assert np.isnan(f["high_gap"]) and f["high_climb_steps"] == 0  # no high-gauge flags given
    high = [(np.array([0, 0, 1, 1], bool), np.array([0, 0, 1, 0], bool)), (np.zeros(4, bool), np.zeros(4, bool))]
    h = reward_path.path_figures(z, flags, lost, high)
    assert h["high_gap"] == 3.0 - 4.0 and h["high_climb_steps"] == 1 and h["gap"] == f["gap"]


@pytest.fixture(scope="module")
def reward_and_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A reward model (untrained) and a DB of pairs a policy played (experiments.branch)."""
    from experiments.branch import ENV_ID, BranchSettings, make_pairs
    from lib.atari.saved_states import SingleGame
    from lib.models.policy import AtariA2C, policy_checkpoint
    from lib.models.reward import new_reward_model, reward_checkpoint, save_reward_checkpoint
    from lib.store.checkpoints import atomic_torch_save

    tmp_path = tmp_path_factory.mktemp("reward_path")
    meanings = SingleGame(0).meanings
    torch.manual_seed(0)
    pol = tmp_path / "p.pt"
    atomic_torch_save(policy_checkpoint(AtariA2C((4, 84, 84), 18), ENV_ID, "seaquest", meanings), pol)
    db = tmp_path / "db"
    make_pairs(pol, db, BranchSettings(pairs=2, steps=8, seed=0), at=lambda f: True, log=lambda m: None)
    reward = tmp_path / "r.pt"
    save_reward_checkpoint(reward_checkpoint([new_reward_model("diff", 18)], ENV_ID, "seaquest", meanings), reward)
    return reward, db


def command(reward: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "experiments.reward_path", "--reward", str(reward), "--db", str(db), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def test_the_command_prints_every_path_and_refuses_a_missing_file(
    tmp_path: Path, reward_and_db: tuple[Path, Path]
) -> None:
    reward, db = reward_and_db
    res = command(reward, db, "--out", str(tmp_path / "o.json"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("| running |") == 2 and res.stdout.count("| window 25 |") == 2
    bad = command(reward, db, "--reward", str(tmp_path / "none.pt"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_bad_out_is_refused_in_one_line_before_the_work(tmp_path: Path, reward_and_db: tuple[Path, Path]) -> None:
    reward, db = reward_and_db
    (tmp_path / "a file").write_text("")
    for out, message in ((tmp_path, "is a directory"), (tmp_path / "a file" / "o.json", "not a writable directory")):
        res = command(reward, db, "--out", str(out))
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
        assert "| running |" not in res.stdout  # refused before the model paid a clip


def test_a_write_that_fails_is_one_line(
    tmp_path: Path, reward_and_db: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reward_path, "atomic_write", full)
    reward, db = reward_and_db
    with pytest.raises(UserError, match=r"^cannot write --out .*o\.json: No space left on device"):
        reward_path.main(["--reward", str(reward), "--db", str(db), "--out", str(tmp_path / "o.json")])
