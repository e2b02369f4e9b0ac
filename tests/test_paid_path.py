"""The reward path travels with the policy (lib/models/reward_path.py): a fine-tune on a learned
reward stores how it was paid in its checkpoints, and 04_play.py's strip shows the reward as that
run was paid, the path named under it, in the numbers the learner got on the same frames. A
checkpoint from before the record plays, resumes and fine-tunes with the default path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import lib.play.play as play_mod
from lib.a2c.config import A2CConfig
from lib.a2c.run import make_env_stack
from lib.atari.envs import DEFAULT_ENV, AtariVec, VecStep
from lib.atari.video import RewardStrip
from lib.core.errors import UserError
from lib.models.policy import AtariA2C, policy_checkpoint
from lib.models.reward import DiffRewardModel, reward_checkpoint, save_reward_checkpoint
from lib.models.reward_path import RewardPath
from lib.play.config import PlayConfig
from lib.store.checkpoints import atomic_torch_save

ROOT = Path(__file__).resolve().parent.parent
BOOK = ("--reward-norm", "window", "--reward-clip", "sign")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("paid")
    env = AtariVec(DEFAULT_ENV, n_envs=1)
    torch.manual_seed(0)
    net = AtariA2C(env.obs_shape, env.n_actions)
    atomic_torch_save(policy_checkpoint(net, env.env_id, env.game, env.action_meanings, step=0), d / "v0.pt")
    torch.manual_seed(1)
    ck = reward_checkpoint([DiffRewardModel(env.n_actions).eval()], env.env_id, env.game, env.action_meanings, 0.0, 1.0)
    env.close()
    save_reward_checkpoint(ck, d / "reward.pt")
    return {"v0": d / "v0.pt", "reward": d / "reward.pt", "dir": d}


def a2c(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ROOT / "01_a2c.py"), "--envs", "2", "--test-every", "0", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


class ReplayVec:
    """One env that shows recorded frames in turn (``frames[t]`` the frame step t's action was chosen
    on) and pays the recorded score: the learner's reward env over the very frames a game showed."""

    def __init__(self, frames: list[np.ndarray], scores: list[float], meanings: tuple[str, ...]):
        self.rec, self.scores, self.t = frames, scores, 0
        self.n_envs, self.game, self.env_id = 1, "seaquest", DEFAULT_ENV
        self.n_actions, self.action_meanings = len(meanings), meanings

    @property
    def frames(self) -> np.ndarray:
        return self.rec[self.t][None]

    def reset(self) -> None:
        self.t = 0

    def step_async(self, actions: np.ndarray) -> None:
        pass

    def step_wait(self) -> VecStep:
        r = np.array([self.scores[self.t]], np.float32)
        self.t += 1
        z, obs = np.zeros(1, bool), np.zeros((1, 4, 84, 84), np.uint8)
        return VecStep(obs, r.copy(), r, z, z, z, obs, np.full(1, 3, np.int32))

    def close(self) -> None:
        pass


def played(monkeypatch: pytest.MonkeyPatch, cfg: PlayConfig) -> dict[str, Any]:
    """Play one game in process, keeping what the strip was given, the frames, scores and actions
    of each step, and the log."""
    seen: dict[str, Any] = {"paid": [], "frames": [], "scores": [], "actions": [], "log": [], "strips": []}
    add, stepped, select = RewardStrip.add, play_mod._GameRecorder.stepped, play_mod.select_actions
    init = RewardStrip.__init__

    def strip_init(self: RewardStrip, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        seen["strips"].append(self)

    def strip_add(self: RewardStrip, pred_norm: float, true_reward: float) -> None:
        seen["paid"].append(pred_norm)
        add(self, pred_norm, true_reward)

    def recorder_stepped(self: Any, slot: int, frame: np.ndarray, reward: float, *rest: Any) -> None:
        seen["frames"].append(frame.copy())
        seen["scores"].append(reward)
        stepped(self, slot, frame, reward, *rest)

    def select_actions(*a: Any, **k: Any) -> np.ndarray:
        acts = select(*a, **k)
        seen["actions"].append(np.asarray(acts).copy())
        return acts

    monkeypatch.setattr(RewardStrip, "__init__", strip_init)
    monkeypatch.setattr(RewardStrip, "add", strip_add)
    monkeypatch.setattr(play_mod._GameRecorder, "stepped", recorder_stepped)
    monkeypatch.setattr(play_mod, "select_actions", select_actions)
    (seen["result"],) = play_mod.play(cfg, log=seen["log"].append)
    return seen


@pytest.mark.slow
def test_a_window_and_sign_fine_tune_is_shown_as_it_was_paid(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = a2c(tmp_path, "-n", "book", "-m", files["v0"], "-r", files["reward"], "--finetune", "--max-steps", "64", *BOOK)
    assert r.returncode == 0, r.stderr
    last = tmp_path / "saves" / "book" / "last.pt"
    ck = torch.load(last, weights_only=True)
    assert ck["reward_path"] == {"norm": "window", "window": 25, "clip": "sign", "scale": 1.0, "plus_score": False}

    cfg = PlayConfig(model=str(last), reward=str(files["reward"]), record=str(tmp_path / "v"), seed=3, max_steps=90)
    seen = played(monkeypatch, cfg)
    named = [line for line in seen["log"] if line.startswith("reward view:")]
    assert named and "norm window 25, clip sign, scale 1" in named[0], seen["log"]
    (strip,) = seen["strips"]
    assert strip.name == "norm window 25, clip sign, scale 1" and strip.clip == 1.0

    # the learner's reward env, built from the fine-tune's own flags, over the frames the game showed
    paid = np.array(seen["paid"], np.float32)
    run = A2CConfig(name="book", reward=str(files["reward"]), reward_norm="window", reward_clip="sign")
    replay = ReplayVec(seen["frames"], seen["scores"], AtariVec(DEFAULT_ENV, n_envs=1).action_meanings)
    env, _ = make_env_stack(run, replay, torch.device("cpu"), np.random.default_rng(0), None)
    assert env.reward_path == RewardPath.read(ck["reward_path"])
    # the last step's frame after is not shown to an observer: every step before it is compared
    steps = [env.step(seen["actions"][t]).complete() for t in range(len(paid) - 1)]
    np.testing.assert_array_equal(paid[:-1], [st.rewards[0] for st in steps])
    assert set(np.unique(paid)) <= {-1.0, 0.0, 1.0} and len(set(paid.tolist())) > 1
    # the default path (the running norm, ±5), which the strip drew before the record, pays otherwise
    default, norm = RewardPath(), RewardPath().new_norm(1, (0.0, 1.0))
    shown_before = [default.pay(st.pred_rewards, norm, st.true_rewards)[0][0] for st in steps]
    assert not np.array_equal(paid[:-1], shown_before)


@pytest.mark.slow
def test_a_checkpoint_from_before_the_record_plays_resumes_and_fine_tunes(
    files: dict[str, Path], tmp_path: Path
) -> None:
    r = a2c(tmp_path, "-n", "old", "-m", files["v0"], "-r", files["reward"], "--finetune", "--max-steps", "32")
    assert r.returncode == 0, r.stderr
    last = tmp_path / "saves" / "old" / "last.pt"
    ck = torch.load(last, weights_only=False)
    assert ck["reward_path"] == RewardPath().record()
    del ck["reward_path"]  # as the stage 1 of before the record wrote it
    torch.save(ck, last)

    logged: list[str] = []
    cfg = PlayConfig(model=str(last), reward=str(files["reward"]), record=str(tmp_path / "v"), seed=1, max_steps=40)
    (res,) = play_mod.play(cfg, log=logged.append)
    assert res.video is not None and res.video.exists()
    assert any("norm running 10,000, clip 5, scale 1" in line for line in logged), logged

    r = a2c(tmp_path, "-n", "old", "-r", files["reward"], "--resume", "--max-steps", "64")
    assert r.returncode == 0 and "finished at step 64" in r.stdout, r.stderr
    assert torch.load(last, weights_only=True)["reward_path"] == RewardPath().record()

    r = a2c(tmp_path, "-n", "again", "-m", last, "-r", files["reward"], "--finetune", "--max-steps", "32", *BOOK)
    assert r.returncode == 0, r.stderr
    again = torch.load(tmp_path / "saves" / "again" / "last.pt", weights_only=True)
    assert again["reward_path"]["norm"] == "window" and again["reward_path"]["clip"] == "sign"


def test_a_run_on_the_score_records_no_path_and_is_shown_the_default(files: dict[str, Path]) -> None:
    assert A2CConfig(name="x").reward_path() is None
    ck = torch.load(files["v0"], weights_only=True)
    assert play_mod.paid_path(ck, object(), log=lambda _: None) == RewardPath()


@pytest.mark.parametrize(
    "record, why",
    [
        ("window", "must be a dict"),
        ({"norm": "median"}, "norm must be one of running, labels, window"),
        ({"norm": "window", "window": 1}, "norm window must be an integer in 2.."),
        ({"window": 2.5}, "norm window must be an integer"),
        ({"clip": -1}, "clip must be a number in (0, 1000], sign or none"),
        ({"clip": True}, "clip must be"),
        ({"clip": 10**400}, "clip must be"),
        ({"clip": float("inf")}, "clip must be"),
        ({"window": 0}, "norm window must be an integer in 1.."),
        ({"scale": float("nan")}, "scale must be a number"),
        ({"plus_score": 1}, "plus_score must be true or false"),
        ({"norm": "running", "code": "__import__('os')"}, "unknown fields: code"),
        ({1: 2}, "unknown fields: 1"),
    ],
)
def test_a_policys_path_that_is_not_one_is_one_line(files: dict[str, Path], tmp_path: Path, record: Any, why: str):
    ck = torch.load(files["v0"], weights_only=True)
    ck["reward_path"] = record
    bad = tmp_path / "bad.pt"
    torch.save(ck, bad)
    cfg = PlayConfig(model=str(bad), reward=str(files["reward"]), max_steps=5)
    with pytest.raises(UserError, match="field 'reward_path'") as e:
        play_mod.play(cfg, log=lambda _: None)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_the_path_pays_as_the_flags_say() -> None:
    """Each part of the path by hand: the book's window norm then sign, the running norm's prior and
    clip, the scale, the score beside it."""
    book = RewardPath("window", 3, "sign", 0.5)
    norm = book.new_norm(2, None)
    raws = [np.array([1.0, 4.0]), np.array([3.0, 4.0]), np.array([2.0, 10.0]), np.array([0.0, 10.0])]
    got = [book.pay(r.astype(np.float32), norm)[0] for r in raws]
    # env 0: windows [1], [1,3], [1,3,2], [3,2,0]; env 1: [4], [4,4], [4,4,10], [4,10,10]
    want = [[0, 0], [0.5, 0], [0, 0.5], [-0.5, 0.5]]
    np.testing.assert_array_equal(np.stack(got), np.array(want, np.float32))
    run = RewardPath(clip=2.0, scale=3.0, plus_score=True)
    paid, clipped = run.pay(np.array([0.0, 10.0, -1.0], np.float32), run.new_norm(3, (1.0, 0.5)), np.array([0, 7, -3]))
    np.testing.assert_allclose(paid, [-2 * 3.0, 2 * 3.0 + 1, -2 * 3.0 - 1])
    assert clipped == pytest.approx(2 / 3)  # -2 std is at the clip, not past it
    assert run.bound() == 7.0 and book.bound() == 0.5
    assert run.describe() == "norm running 10,000, clip 2, scale 3, plus the score"
    with pytest.raises(ValueError, match="needs the reward model's statistics"):
        RewardPath("labels").new_norm(1, None)
