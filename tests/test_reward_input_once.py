"""A diff reward model's input made once a frame (RewardModelWrapper): each step's frames are the
frames the step before led to, so the wrapper keeps their grey instead of greying them again and
holds them instead of copying them; ensemble members that share a feature key share ``features``;
the torch thread count is set only where it differs. None of it may move a reward by one bit: a
real SeaQuest run is checked against every step's input made from copies of its RGB frames
(``reward_input``) and every member run on its own, as the wrapper did before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_reward_wrapper import SEAQUEST, FakeVec

import lib.a2c.reward_env as reward_wrapper
from lib.a2c.reward_env import RewardModelWrapper
from lib.atari.envs import AtariVec
from lib.models.reward import (
    DiffRewardModel,
    RewardPredictor,
    load_reward_model,
    reward_checkpoint,
    reward_input,
    save_reward_checkpoint,
)
from lib.models.reward_path import DEFAULT_CLIP, DEFAULT_NORM_WINDOW, RunningNorm, norm_prior

N_ENVS = 3
STEPS = 120
GAME_FRAMES = 200  # games cut at 200 emulator frames (50 steps): game overs at steps 49 and 110
INNER_RESET, WRAPPER_RESET = 60, 115  # frames replaced behind the wrapper's back, then a reset through it
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _diff_file(path: Path, n_actions: int, mask_rows: tuple[int, ...] = (0, 0, 10), flow: bool = False) -> Path:
    """A diff ensemble with random weights, one member per ``mask_rows``: two feature keys when
    they differ. No stored stats: the running norm moves from the first step."""
    torch.manual_seed(0)
    models = [DiffRewardModel(n_actions, mask_rows=m, flow=flow, flow_scene=flow).eval() for m in mask_rows]
    save_reward_checkpoint(reward_checkpoint(models, SEAQUEST, "seaquest", None), path)
    return path


def _small_diff_file(path: Path) -> Path:
    """One diff member with random weights for ``FakeVec``'s 48x48 frames."""
    torch.manual_seed(0)
    save_reward_checkpoint(
        reward_checkpoint([DiffRewardModel(18, (48, 48, 3)).eval()], SEAQUEST, "seaquest", None), path
    )
    return path


def _old_members(rm: RewardPredictor, frames: np.ndarray, acts: np.ndarray, shown: np.ndarray, ended: np.ndarray):
    """(K, N): the input made from the step's own RGB frames, each member's whole forward on it."""
    x = torch.from_numpy(np.asarray(reward_input("diff", frames, shown, ended))).to(rm.device)
    a = torch.from_numpy(acts).to(rm.device)
    with torch.inference_mode():
        return torch.stack([net(x, a) for net in rm.nets])


def _paid(rm: RewardPredictor, members: list[torch.Tensor]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The raw predictions and the learner's rewards of these steps, as ``_predicted`` makes them
    with the wrapper's defaults (running norm from the model's stats, clipped at 5 std, scale 1)."""
    norm = RunningNorm(DEFAULT_NORM_WINDOW, prior=norm_prior(rm))
    raws, rewards = [], []
    for m in members:
        raw = m.float().cpu().numpy().mean(0).astype(np.float32)
        raws.append(raw)
        rewards.append((np.clip(norm.normalise(raw), -DEFAULT_CLIP, DEFAULT_CLIP) * 1.0).astype(np.float32))
    return raws, rewards


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flow", [False, True])
def test_a_real_run_pays_bit_for_bit_what_each_step_made_afresh_pays(tmp_path, monkeypatch, device: str, flow: bool):
    """SeaQuest, stepped as the training loop steps it (the next step sent before ``complete()``),
    through game overs, frames replaced behind the wrapper (the inner env's reset) and a reset:
    ``pred_rewards`` and ``rewards`` equal, bit for bit, what each step's input made from copies of
    its frames gives. On CUDA the policy's grey comes from ``TorchGrey84``: the wrapper must not
    use it. Each step greys N frames (the first after a reset or replacement 2N), not 2N."""
    greyed = []

    def counted(frames: np.ndarray) -> np.ndarray:
        greyed.append(len(frames))
        return grey84(frames)

    grey84 = reward_wrapper.grey84
    monkeypatch.setattr(reward_wrapper, "grey84", counted)
    env = AtariVec(n_envs=N_ENVS, seed=7, num_threads=1, max_game_frames=GAME_FRAMES, device=device)
    w = RewardModelWrapper(env, _diff_file(tmp_path / "d.pt", env.n_actions, flow=flow), device=device, verbose=False)
    rm = load_reward_model(tmp_path / "d.pt", device=device)
    assert len(set(rm.feature_keys())) == 2
    rng = np.random.default_rng(0)
    steps, made = [], []
    w.reset()
    frames, acts = env.frames.copy(), rng.integers(0, env.n_actions, N_ENVS)
    w.step_async(acts)
    for t in range(STEPS):
        st = w.step_wait()
        shown, ended = env.frames.copy(), np.array(st.game_over, dtype=bool)
        made.append(_old_members(rm, frames, acts, shown, ended))
        steps.append((st, ended))
        if t + 1 < STEPS:
            if t == INNER_RESET:
                env.reset()  # a new frames array the wrapper did not see a step lead to
            if t == WRAPPER_RESET:
                w.reset()
            frames, acts = env.frames.copy(), rng.integers(0, env.n_actions, N_ENVS)
            w.step_async(acts)  # the env steps while this step's forward runs
        st.complete()
    w.close()
    assert sum(bool(e.any()) for _, e in steps[:-1]) >= 2  # game overs with a step after them
    raws, rewards = _paid(rm, made)
    for t, ((st, _), raw, paid) in enumerate(zip(steps, raws, rewards, strict=True)):
        assert np.array_equal(st.pred_rewards, raw), f"step {t}: {st.pred_rewards} != {raw}"
        assert np.array_equal(st.rewards, paid), f"step {t}: {st.rewards} != {paid}"
    assert sum(greyed) == (STEPS + 3) * N_ENVS  # once a step; twice after the start and the 2 resets


def test_an_env_that_writes_into_its_frames_still_gets_each_steps_own(tmp_path):
    """``FakeVec`` overwrites the frames it handed out when the next step is sent; stepped one step
    at a time (``step()``: each forward before the next send) the kept grey is the frames' own,
    where the step ended the game too (env 1 ends every step)."""
    env = FakeVec(n_envs=4, seed=5)
    env.ends[1] = True
    path = _small_diff_file(tmp_path / "d.pt")
    w = RewardModelWrapper(env, path, verbose=False)
    rm = load_reward_model(path)
    rng = np.random.default_rng(0)
    made, got = [], []
    for _ in range(12):
        frames, acts = env.frames.copy(), rng.integers(0, 18, 4)
        st = w.step(acts)
        made.append(_old_members(rm, frames, acts, env.frames.copy(), np.array(st.game_over, dtype=bool)))
        got.append(st)
    raws, rewards = _paid(rm, made)
    for st, raw, paid in zip(got, raws, rewards, strict=True):
        assert np.array_equal(st.pred_rewards, raw) and np.array_equal(st.rewards, paid)


def test_members_sharing_a_feature_key_share_one_features_pass(monkeypatch):
    """Three members, two feature keys (mask_rows 0, 0, 10): two ``features`` passes, and each
    member's predictions equal its own whole forward's, bit for bit."""
    torch.manual_seed(0)
    models = [DiffRewardModel(18, mask_rows=m).eval() for m in (0, 0, 10)]
    rm = RewardPredictor(models, reward_checkpoint(models, SEAQUEST, "seaquest", None))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (5, 2, 84, 84), dtype=np.uint8)
    a = rng.integers(0, 18, 5)
    with torch.inference_mode():
        want = torch.stack([net(torch.from_numpy(x), torch.from_numpy(a)) for net in rm.nets])
    calls = []
    features = DiffRewardModel.features

    def counted(self: DiffRewardModel, x: torch.Tensor) -> torch.Tensor:
        calls.append(self.feature_key())
        return features(self, x)

    monkeypatch.setattr(DiffRewardModel, "features", counted)
    got = rm._members(x, a)
    assert torch.equal(got, want)
    assert sorted(calls) == sorted({m.feature_key() for m in models})


def test_torch_threads_are_set_only_where_they_differ(tmp_path, monkeypatch):
    """``infer_threads`` 1: no set while torch already runs 1 thread; else set for the forward and
    the caller's count restored after it."""
    path = _small_diff_file(tmp_path / "d.pt")
    w = RewardModelWrapper(FakeVec(n_envs=2), path, infer_threads=1, verbose=False)
    before = torch.get_num_threads()
    real = torch.set_num_threads
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    try:
        real(1)
        w.step(np.zeros(2, np.int64))
        assert calls == []
        real(2)
        w.step(np.zeros(2, np.int64))
        assert calls == [1, 2] and torch.get_num_threads() == 2
    finally:
        real(before)
