"""Stage 1's loop in-process on a small fake vector env whose answers are known by hand.

The fake game: every step scores 2 (the learner sees it sign-clipped to 1); a life lasts LIFE
steps (then ``terminated``), a game has LIVES lives (then ``game_over``, and the env starts a new
game in the same step). So every n-step return, every bootstrap and every game score can be
worked out exactly.

The runs here use stage 1's default precision (``--precision auto``: bf16 on a CPU that computes it
natively, fp32 elsewhere). ``RLHF_TEST_PRECISION=bf16`` (or fp32) forces one, so that a CPU without
native bf16 runs what a bf16 one would (``make test`` does so for this file).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import lib.a2c.config as a2c_config
import lib.a2c.train as a2c
from lib.a2c.experience import Transitions
from lib.atari.envs import VecStep
from lib.core.errors import UserError
from lib.models.policy import AtariA2C

LIFE, LIVES = 7, 2
GAME = LIFE * LIVES  # steps of one game
SCORE = 2.0 * GAME  # its true, unclipped score
OBS = (4, 36, 36)  # the smallest input AtariA2C's conv stack takes
PRECISION = os.environ.get("RLHF_TEST_PRECISION", a2c_config.A2CConfig.precision)  # the runs' --precision


class FakeVec:
    """An ``AtariVec`` stand-in: same attributes and step contract, a game known by hand."""

    def __init__(self, env_id: str, n_envs: int, seed: int | None = None, **_: object) -> None:
        self.env_id, self.game, self.n_envs, self.seed = env_id, "seaquest", n_envs, seed
        self.obs_shape, self.n_actions, self.action_meanings = OBS, 3, ("NOOP", "FIRE", "UP")
        self.t = np.zeros(n_envs, dtype=np.int64)  # steps into the current game
        self.frames = np.zeros((n_envs, 8, 8, 3), dtype=np.uint8)
        self.lives = np.full(n_envs, LIVES, dtype=np.int32)
        self.closed = False

    def _obs(self) -> np.ndarray:
        # Each state shows how far into its game the env is: values differ between states.
        return np.broadcast_to((self.t * 9 % 256).astype(np.uint8)[:, None, None, None], (self.n_envs, *OBS)).copy()

    def reset(self) -> np.ndarray:
        self.t[:] = 0
        return self._obs()

    def step(self, actions: np.ndarray) -> VecStep:
        assert actions.shape == (self.n_envs,) and actions.max() < self.n_actions
        self.t += 1
        terminated = self.t % LIFE == 0
        game_over = self.t == GAME
        final_obs = self._obs()
        self.t[game_over] = 0  # same-step autoreset, as AtariVec
        self.lives = LIVES - self.t // LIFE
        twos = np.full(self.n_envs, 2.0, dtype=np.float32)
        return VecStep(
            self._obs(),
            twos,
            twos.copy(),
            terminated,
            np.zeros(self.n_envs, bool),
            game_over,
            final_obs,
            self.lives.copy(),
        )

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecStep:
        return self.step(self._actions)

    def close(self) -> None:
        self.closed = True


def config(tmp_path: Path, **kw) -> a2c_config.A2CConfig:
    base = dict(
        name="fake",
        envs=2,
        max_steps=600,
        test_every=0,
        save=str(tmp_path / "saves"),
        runs_dir=str(tmp_path / "runs"),
        seed=1,
        threads=1,
        precision=PRECISION,
    )
    return a2c_config.A2CConfig(**{**base, **kw})


def test_learner_gets_exact_n_step_returns_and_bootstraps_from_the_acting_pass(tmp_path, monkeypatch):
    seen = []
    real_loss = a2c.a2c_loss

    def spy(net, batch, boot_values, device, beta, bf16=False, weight=1.0, start=None, kl_beta=0.0, **kw):
        # Weights change only at the optimiser step, so every bootstrap value in this batch must
        # equal what the current network says about the bootstrap state, at the run's precision.
        seen.append((batch, boot_values.copy(), a2c._values(net, batch.boot_obs, device, bf16)))
        assert weight == 1.0  # one process: the plain mean
        return real_loss(net, batch, boot_values, device, beta, bf16, weight, start, kl_beta, **kw)

    monkeypatch.setattr(a2c, "a2c_loss", spy)
    cfg = config(tmp_path)
    assert a2c.train(cfg, make_env=FakeVec) == 0
    ran = torch.load(tmp_path / "saves" / "last.pt", weights_only=True)["precision"]  # "auto" resolved
    assert ran in ("fp32", "bf16") and (cfg.precision == "auto" or ran == cfg.precision)
    # Both forwards run at the run's precision. fp32: they agree to float rounding. bf16 rounds each
    # value to 8 bits of mantissa (one unit in the last place is 5e-4 at these values, about 0.1), and
    # a kernel may round differently for another batch size: two units allowed, less than the 3e-3
    # between a state's value and the step before's (the bug of bootstrapping from a stale pass).
    atol = 1e-5 if ran == "fp32" else 1e-3
    assert len(seen) >= 3
    g = a2c_config.GAMMA
    for batch, boot, v_now in seen:
        assert len(batch) >= a2c_config.BATCH_SIZE
        k = batch.steps
        np.testing.assert_allclose(batch.returns, (1 - g**k) / (1 - g), rtol=1e-5)  # k clipped rewards of 1
        np.testing.assert_allclose(batch.discount, g**k, rtol=1e-6)
        assert k.max() == a2c_config.REWARD_STEPS and k.min() >= 1
        nxt = batch.boot_mode == 1
        assert (boot[~nxt] == 0).all()  # a life ended inside the window: no bootstrap past it
        np.testing.assert_allclose(boot[nxt], v_now[nxt], atol=atol)
        # A transition is cut short exactly where its life ended: start + k lands on a life's end.
        start = batch.obs[:, 0, 0, 0].astype(np.int64) // 9  # steps into the game when it started
        assert ((start[~nxt] + k[~nxt]) % LIFE == 0).all()
        assert (k[nxt] == a2c_config.REWARD_STEPS).all()


def test_checkpoints_games_and_resume(tmp_path):
    cfg = config(tmp_path, max_steps=560, test_every=280, test_episodes=2)
    assert a2c.train(cfg, make_env=FakeVec) == 0
    saves = tmp_path / "saves"
    last = torch.load(saves / "last.pt", weights_only=True)
    assert last["step"] == 560 and last["progress"]["step"] == 560
    assert last["progress"]["games"] == 2 * (280 // GAME)  # 280 vector steps, 2 envs, a game every 14
    assert last["progress"]["best_mean"] == SCORE  # every evaluation game scores exactly 28
    assert [p.name for p in saves.glob("best_*.pt")] == [f"best_000000280_score{SCORE:.1f}_len{GAME}.pt"]
    adam_steps = max(int(s["step"]) for s in last["optimizer"]["state"].values())
    assert adam_steps == last["progress"]["train_steps"] > 0

    with pytest.raises(UserError, match="already holds the run"):
        a2c.train(cfg, make_env=FakeVec)
    more = config(tmp_path, max_steps=840, test_every=280, test_episodes=2, resume=True)
    assert a2c.train(more, make_env=FakeVec) == 0
    again = torch.load(saves / "last.pt", weights_only=True)
    assert again["step"] == 840 and again["progress"]["games"] == 2 * (420 // GAME)
    assert max(int(s["step"]) for s in again["optimizer"]["state"].values()) == again["progress"]["train_steps"]
    assert again["progress"]["train_steps"] > last["progress"]["train_steps"]
    assert again["tb_dir"] == last["tb_dir"]  # the same TensorBoard run goes on


def test_force_replaces_the_old_runs_best_checkpoints(tmp_path):
    """-m saves/<name> plays a run's best: after --force that must be the new run's, not a better
    one the old run left (here a later best, planted as the audit did)."""
    from lib.models.policy import best_checkpoints, policy_file

    saves = tmp_path / "saves"
    assert a2c.train(config(tmp_path, max_steps=280, test_every=280, test_episodes=2), make_env=FakeVec) == 0
    (old,) = best_checkpoints(saves)
    planted = saves / "best_000002000_score999.0_len14.pt"
    planted.write_bytes(old.read_bytes())
    forced = config(tmp_path, max_steps=560, test_every=560, test_episodes=2, force=True, seed=2)
    assert a2c.train(forced, make_env=FakeVec) == 0
    assert [p.name for p in best_checkpoints(saves)] == [f"best_000000560_score{SCORE:.1f}_len{GAME}.pt"]
    assert policy_file(saves) == saves / f"best_000000560_score{SCORE:.1f}_len{GAME}.pt"
    assert torch.load(saves / "last.pt", weights_only=True)["step"] == 560


def test_force_refuses_to_start_from_a_policy_it_would_remove(tmp_path):
    assert a2c.train(config(tmp_path, max_steps=280, test_every=280, test_episodes=2), make_env=FakeVec) == 0
    before = sorted(p.name for p in (tmp_path / "saves").iterdir())
    (best,) = (tmp_path / "saves").glob("best_*.pt")
    with pytest.raises(UserError, match="--force would remove") as e:
        a2c.train(config(tmp_path, force=True, model=str(best)), make_env=FakeVec)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in (tmp_path / "saves").iterdir()) == before


def test_game_scores_reach_tensorboard_unclipped(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert a2c.train(config(tmp_path, max_steps=200), make_env=FakeVec) == 0
    (events,) = (tmp_path / "runs").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    scores = [e.value for e in acc.Scalars("charts/episode_score")]
    assert scores == [SCORE] * (2 * (100 // GAME))
    assert {e.value for e in acc.Scalars("charts/episode_length")} == {float(GAME)}


class NaNVec(FakeVec):
    """The fake game whose rewards turn NaN (as a broken reward model's would) after 40 steps."""

    def step(self, actions: np.ndarray) -> VecStep:
        st = super().step(actions)
        self.steps_done = getattr(self, "steps_done", 0) + 1
        if self.steps_done > 40:
            st.rewards[:] = np.nan
        return st


def test_a_non_finite_loss_stops_the_run_and_keeps_last_pt(tmp_path):
    assert a2c.train(config(tmp_path, max_steps=200), make_env=FakeVec) == 0
    last = tmp_path / "saves" / "last.pt"
    good = last.read_bytes()
    more = config(tmp_path, max_steps=800, resume=True)
    with pytest.raises(a2c.NonFiniteError, match="non-finite loss or gradient at step"):
        a2c.train(more, make_env=NaNVec)
    assert last.read_bytes() == good  # the last finite last.pt stays, byte for byte
    assert a2c.train(config(tmp_path, max_steps=400, resume=True), make_env=FakeVec) == 0  # and resumes


def _last(tmp_path: Path) -> tuple[Path, dict]:
    assert a2c.train(config(tmp_path, max_steps=200), make_env=FakeVec) == 0
    path = tmp_path / "saves" / "last.pt"
    return path, torch.load(path, weights_only=True)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ck: ck.update(optimizer={}), "optimizer state does not fit"),
        (lambda ck: ck.update(lr="x"), "field 'lr' must be a finite number"),
        (lambda ck: ck.update(lr=float("nan")), "field 'lr' must be a finite number"),
        (lambda ck: ck["progress"].update(step=-5), "field 'step' must be an integer"),
        (lambda ck: ck["progress"].update(best_mean=float("nan")), "field 'best_mean' must be a number"),
        (lambda ck: ck.update(env_steps=[10**13, 0]), "field 'env_steps'"),
        (lambda ck: ck.update(lr_decay_steps=0), "field 'lr_decay_steps'"),
        (lambda ck: ck.update(scheduler=[1, 2]), "is not a resumable checkpoint"),
        (lambda ck: ck["optimizer"]["state"][0].update(exp_avg=ck["optimizer"]["state"][0]["exp_avg"] * np.nan),
         "optimizer state holds NaN"),
    ],
)  # fmt: skip
def test_a_crafted_last_pt_is_one_line(tmp_path, change, message):
    path, ck = _last(tmp_path)
    change(ck)
    torch.save(ck, path)
    with pytest.raises(UserError, match=message) as e:
        a2c.train(config(tmp_path, max_steps=400, resume=True), make_env=FakeVec)
    assert "\n" not in str(e.value)


def test_a_last_pt_naming_retired_levers_still_resumes(tmp_path):
    """A last.pt carrying fields of the retired levers (--reward-alive, --reward-penalty, --terminal
    game, --reward-deadzone) resumes as one without them: those fields are not read (a run resumed with the flag given
    again is refused in one line by 01_a2c.py: tests/test_a2c_cli.py)."""
    path, ck = _last(tmp_path)
    ck.update(reward_alive=0.1, reward_penalty=1.0, terminal="game", reward_deadzone=1.0)
    torch.save(ck, path)
    assert a2c.train(config(tmp_path, max_steps=400, resume=True), make_env=FakeVec) == 0
    assert torch.load(path, weights_only=True)["progress"]["step"] == 400


def test_tb_dir_named_by_last_pt_must_be_under_runs_dir(tmp_path):
    path, ck = _last(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "fake__a2c__seaquest__s1__x"
    ck["tb_dir"] = str(elsewhere)
    torch.save(ck, path)
    assert a2c.train(config(tmp_path, max_steps=400, resume=True), make_env=FakeVec) == 0
    assert not (tmp_path / "elsewhere").exists()  # a handed-over file does not choose where we write
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert len(events) == 2 and all(tmp_path / "runs" in p.parents for p in events)


def test_segments_lost_to_a_full_disk_are_reported(tmp_path, monkeypatch, capsys):
    import errno

    import lib.store.segment_writer

    def full(path, data, fsync=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lib.store.segment_writer, "create_exclusive", full)
    cfg = config(tmp_path, max_steps=200, db_path=str(tmp_path / "db"), record_prob=1.0, segment_steps=5)
    assert a2c.train(cfg, make_env=FakeVec) == 0
    out, err = capsys.readouterr()
    assert "(0 written this run, 40 could not be written: see the warning above)" in out
    assert "warning: 40 segment(s) could not be written" in err and "No space left on device" in err


def _spy_batches(monkeypatch) -> list:
    seen: list = []
    real_loss = a2c.a2c_loss

    def spy(net, batch, boot_values, device, beta, bf16=False, weight=1.0, start=None, kl_beta=0.0, **kw):
        seen.append(batch)
        return real_loss(net, batch, boot_values, device, beta, bf16, weight, start, kl_beta, **kw)

    monkeypatch.setattr(a2c, "a2c_loss", spy)
    return seen


@pytest.mark.parametrize("terminal", ["life", "none"])
def test_terminal_decides_where_the_learners_episode_ends(tmp_path, monkeypatch, terminal):
    """--terminal: a transition is cut (no bootstrap) at every lost life (life), or never (none:
    the n-step return runs on across the reset into the next game)."""
    seen = _spy_batches(monkeypatch)
    assert a2c.train(config(tmp_path, terminal=terminal), make_env=FakeVec) == 0
    batch = Transitions.concat(seen)
    start = batch.obs[:, 0, 0, 0].astype(np.int64) // 9  # steps into the game when it started
    end = start + batch.steps  # where the transition's last reward was
    cut = batch.boot_mode == 0
    n = a2c_config.REWARD_STEPS
    g = a2c_config.GAMMA
    if terminal == "none":
        assert not cut.any() and (batch.steps == n).all()
        np.testing.assert_allclose(batch.returns, (1 - g**n) / (1 - g), rtol=1e-5)
        assert (end > GAME).any()  # some returns ran across a game's end into the next game
    else:
        assert cut.any() and (end[cut] % LIFE == 0).all()
        assert (end <= GAME).all()  # none reaches past a game's end


def test_kl_to_the_start_policy_is_zero_at_first_and_grows(tmp_path, monkeypatch):
    """A run from -m logs finetune/kl_to_start: 0 on the first batch (the policy is the start
    policy), more after the updates; --kl B adds B x that KL to the loss and so keeps it smaller."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert a2c.train(config(tmp_path / "v0", max_steps=280, test_every=280, test_episodes=2), make_env=FakeVec) == 0
    (v0,) = (tmp_path / "v0" / "saves").glob("best_*.pt")
    kls = {}
    real_loss = a2c.a2c_loss
    for beta in (0.0, 50.0):
        seen: list = []

        def spy(*args, seen=seen, **kw):
            loss, m = real_loss(*args, **kw)
            seen.append(m["finetune/kl_to_start"])
            return loss, m

        monkeypatch.setattr(a2c, "a2c_loss", spy)
        out = tmp_path / f"kl{beta:g}"
        cfg = config(out, model=str(v0), finetune=True, lr=3e-3, max_steps=2000, kl=beta)
        assert a2c.train(cfg, make_env=FakeVec) == 0
        monkeypatch.setattr(a2c, "a2c_loss", real_loss)
        assert seen[0] == pytest.approx(0.0, abs=1e-6)
        assert max(seen[-5:]) > 1e-4
        kls[beta] = float(np.mean(seen[-5:]))
        (events,) = (out / "runs").rglob("events.out.tfevents.*")
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        assert "finetune/kl_to_start" in acc.Tags()["scalars"]
        assert [e.value for e in acc.Scalars("finetune/score")] == [SCORE] * len(acc.Scalars("finetune/score"))
    assert kls[50.0] < kls[0.0] / 2


def test_kl_start_policy_survives_resume(tmp_path):
    assert a2c.train(config(tmp_path / "v0", max_steps=280, test_every=280, test_episodes=2), make_env=FakeVec) == 0
    (v0,) = (tmp_path / "v0" / "saves").glob("best_*.pt")
    cfg = config(tmp_path, model=str(v0), finetune=True, lr=3e-3, max_steps=400, kl=1.0)
    assert a2c.train(cfg, make_env=FakeVec) == 0
    last = torch.load(tmp_path / "saves" / "last.pt", weights_only=True)
    start = torch.load(v0, weights_only=True)["state_dict"]
    for k, v in last["kl_start"].items():  # the head it started from, not the trained one
        torch.testing.assert_close(v, start[f"policy.{k}"])
    more = config(tmp_path, max_steps=600, kl=1.0, resume=True)
    assert a2c.train(more, make_env=FakeVec) == 0


def test_gamma_n_steps_entropy_and_clip_are_settings(tmp_path, monkeypatch):
    """--gamma, --n-steps, --entropy and --clip-grad reach the returns, the loss and the clip."""
    seen, betas, clips = [], [], []
    real_loss, real_clip = a2c.a2c_loss, torch.nn.utils.clip_grad_norm_

    def spy(net, batch, boot_values, device, beta, *rest, **kw):
        seen.append(batch)
        betas.append(beta)
        return real_loss(net, batch, boot_values, device, beta, *rest, **kw)

    def clip_spy(params, max_norm, *rest, **kw):
        clips.append(max_norm)
        return real_clip(params, max_norm, *rest, **kw)

    monkeypatch.setattr(a2c, "a2c_loss", spy)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_spy)
    cfg = config(tmp_path, gamma=0.5, n_steps=3, entropy=0.25, clip_grad=7.0)
    assert a2c.train(cfg, make_env=FakeVec) == 0
    batch = Transitions.concat(seen)
    assert batch.steps.max() == 3
    np.testing.assert_allclose(batch.returns, (1 - 0.5**batch.steps) / (1 - 0.5), rtol=1e-6)
    assert set(betas) == {0.25} and set(clips) == {7.0}


def test_kl_defaults_to_the_learned_rewards_pull_only_for_a_fine_tune_on_one():
    """--kl unset: KL_LEARNED_REWARD for -r with a start policy, 0 for any other run; a resumed run
    keeps the B its last.pt recorded; a B given on the command line always wins."""
    from lib.a2c.run import kl_beta

    start = True  # a run from -m, or a resumed one whose last.pt kept its start policy
    auto = a2c_config.KL_LEARNED_REWARD
    assert auto > 0
    cases = [
        (dict(reward="r.pt"), start, None, auto),
        (dict(reward="r.pt"), False, None, 0.0),  # from scratch on a learned reward: nothing to pull toward
        (dict(), start, None, 0.0),  # a fine-tune on the score
        (dict(reward="r.pt", kl=0.0), start, None, 0.0),
        (dict(reward="r.pt", kl=0.3), start, None, 0.3),
        (dict(reward="r.pt", resume=True), start, {"kl": 0.0}, 0.0),  # a run started with --kl 0
        (dict(reward="r.pt", resume=True), start, {"kl": None}, auto),  # a last.pt from before the field
        (dict(reward="r.pt", resume=True, kl=2.0), start, {"kl": 0.0}, 2.0),
    ]
    for kw, st, ck, want in cases:
        assert kl_beta(a2c_config.A2CConfig(name="x", **kw), st, ck) == want, (kw, ck)


def test_the_kl_controller_moves_the_coefficient_toward_the_target():
    """adapt_kl_coef: a KL above the target raises the coefficient, one below lowers it, by at most
    0.2 x samples / horizon a step; on target it stays."""
    assert a2c.adapt_kl_coef(1.0, 0.2, 0.1, 128) == pytest.approx(1 + 0.2 * 128 / a2c.KL_HORIZON)
    assert a2c.adapt_kl_coef(1.0, 0.11, 0.1, 128) == pytest.approx(1 + 0.1 * 128 / a2c.KL_HORIZON)
    assert a2c.adapt_kl_coef(1.0, 0.0, 0.1, 128) == pytest.approx(1 - 0.2 * 128 / a2c.KL_HORIZON)
    assert a2c.adapt_kl_coef(0.5, 0.1, 0.1, 128) == 0.5


def test_kl_target_adapts_the_coefficient_in_the_loop_and_across_a_resume(tmp_path, monkeypatch):
    """--kl-target T: every update's KL coefficient is the one the controller left; with T far below
    the KL it rises update after update, far above it falls; finetune/kl_coef is logged, last.pt
    keeps where it got to and a resumed run starts from there."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert a2c.train(config(tmp_path / "v0", max_steps=280, test_every=280, test_episodes=2), make_env=FakeVec) == 0
    (v0,) = (tmp_path / "v0" / "saves").glob("best_*.pt")
    real_loss = a2c.a2c_loss
    coefs: dict[float, list[float]] = {}
    for target in (1e-7, 100.0):
        seen: list[float] = []

        def spy(*args, seen=seen, **kw):
            seen.append(args[8])  # kl_beta: the coefficient this update uses
            return real_loss(*args, **kw)

        monkeypatch.setattr(a2c, "a2c_loss", spy)
        out = tmp_path / f"t{target:g}"
        cfg = config(out, model=str(v0), finetune=True, lr=3e-3, max_steps=1200, kl=1.0, kl_target=target)
        assert a2c.train(cfg, make_env=FakeVec) == 0
        coefs[target] = seen
        (events,) = (out / "runs").rglob("events.out.tfevents.*")
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        assert "finetune/kl_coef" in acc.Tags()["scalars"]
    up, down = coefs[1e-7], coefs[100.0]
    assert up[0] == down[0] == 1.0
    assert all(b > a for a, b in zip(up[1:], up[2:], strict=False))  # rises once the policy has moved
    assert all(b < a for a, b in zip(down, down[1:], strict=False)) and down[-1] < 1.0
    last = torch.load(tmp_path / "t1e-07" / "saves" / "last.pt", weights_only=True)
    assert last["kl_coef"] > 1.0 and last["kl"] == 1.0
    resumed: list[float] = []

    def spy2(*args, **kw):
        resumed.append(args[8])
        return real_loss(*args, **kw)

    monkeypatch.setattr(a2c, "a2c_loss", spy2)
    more = config(tmp_path / "t1e-07", max_steps=1400, kl_target=1e-7, resume=True)
    assert a2c.train(more, make_env=FakeVec) == 0
    assert resumed[0] == pytest.approx(last["kl_coef"])


def test_kl_on_marked_steps_is_the_kl_of_those_steps():
    """a2c_loss with ``marked`` steps logs finetune/kl_<marked_as>: KL(pi || pi_start) averaged over the
    flagged transitions only."""
    from lib.models.policy import StartPolicy, kl_to_start

    torch.manual_seed(0)
    start_net, net = AtariA2C(OBS, 3), AtariA2C(OBS, 3)
    start = StartPolicy(start_net)
    rng = np.random.default_rng(0)
    b = 16
    obs = rng.integers(0, 255, (b, *OBS), dtype=np.uint8)
    low = np.zeros(b, dtype=bool)
    low[[1, 5, 6]] = True
    batch = Transitions(
        obs, np.zeros(b, np.int64), np.zeros(b, np.float32), np.ones(b, np.float32), np.ones(b, np.int64),
        np.zeros(b, np.int8), obs.copy(), np.arange(b), low,
    )  # fmt: skip
    _, m = a2c.a2c_loss(
        net, batch, np.zeros(b, np.float32), torch.device("cpu"), 0.0, start=start, marked_as="low_gauge"
    )
    x = torch.from_numpy(obs)
    with torch.no_grad():
        logp = torch.log_softmax(net(x)[0], 1)
        want = kl_to_start(logp[low], start_net(x)[0][low]).item()
        everywhere = kl_to_start(logp, start_net(x)[0]).item()
    assert m["finetune/kl_low_gauge"] == pytest.approx(want, rel=1e-5)
    assert want != pytest.approx(everywhere, rel=1e-3)
    batch.marked = np.zeros(b, dtype=bool)
    assert (
        "finetune/kl_low_gauge"
        not in a2c.a2c_loss(net, batch, np.zeros(b, np.float32), torch.device("cpu"), 0.0, start=start)[1]
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(kl_target=0.05), "--kl-target pulls toward the policy -m starts from"),
        (dict(kl_target=0.05, model="m.pt", kl=0.0), "--kl-target adapts the coefficient"),
        (dict(kl_target=-1.0, model="m.pt"), "--kl-target must be in"),
        (dict(reward_clip="abs"), "--reward-clip must be a number in"),
        (dict(reward_clip="sign"), "--reward-clip clips a learned reward: give -r"),
        (dict(reward_clip="0", reward="r.pt"), "--reward-clip must be a number in"),
        (dict(reward_norm="window"), "--reward-norm window normalises a learned reward"),
        (dict(norm_window=1, reward="r.pt"), "--norm-window must be in"),
    ],
)
def test_the_new_reward_path_and_kl_flags_refuse_bad_values(kw, message):
    with pytest.raises(UserError, match=message):
        a2c_config.A2CConfig(name="x", **kw).check()
