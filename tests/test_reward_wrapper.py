"""RewardModelWrapper: batched predictions, normalisation, clipping, errors, pass-through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lib.a2c.reward_env import RewardModelWrapper
from lib.atari.envs import VecStep
from lib.core.errors import UserError
from lib.models.reward import (
    DiffRewardModel,
    RewardModel,
    load_reward_model,
    reward_checkpoint,
    save_reward_checkpoint,
)
from lib.models.reward_path import MIN_STD, RewardPath, RunningNorm

SEAQUEST = "SeaquestNoFrameskip-v4"


class FakeVec:
    """AtariVec-like env with small random frames; rewards count the steps."""

    def __init__(self, n_envs: int = 4, size: int = 48, game: str = "seaquest", n_actions: int = 18, seed: int = 0):
        self.n_envs, self.game, self.env_id, self.n_actions = n_envs, game, SEAQUEST, n_actions
        self.action_meanings = tuple(f"A{i}" for i in range(n_actions))
        self.rng = np.random.default_rng(seed)
        self.size = size
        self.frames = self._new_frames()
        self.extra_attribute = "inner"
        self.sent: list[np.ndarray] = []
        self.closed = False
        self.ends = np.zeros(n_envs, bool)  # which envs' next step ends the game

    def _new_frames(self) -> np.ndarray:
        return self.rng.integers(0, 256, (self.n_envs, self.size, self.size, 3), dtype=np.uint8)

    def reset(self) -> np.ndarray:
        self.frames = self._new_frames()
        return np.zeros((self.n_envs, 4, 84, 84), np.uint8)

    def step_async(self, actions: np.ndarray) -> None:
        self.sent.append(np.asarray(actions).copy())
        self.frames[:] = 0  # like a C++ env reusing its buffer: the wrapper must have copied

    def step_wait(self) -> VecStep:
        self.frames = self._new_frames()
        n = self.n_envs
        true = np.ones(n, np.float32)
        obs = np.zeros((n, 4, 84, 84), np.uint8)
        z = np.zeros(n, bool)
        return VecStep(obs, true.copy(), true, self.ends.copy(), z, self.ends.copy(), obs, np.full(n, 3, np.int32))

    def step(self, actions: np.ndarray) -> VecStep:
        self.step_async(actions)
        return self.step_wait()

    def close(self) -> None:
        self.closed = True


def _model_file(
    tmp_path: Path,
    k: int = 1,
    size: int = 48,
    game: str = "seaquest",
    n_actions: int = 18,
    stats: tuple[float, float] | None = (0.0, 1.0),
    name: str = "r.pt",
) -> Path:
    torch.manual_seed(0)
    models = [RewardModel(n_actions, (size, size, 3)).eval() for _ in range(k)]
    ck = reward_checkpoint(
        models,
        SEAQUEST if game == "seaquest" else "BreakoutNoFrameskip-v4",
        game,
        None,
        norm_mean=stats[0] if stats else None,
        norm_std=stats[1] if stats else None,
    )
    path = tmp_path / name
    save_reward_checkpoint(ck, path)
    return path


@pytest.mark.parametrize("k", [1, 2])
def test_batched_step_equals_per_env_predictions(tmp_path, k: int):
    path = _model_file(tmp_path, k=k)
    env = FakeVec(n_envs=5)
    w = RewardModelWrapper(env, path, path=RewardPath(window=1000))
    rm = load_reward_model(path)
    w.reset()
    rng = np.random.default_rng(1)
    for _ in range(3):
        frames = env.frames.copy()
        actions = rng.integers(0, 18, 5)
        st = w.step(actions)
        single = np.array([rm.predict(frames[i : i + 1], actions[i : i + 1])[0] for i in range(5)])
        assert st.pred_rewards.dtype == np.float32 and st.pred_rewards.shape == (5,)
        np.testing.assert_allclose(st.pred_rewards, single, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(st.true_rewards, np.ones(5, np.float32))  # the true score is kept
        np.testing.assert_array_equal(env.sent[-1], actions)
    s = w.stats()
    assert {"norm_mean", "norm_std", "pred_mean", "disagreement", "infer_ms_per_step"} <= set(s)
    assert (s["disagreement"] > 0) == (k > 1)


def test_rewards_are_normalised_and_clipped(tmp_path):
    path = _model_file(tmp_path, stats=None)  # no stored stats: the window is used from step 1
    w = RewardModelWrapper(FakeVec(n_envs=8), path, path=RewardPath(window=64, clip=1.0))
    w.reset()
    raws, outs = [], []
    for _ in range(20):
        st = w.step(np.zeros(8, np.int64))
        raws.append(st.pred_rewards)
        outs.append(st.rewards)
    raw, out = np.concatenate(raws[-8:]), np.concatenate(outs[-8:])  # the last 64 = the window
    expected = np.clip((raw - np.median(raw)) / raw.std(), -1, 1)  # the typical step earns 0
    np.testing.assert_allclose(out[-8:], expected[-8:], rtol=1e-4, atol=1e-5)
    assert np.abs(out).max() <= 1.0
    assert w.stats()["norm_std"] == pytest.approx(raw.std(), rel=1e-5)
    assert w.stats()["norm_median"] == pytest.approx(np.median(raw), rel=1e-5)


def test_rare_rewards_leave_the_typical_step_at_zero():
    """A model that has learned the score: most steps predict ~0, a few score. Centred on the
    mean, every ordinary step would earn a negative reward (and dying early would pay); centred on
    the median it earns 0 and only the scoring steps stand out."""
    n = RunningNorm(window=1000, prior=None)
    raw = np.zeros(1000)
    raw[::50] = 20.0  # 2% of the steps score
    out = n.normalise(raw)
    assert np.all(out[raw == 0] == 0.0) and np.all(out[raw > 0] > 5)
    assert (raw - raw.mean()).max() > 0 > (raw - raw.mean())[raw == 0].max()  # the mean would not do it


def test_running_norm_window_prior_and_guard():
    n = RunningNorm(window=10, prior=(5.0, 2.0), warmup=4)
    np.testing.assert_allclose(n.normalise(np.array([7.0, 3.0])), [1.0, -1.0])  # prior while warming up
    n.normalise(np.array([1.0, 1.0]))  # 4 seen: window stats from now on
    assert n.mean == pytest.approx(3.0) and n.center == pytest.approx(2.0)  # median of 7, 3, 1, 1
    n.normalise(np.arange(25, dtype=float))  # more than the window: the last 10 values
    assert n.mean == pytest.approx(np.arange(15, 25).mean()) and n.count == 29
    const = RunningNorm(window=5)
    out = const.normalise(np.full(4, 0.3))
    assert const.std < MIN_STD and np.all(out == 0.0)  # constant model: centred, not divided by ~0
    wrap = RunningNorm(window=4)
    for v in range(7):  # ring buffer wraps around
        wrap.normalise(np.array([float(v)]))
    assert wrap.mean == pytest.approx(np.mean([3, 4, 5, 6]))


def test_stored_stats_normalise_the_first_steps(tmp_path):
    path = _model_file(tmp_path, stats=(0.5, 0.25))
    w = RewardModelWrapper(FakeVec(n_envs=4), path, path=RewardPath(window=10_000))
    st = w.step(np.zeros(4, np.int64))
    np.testing.assert_allclose(st.rewards, (st.pred_rewards - 0.5) / 0.25, rtol=1e-5)


def test_pass_through_and_forwarding(tmp_path):
    env = FakeVec()
    w = RewardModelWrapper(env, _model_file(tmp_path))
    assert (w.n_envs, w.game, w.env_id, w.n_actions) == (4, "seaquest", SEAQUEST, 18)
    assert w.action_meanings == env.action_meanings and w.extra_attribute == "inner"
    assert w.reset().shape == (4, 4, 84, 84)
    assert w.frames is env.frames
    with pytest.raises(AttributeError):
        _ = w.no_such_attribute
    w.close()
    assert env.closed


def test_constructor_errors_are_one_line(tmp_path):
    env = FakeVec()
    msgs = []
    for bad in (
        tmp_path / "missing.pt",
        _model_file(tmp_path, game="breakout", name="breakout.pt"),
        _model_file(tmp_path, n_actions=6, name="six.pt"),
        _model_file(tmp_path, size=64, name="big.pt"),
    ):
        with pytest.raises(UserError) as e:
            RewardModelWrapper(env, bad)
        msgs.append(str(e.value))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError) as e:
        RewardModelWrapper(env, corrupt)
    msgs.append(str(e.value))
    assert "not found" in msgs[0]
    assert "trained on BreakoutNoFrameskip-v4" in msgs[1]
    assert "has 6 actions, the env has 18" in msgs[2]
    assert "takes frames (64, 64, 3)" in msgs[3]
    assert "corrupt" in msgs[4]
    assert all("\n" not in m for m in msgs)


@pytest.mark.slow
def test_real_atari_env(tmp_path):
    """Full-resolution model on real SeaQuest frames: one batched forward per step."""
    from lib.atari.envs import AtariVec

    env = AtariVec(n_envs=3, seed=0)
    torch.manual_seed(0)
    ck = reward_checkpoint([RewardModel(env.n_actions).eval()], env.env_id, env.game, env.action_meanings, 0.0, 1.0)
    save_reward_checkpoint(ck, tmp_path / "r.pt")
    w = RewardModelWrapper(env, tmp_path / "r.pt")
    rm = load_reward_model(tmp_path / "r.pt")
    w.reset()
    for _ in range(3):
        frames, actions = env.frames.copy(), np.array([0, 1, 2])
        st = w.step(actions)
        np.testing.assert_allclose(st.pred_rewards, rm.predict(frames, actions), rtol=1e-4, atol=1e-6)
        assert st.obs.shape == (3, 4, 84, 84)
    env.close()


def test_diff_model_reads_the_frame_each_step_led_to(tmp_path):
    """A diff model predicts after the step, from (frame before, frame after); where the step ended
    the game the env shows the next game's frame, so the frame before stands in."""
    torch.manual_seed(0)
    ck = reward_checkpoint([DiffRewardModel(18, (48, 48, 3)).eval()], SEAQUEST, "seaquest", None, 0.0, 1.0)
    save_reward_checkpoint(ck, tmp_path / "d.pt")
    env = FakeVec(seed=3)
    env.ends[1] = True
    w = RewardModelWrapper(env, tmp_path / "d.pt")
    rm = load_reward_model(tmp_path / "d.pt")
    acts = np.array([0, 1, 2, 3])
    before = env.frames.copy()
    st = w.step(acts)
    after = env.frames.copy()
    led_to = after.copy()
    led_to[1] = before[1]
    np.testing.assert_allclose(st.pred_rewards, rm.predict(before, acts, led_to), rtol=1e-5, atol=1e-6)
    naive = rm.predict(before, acts, after)
    assert not np.isclose(naive[1], st.pred_rewards[1]) and np.isclose(naive[0], st.pred_rewards[0])
    with pytest.raises(ValueError, match="needs next_frames"):
        rm.predict(before, acts)


@pytest.mark.slow
def test_diff_forward_can_run_while_the_next_step_is_in_flight(tmp_path):
    """The training loop sends the next step before ``VecStep.complete()``: the diff model must
    still read the frames this step led to (copied at step_wait), not the next step's."""
    from lib.atari.envs import AtariVec

    torch.manual_seed(0)
    ck = reward_checkpoint([DiffRewardModel(18).eval()], SEAQUEST, "seaquest", None, 0.0, 1.0)
    save_reward_checkpoint(ck, tmp_path / "d.pt")
    eager = RewardModelWrapper(AtariVec(n_envs=2, seed=4, num_threads=1), tmp_path / "d.pt")
    lazy = RewardModelWrapper(AtariVec(n_envs=2, seed=4, num_threads=1), tmp_path / "d.pt")
    eager.reset(), lazy.reset()
    rng = np.random.default_rng(0)
    acts = rng.integers(0, 18, (30, 2))
    lazy.step_async(acts[0])
    for t in range(30):
        want = eager.step(acts[t])
        st = lazy.step_wait()
        assert st.pending is not None  # the forward waits for complete()
        if t + 1 < 30:
            lazy.step_async(acts[t + 1])  # the env moves on before the forward runs
        st.complete()
        np.testing.assert_allclose(st.pred_rewards, want.pred_rewards, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(st.rewards, want.rewards, rtol=1e-5, atol=1e-6)
    eager.close(), lazy.close()


def test_scale_and_the_labels_stats_reach_the_learner(tmp_path):
    """--reward-norm labels: every step is normalised with the checkpoint's stored mean and std, and
    stays so however many steps pass (the running window would move); --reward-scale S multiplies
    the normalised, clipped reward."""
    path = _model_file(tmp_path, stats=(0.5, 0.25))
    w = RewardModelWrapper(FakeVec(n_envs=4), path, path=RewardPath(window=8, clip=2.0, scale=0.05, norm="labels"))
    for _ in range(30):  # far past the window and its warm-up
        st = w.step(np.zeros(4, np.int64))
    expected = 0.05 * np.clip((st.pred_rewards - 0.5) / 0.25, -2.0, 2.0)
    np.testing.assert_allclose(st.rewards, expected, rtol=1e-5, atol=1e-7)
    assert w.stats()["norm_mean"] == 0.5 and w.stats()["scale"] == 0.05
    running = RewardModelWrapper(FakeVec(n_envs=4), path, path=RewardPath(window=8, clip=2.0, scale=0.05))
    for _ in range(30):
        running.step(np.zeros(4, np.int64))
    assert running.stats()["norm_mean"] != 0.5  # the running window has moved off the stored mean


def test_labels_norm_needs_stored_stats(tmp_path):
    path = _model_file(tmp_path, stats=None)
    with pytest.raises(UserError, match="--reward-norm running"):
        RewardModelWrapper(FakeVec(), path, path=RewardPath(norm="labels"))


class RecordedVec(FakeVec):
    """FakeVec with the lives the recorder keeps."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lives = np.full(self.n_envs, 3, np.int32)


class NetSpy(torch.nn.Module):
    """Stands in for a reward net: keeps every input it is given, predicts 0."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def forward(self, x: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.cpu().numpy().copy(), actions.cpu().numpy().copy()))
        return torch.zeros(len(actions))


def test_the_wrapper_feeds_the_net_what_training_feeds_it_for_the_same_recorded_clip(tmp_path):
    """01_a2c.py -r --db-path: the reward wrapper's per-step input (frame, next frame, action) and
    the input stage 3 trains on for the clip the recorder wrote of the same steps are the same bytes
    (one function makes both: lib.models.reward.reward_input). A step that ended the game, inside
    the clip, has its own frame for the next in both. The clip's last step is the one exception:
    its next frame was not recorded, so training gives it its own; the wrapper saw the real one."""
    from lib.a2c.recorder import EpisodeRecorderWrapper
    from lib.reward.data import load_preferences, model_inputs
    from lib.store.labels import Label, append_labels
    from lib.store.segments import list_segments

    steps = 8
    ck = reward_checkpoint([DiffRewardModel(18, (48, 48, 3)).eval()], SEAQUEST, "seaquest", None, 0.0, 1.0)
    save_reward_checkpoint(ck, tmp_path / "d.pt")
    base = RecordedVec(n_envs=2, seed=5)
    w = RewardModelWrapper(base, tmp_path / "d.pt")  # stacked as lib.a2c.run does it
    recorder = EpisodeRecorderWrapper(base, tmp_path / "db", record_prob=1.0, segment_steps=steps)
    w.env = recorder
    spy = NetSpy()
    w.model.nets = [spy]
    rng = np.random.default_rng(0)
    w.reset()
    for t in range(2 * steps):
        base.ends[:] = False
        base.ends[1] = t in (3, steps + 2)  # env 1's game ends inside each of its clips
        w.step(rng.integers(0, 18, 2))
    recorder.close()
    rels = sorted(list_segments(tmp_path / "db"))
    assert len(rels) == 4
    append_labels(tmp_path / "db", [Label(rels[0], rels[1], 1), Label(rels[2], rels[3], 2)])
    data = load_preferences([tmp_path / "db"], log=lambda m: None)
    wrapper_x = np.stack([x for x, _ in spy.seen])  # (steps, envs, 2, 84, 84)
    wrapper_a = np.stack([a for _, a in spy.seen])
    for i, name in enumerate(data.names):
        # NN/SSSSSSSS.dat: the env, its step count at the clip's end
        env, end = int(Path(name).parent.name), int(Path(name).stem)
        x, actions, _ = model_inputs(data, [i], "diff")
        want = wrapper_x[end - steps : end, env]
        np.testing.assert_array_equal(x[:-1], want[:-1])
        np.testing.assert_array_equal(x[-1, 0], want[-1, 0])
        np.testing.assert_array_equal(x[-1, 1], x[-1, 0])  # the clip's last step: its own frame
        np.testing.assert_array_equal(actions, wrapper_a[end - steps : end, env])


def test_window_norm_normalises_each_env_over_exactly_its_last_w_steps():
    """--reward-norm window: env k's reward is (x - mean) / std of env k's own last W predictions,
    the current one included; a prediction W steps back no longer counts, another env's never."""
    from lib.models.reward_path import WindowNorm

    w, n = 5, 3
    norm = WindowNorm(w, n)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(12, n)) * np.array([1.0, 10.0, 0.1]) + np.array([0.0, 100.0, -3.0])
    xs[:, 2] = 7.0  # a constant env: centred only (its std is 0)
    outs = [norm.normalise(x) for x in xs]
    for t in range(12):
        for k in range(n):
            seen = xs[max(0, t - w + 1) : t + 1, k]
            std = seen.std() if seen.std() >= MIN_STD else 1.0
            assert outs[t][k] == pytest.approx((xs[t, k] - seen.mean()) / std, rel=1e-5, abs=1e-6)
    assert outs[0][0] == 0.0  # the first step of an env is its own mean
    # exactly W: change the value W steps back and nothing changes; change the one W-1 back and it does
    later = WindowNorm(w, n)
    ys = xs.copy()
    ys[11 - w, 0] += 50.0
    assert [later.normalise(y) for y in ys][11][0] == pytest.approx(outs[11][0], rel=1e-6)
    again = WindowNorm(w, n)
    ys[11 - w + 1, 0] += 50.0
    assert [again.normalise(y) for y in ys][11][0] != pytest.approx(outs[11][0], rel=1e-3)


def test_window_norm_and_sign_clip_reach_the_learner(tmp_path):
    """The wrapper with --reward-norm window --reward-clip sign gives the learner the sign of each
    env's windowed prediction (times --reward-scale), the book's reward path; ±5 keeps the size."""
    from lib.models.reward_path import WindowNorm

    path = _model_file(tmp_path, stats=None)
    book = RewardModelWrapper(FakeVec(n_envs=4), path, path=RewardPath(norm="window", window=6, clip="sign", scale=0.5))
    ref = WindowNorm(6, 4)
    kept = RewardModelWrapper(FakeVec(n_envs=4), path, path=RewardPath(norm="window", window=6))
    for _ in range(10):
        st, st2 = book.step(np.zeros(4, np.int64)), kept.step(np.zeros(4, np.int64))
        np.testing.assert_array_equal(st.rewards, 0.5 * np.sign(ref.normalise(st.pred_rewards)))
    assert set(np.unique(st.rewards)) <= {-0.5, 0.0, 0.5}
    assert not set(np.unique(st2.rewards)) <= {-1.0, 0.0, 1.0}  # the same path with ±5: sizes kept


class ScoredVec(FakeVec):
    """FakeVec whose true per-step score varies by env: 0, +3, -2, 0 (a kill, a penalty, nothing)."""

    def step_wait(self) -> VecStep:
        st = super().step_wait()
        st.true_rewards[:] = np.array([0.0, 3.0, -2.0, 0.0], np.float32)[: self.n_envs]
        return st


def test_plus_score_reaches_the_learner(tmp_path):
    """--reward-plus-score adds the sign of the game's score on top of the learned reward as the
    path made it (normalised, clipped, --reward-scale), and without it the score never reaches the
    learner."""
    from lib.models.reward_path import RunningNorm

    path = _model_file(tmp_path, stats=None)
    alone = RewardModelWrapper(ScoredVec(n_envs=4), path, path=RewardPath(window=40, clip=1.5, scale=0.5))
    plus = RewardModelWrapper(
        ScoredVec(n_envs=4), path, path=RewardPath(window=40, clip=1.5, scale=0.5, plus_score=True)
    )
    ref = RunningNorm(40)
    clipped = 0
    for _ in range(30):
        st, sp = alone.step(np.zeros(4, np.int64)), plus.step(np.zeros(4, np.int64))
        np.testing.assert_array_equal(sp.pred_rewards, st.pred_rewards)
        z = ref.normalise(st.pred_rewards)
        want = 0.5 * np.clip(z, -1.5, 1.5)
        np.testing.assert_allclose(st.rewards, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sp.rewards, want + np.array([0.0, 1.0, -1.0, 0.0]), rtol=1e-5, atol=1e-6)
        clipped += int(np.sum(np.abs(z) > 1.5))
    assert clipped > 0  # the clip was reached, before the score was added


def test_stage_1s_flags_build_the_books_reward_path(tmp_path):
    """01_a2c.py -r M --reward-norm window --norm-window W --reward-clip sign builds the wrapper with
    exactly those; the defaults keep the running median and the ±5 clip."""
    from lib.a2c.config import A2CConfig
    from lib.a2c.run import make_env_stack

    path = _model_file(tmp_path, stats=None)
    rng = np.random.default_rng(0)
    book = A2CConfig(name="x", reward=str(path), reward_norm="window", norm_window=7, reward_clip="sign")
    env, _ = make_env_stack(book, FakeVec(n_envs=4), torch.device("cpu"), rng, None)
    assert (
        env.reward_path == RewardPath(norm="window", window=7, clip="sign") and type(env.norm).__name__ == "WindowNorm"
    )
    rewards = np.concatenate([env.step(np.zeros(4, np.int64)).rewards for _ in range(5)])
    assert set(np.unique(rewards)) == {-1.0, 1.0} or set(np.unique(rewards)) == {-1.0, 0.0, 1.0}
    default, _ = make_env_stack(
        A2CConfig(name="x", reward=str(path)), FakeVec(n_envs=4), torch.device("cpu"), rng, None
    )
    assert default.reward_path == RewardPath("running", 10_000, 5.0, 1.0, False)
    thin, _ = make_env_stack(
        A2CConfig(name="x", reward=str(path), reward_plus_score=True),
        FakeVec(),
        torch.device("cpu"),
        rng,
        None,  # noqa: E501
    )
    assert thin.reward_path.plus_score is True
    three, _ = make_env_stack(
        A2CConfig(name="x", reward=str(path), reward_clip="3"), FakeVec(), torch.device("cpu"), rng, None
    )
    assert three.reward_path.clip == 3.0
