"""--reward-reload (live rounds): stage 1 switches to each new version of its reward model file
between two steps, skips a broken one with one warning, and restarts its normalisation from the new
model's stored stats. The wrapper directly (``RewardModelWrapper(reload=True, poll_s=0)``: a look
at the file before every step), then 01_a2c.py as a real process on SeaQuest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reward_wrapper import SEAQUEST, FakeVec, _model_file

from lib.a2c.reward_env import RewardModelWrapper
from lib.core.files import atomic_write
from lib.models.reward import DiffRewardModel, RewardModel, load_reward_model, reward_checkpoint
from lib.models.reward_path import RewardPath, RunningNorm
from lib.store.checkpoints import atomic_torch_save

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "01_a2c.py")
LAST_BIAS = "out.2.bias"  # the book's reward net: its output layer's bias (the free offset)


def _variant(
    src: Path,
    dst: Path,
    version: int | None = None,
    shift: float = 0.0,
    stats: tuple[float, float] | None = None,
    **fields: object,
) -> Path:
    """Install (atomically) at ``dst`` a copy of the reward checkpoint ``src`` whose raw output is
    shifted by ``shift``, with ``metrics["version"]`` and the stored norm stats set when given and
    any other top-level fields replaced. Written with torch.save: a NaN weight gets through."""
    ck = torch.load(src, weights_only=True)
    for sd in ck["state_dicts"]:
        sd[LAST_BIAS] = sd[LAST_BIAS] + shift
    if version is not None:
        ck["metrics"] = {**ck["metrics"], "version": version}
    if stats is not None:
        ck["norm_mean"], ck["norm_std"] = stats
    ck.update(fields)
    atomic_torch_save(ck, dst)
    return dst


def _nan_weights(src: Path, dst: Path) -> Path:
    ck = torch.load(src, weights_only=True)
    ck["state_dicts"][0]["out.0.weight"][0, 0] = float("nan")
    atomic_torch_save(ck, dst)
    return dst


def _negative_variance(src: Path, dst: Path) -> Path:
    """Finite weights the loader accepts, but a BatchNorm variance < 0: NaN once folded in."""
    ck = torch.load(src, weights_only=True)
    ck["state_dicts"][0]["conv.1.running_var"][:] = -1.0
    atomic_torch_save(ck, dst)
    return dst


def _truncated(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    atomic_write(dst, lambda f: f.write(data[: len(data) // 2]))
    return dst


def _steps(w: RewardModelWrapper, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [w.step(rng.integers(0, w.n_actions, w.n_envs)) for _ in range(n)]


# --- the wrapper ---------------------------------------------------------------------------------


def test_a_new_file_is_switched_to_once_it_holds_still_and_named_by_its_version(tmp_path, capsys):
    """metrics["version"] names the version; a file without one counts the files loaded before it
    (0 at the start, then 1, 2, ...): a follower's v1 is never read as the unversioned start."""
    first = _model_file(tmp_path, name="first.pt")
    path = _variant(first, tmp_path / "r.pt")  # no version: the one at the start is v0
    w = RewardModelWrapper(FakeVec(n_envs=4), path, reload=True, poll_s=0)
    switches: list[tuple[int, str]] = []
    w.on_switch = lambda v, p: switches.append((v, p))
    _steps(w, 3)
    assert w.version == 0 and w.stats()["version"] == 0.0 and not switches
    torch.manual_seed(1)
    other = reward_checkpoint([RewardModel(18, (48, 48, 3)).eval()], SEAQUEST, "seaquest", None, 0.0, 1.0)
    atomic_torch_save({**other, "metrics": {"version": 7, "heldout_acc": 0.8}}, path)
    (st,) = _steps(w, 1)  # first look after the change: it may still be being written
    assert w.version == 0
    frames = w.env.frames.copy()
    acts = np.arange(4)
    st = w.step(acts)  # held still: switched before this step
    assert w.version == 7 and switches == [(7, str(path))]
    np.testing.assert_allclose(st.pred_rewards, load_reward_model(path).predict(frames, acts), rtol=1e-5, atol=1e-6)
    assert f"reward model: switched to v7 ({path})" in capsys.readouterr().out
    _steps(w, 5)
    assert switches == [(7, str(path))]  # one switch per file, not one per step
    _variant(first, path)  # no version: the third file loaded
    _steps(w, 2)
    assert w.version == 2 and w.loaded == 3 and w.stats()["version"] == 2.0


def test_without_reload_the_file_is_never_looked_at_again(tmp_path):
    path = _model_file(tmp_path)
    w = RewardModelWrapper(FakeVec(), path, poll_s=0)
    _variant(path, path, version=2)
    _steps(w, 4)
    assert w.version == 0


def test_the_same_model_again_is_no_switch_and_keeps_the_norm(tmp_path):
    """A touch, or the same checkpoint installed again (new inode, same bytes): no switch, no
    version, the running norm goes on. A changed weight after it is a switch."""
    path = _variant(_model_file(tmp_path, name="first.pt"), tmp_path / "r.pt", version=1)
    w = RewardModelWrapper(FakeVec(n_envs=4), path, reload=True, poll_s=0)
    switches: list[tuple[int, str]] = []
    w.on_switch = lambda v, p: switches.append((v, p))
    _steps(w, 5)
    norm = w.norm
    before = w.stats()
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # touch
    _steps(w, 3)
    atomic_write(path, path.read_bytes())  # the same bytes, a new inode
    _steps(w, 3)
    assert not switches and w.loaded == 1 and w.norm is norm and w.stats()["version"] == before["version"]
    _variant(path, path, version=1, shift=0.5)  # one changed weight, the same version number
    _steps(w, 2)
    assert switches == [(1, str(path))] and w.loaded == 2 and w.norm is not norm


def test_a_file_replaced_while_it_is_read_waits_for_the_newer_one(tmp_path, monkeypatch):
    """Stage 3 may install v3 while v2 is being read: what was read is dropped (it may be either),
    and v3 is switched to once it has held still."""
    import lib.a2c.reward_env as rw

    path = _model_file(tmp_path)
    w = RewardModelWrapper(FakeVec(n_envs=2), path, reload=True, poll_s=0)
    load = rw.load_reward_model

    def load_then_v3_lands(*args, **kw):
        model = load(*args, **kw)
        monkeypatch.setattr(rw, "load_reward_model", load)  # once
        _variant(path, path, version=3)
        return model

    _variant(path, path, version=2)
    monkeypatch.setattr(rw, "load_reward_model", load_then_v3_lands)
    _steps(w, 2)  # the second look reads v2, and v3 lands meanwhile
    assert w.version == 0 and w.loaded == 1
    _steps(w, 1)  # v3 seen: let it hold still
    assert w.version == 0
    _steps(w, 1)
    assert w.version == 3 and w.loaded == 2


def _wrong_game(src: Path, dst: Path) -> Path:
    return _variant(src, dst, game="breakout", env_id="BreakoutNoFrameskip-v4")


def _other_env_id(src: Path, dst: Path) -> Path:
    return _variant(src, dst, env_id="ALE/Seaquest-v5")


def _bigger_frames(src: Path, dst: Path) -> Path:
    return _model_file(dst.parent, size=64, name=dst.name)


def _gone(src: Path, dst: Path) -> Path:
    dst.unlink()
    return dst


def _garbage(src: Path, dst: Path) -> Path:
    atomic_write(dst, lambda f: f.write(b"PK\x03\x04 not a zip at all" * 100))
    return dst


def _huge_metric(src: Path, dst: Path) -> Path:
    """An integer no float holds (math.isfinite raises OverflowError on it: audit 5 item 1)."""
    return _variant(src, dst, metrics={"version": 2, "heldout_accuracy": 10**400})


def _huge_norm_mean(src: Path, dst: Path) -> Path:
    return _variant(src, dst, norm_mean=10**400)


@pytest.mark.parametrize(
    "breaks, says",
    [
        (_truncated, "corrupt"),
        (_nan_weights, "NaN or infinite"),
        (_negative_variance, "(BatchNorm folded in) are not finite"),
        (_wrong_game, "trained on BreakoutNoFrameskip-v4"),
        (_other_env_id, "trained on ALE/Seaquest-v5, v0 on SeaquestNoFrameskip-v4"),
        (_bigger_frames, "takes frames (64, 64, 3)"),
        (_gone, "is gone"),
        (_garbage, "reward model"),
        (_huge_metric, "field 'metrics' must be"),
        (_huge_norm_mean, "field 'norm_mean' must be"),
    ],
)
def test_a_broken_file_is_skipped_with_one_warning_and_the_old_model_stays(tmp_path, capsys, breaks, says):
    path = _model_file(tmp_path)
    good = _variant(path, tmp_path / "good.pt")
    w = RewardModelWrapper(FakeVec(n_envs=3), path, reload=True, poll_s=0)
    old = w.model
    _steps(w, 2)
    breaks(good, path)
    _steps(w, 10)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and says in err[0], err
    assert err[0].endswith("still learning from v0")
    assert w.model is old and w.version == 0
    frames, acts = w.env.frames.copy(), np.zeros(3, np.int64)
    np.testing.assert_allclose(w.step(acts).pred_rewards, old.predict(frames, acts), rtol=1e-5)
    _variant(good, path, version=2)  # a later good file is picked up
    _steps(w, 2)
    assert w.version == 2 and w.model is not old
    assert "switched to v2" in capsys.readouterr().out


def test_each_new_broken_state_warns_once(tmp_path, capsys):
    """One warning per state of the file: the same broken file over many steps says it once; a
    different broken file says it again."""
    path = _model_file(tmp_path)
    good = _variant(path, tmp_path / "good.pt")
    w = RewardModelWrapper(FakeVec(n_envs=2), path, reload=True, poll_s=0)
    _truncated(good, path)
    _steps(w, 6)
    _nan_weights(good, path)
    _steps(w, 6)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "corrupt" in err[0] and "NaN" in err[1], err
    assert w.version == 0


def test_a_switch_restarts_the_normalisation_from_the_new_models_stats(tmp_path):
    """Bradley-Terry leaves the offset free: v2 predicts v1 + 100 (its stored stats say so). The
    learner's reward is not shifted: the norm restarts from v2's stats, then its own window."""
    env = FakeVec(n_envs=8, seed=2)
    first = _model_file(tmp_path, name="first.pt")
    rm = load_reward_model(first)
    rng = np.random.default_rng(0)
    raw = rm.predict(rng.integers(0, 256, (256, 48, 48, 3), dtype=np.uint8), rng.integers(0, 18, 256))
    m, s = float(raw.mean()), float(raw.std())  # what 03_reward_train.py stores
    path = _variant(first, tmp_path / "r.pt", stats=(m, s))
    w = RewardModelWrapper(env, path, path=RewardPath(window=400), reload=True, poll_s=0)
    before = _steps(w, 100)[-20:]  # 800 predictions: the window is v1's own by now
    _variant(first, path, version=2, shift=100.0, stats=(m + 100.0, s))
    after = _steps(w, 40, seed=1)
    v2 = after[1:]  # the second look switched
    assert w.version == 2
    raw_before = np.concatenate([st.pred_rewards for st in before])
    raw_after = np.concatenate([st.pred_rewards for st in v2])
    assert raw_after.mean() - raw_before.mean() == pytest.approx(100.0, abs=3 * s)
    r_before = np.concatenate([st.rewards for st in before])
    r_after = np.concatenate([st.rewards for st in v2])
    assert abs(r_after.mean() - r_before.mean()) < 0.3 and abs(r_after.mean()) < 0.5
    assert np.abs(r_after).max() < 5.0  # carried over, v1's window would pay +100/std: all clipped at 5
    fresh = RunningNorm(400, prior=(m + 100.0, s))  # exactly a new run's norm on v2
    expected = np.concatenate([np.clip(fresh.normalise(st.pred_rewards), -5, 5) for st in v2])
    np.testing.assert_allclose(r_after, expected, rtol=1e-5, atol=1e-5)


class FreshFrames(FakeVec):
    """Hands out a new frames array at each step, as AtariVec does (FakeVec overwrites its own)."""

    def step_async(self, actions: np.ndarray) -> None:
        self.sent.append(np.asarray(actions).copy())
        self.frames = np.zeros_like(self.frames)


def test_a_pending_diff_forward_uses_the_model_of_its_own_step(tmp_path):
    """The loop sends the next step (where a switch happens) before a diff model's forward of the
    step before runs (``complete()``): that forward is the old model's, the next step the new one's."""
    cks = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cks.append(reward_checkpoint([DiffRewardModel(18, (48, 48, 3)).eval()], SEAQUEST, "seaquest", None, 0, 1))
    path, v2 = tmp_path / "d.pt", tmp_path / "d2.pt"
    atomic_torch_save(cks[0], path)
    atomic_torch_save({**cks[1], "metrics": {"version": 2}}, v2)
    old, new = load_reward_model(path), load_reward_model(v2)
    env = FreshFrames(seed=3)
    w = RewardModelWrapper(env, path, reload=True, poll_s=0)
    acts = np.array([0, 1, 2, 3])
    w.step(acts)
    atomic_torch_save({**cks[1], "metrics": {"version": 2}}, path)
    first = env.frames.copy()
    w.step_async(acts)  # first look at the new file: unsettled
    st1 = w.step_wait()
    second = env.frames.copy()
    w.step_async(acts)  # second look: switched; the step sent now is v2's ...
    assert w.version == 2
    st1.complete()  # ... and the forward of the step before still v1's
    np.testing.assert_allclose(st1.pred_rewards, old.predict(first, acts, second), rtol=1e-5, atol=1e-6)
    assert not np.allclose(st1.pred_rewards, new.predict(first, acts, second))
    st2 = w.step_wait()
    third = env.frames.copy()
    st2.complete()
    np.testing.assert_allclose(st2.pred_rewards, new.predict(second, acts, third), rtol=1e-5, atol=1e-6)
    assert w.norm.count == 4  # v2's norm holds v2's predictions only (st1's went to v1's)


# --- 01_a2c.py as a process ----------------------------------------------------------------------


def test_reload_without_a_reward_model_is_one_line_exit_2(tmp_path):
    r = subprocess.run(
        [sys.executable, SCRIPT, "-n", "x", "--reward-reload"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and r.stderr == "error: --reward-reload watches the reward model: give -r MODEL\n"
    assert list(tmp_path.iterdir()) == []


def test_a_huge_number_in_the_model_at_the_start_is_one_line_exit_2(tmp_path):
    """-r MODEL whose norm_mean is 10**400 (audit 5 item 1): refused before training, one line."""
    path = _variant(_model_file(tmp_path, name="first.pt"), tmp_path / "huge.pt", norm_mean=10**400)
    cmd = [sys.executable, SCRIPT, "-n", "x", "-r", str(path), "--envs", "2", "--save", str(tmp_path / "saves")]
    cmd += ["--runs-dir", str(tmp_path / "runs"), "--threads", "1", "--env-threads", "1", "--max-steps", "64"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, (r.returncode, r.stderr[-2000:])
    assert err[0].startswith("error: reward model ") and "'norm_mean' must be" in err[0], err


class Live:
    """01_a2c.py running as a process; threads collect its stdout and stderr lines."""

    def __init__(self, tmp_path: Path, *args: str):
        cmd = [sys.executable, SCRIPT, "--save", str(tmp_path / "saves"), "--runs-dir", str(tmp_path / "runs"), *args]
        self.p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [
            threading.Thread(target=self._read, args=(self.p.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.p.stderr, self.err), daemon=True),
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def wait_for(self, lines: list[str], text: str, timeout: float = 90.0) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in lines):
            if self.p.poll() is not None or time.time() > deadline:
                self.stop(signal.SIGKILL)
                raise AssertionError(f"no {text!r}; stdout: {self.out[-20:]}, stderr: {self.err[-20:]}")
            time.sleep(0.05)

    def stop(self, sig: int) -> int:
        self.p.send_signal(sig)
        rc = self.p.wait(timeout=60)
        for t in self.threads:
            t.join(timeout=10)
        return rc


def _tiny_real_model(path: Path) -> Path:
    """A full-resolution SeaQuest reward model (the book's net, untrained), v1."""
    torch.manual_seed(0)
    ck = reward_checkpoint([RewardModel(18).eval()], SEAQUEST, "seaquest", None, 0.0, 1.0, metrics={"version": 1})
    atomic_torch_save(ck, path)
    return path


def _tb(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "runs").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    return acc


def _checkpoints_whole(tmp_path: Path, live: Live) -> None:
    from lib.models.policy import load_policy

    assert "interrupted at step" in "\n".join(live.out), live.out[-5:]
    saves = tmp_path / "saves"
    from lib.a2c.run import RUN_LOCK

    # no temp file left beside it (the run's lock file stays: a lock dies with its holder, not its file)
    assert sorted(p.name for p in saves.iterdir() if p.name != RUN_LOCK) == ["last.pt"]
    _, ck = load_policy(saves / "last.pt", game="seaquest", obs_shape=(4, 84, 84), n_actions=18)
    assert ck["progress"]["step"] > 0


@pytest.mark.slow
def test_a_running_agent_switches_to_v2_and_skips_broken_files(tmp_path):
    """A truncated and a NaN-weight file are skipped with one warning each while the agent trains
    on v1; then v2 is switched to (stdout, TensorBoard, the segments it records); SIGTERM leaves
    its checkpoint whole."""
    from lib.store.segments import list_segments, load_segment

    path = _tiny_real_model(tmp_path / "tiny.pt")
    v1 = _tiny_real_model(tmp_path / "v1.pt")  # the source of the broken files
    db = tmp_path / "db"
    live = Live(
        tmp_path, "-n", "live", "-r", str(path), "--reward-reload", "--envs", "2", "--test-every", "0",
        "--threads", "1", "--env-threads", "1", "--db-path", str(db), "--record-prob", "0.05", "--segment-steps", "10",
    )  # fmt: skip
    live.wait_for(live.out, "reward model: v1 (")
    live.wait_for(live.out, "TensorBoard:")  # announced: the loop starts
    _truncated(v1, path)
    live.wait_for(live.err, "tiny.pt is corrupt")
    time.sleep(2.5)  # more than two looks at the same broken file
    _nan_weights(v1, path)
    live.wait_for(live.err, "NaN or infinite")
    time.sleep(2.5)
    _variant(v1, path, version=2)
    live.wait_for(live.out, f"reward model: switched to v2 ({path})")
    deadline = time.time() + 60
    versions: set[int] = set()
    while 2 not in versions and time.time() < deadline:  # a segment recorded on v2
        versions = {load_segment(db / s).meta.get("reward_version") for s in list_segments(db, warn=None)}
        time.sleep(0.2)
    rc = live.stop(signal.SIGTERM)
    assert rc == 0, live.err[-5:]
    warnings = [line for line in live.err if line.startswith("warning:")]
    assert len(warnings) == 2, warnings
    assert all(line.endswith("still learning from v1") for line in warnings)
    assert versions == {1, 2}
    _checkpoints_whole(tmp_path, live)
    acc = _tb(tmp_path)
    used = [(e.step, e.value) for e in acc.Scalars("reward_model/version")]
    assert used[0] == (0, 1.0) and used[-1][1] == 2.0 and used[-1][0] > 0, used
    assert "reward_model/switches/text_summary" in acc.Tags()["tensors"]


@pytest.mark.slow
def test_ctrl_c_after_a_switch_leaves_the_checkpoint_whole(tmp_path):
    path = _tiny_real_model(tmp_path / "tiny.pt")
    live = Live(
        tmp_path, "-n", "live", "-r", str(path), "--reward-reload", "--envs", "2", "--test-every", "0",
        "--threads", "1", "--env-threads", "1",
    )  # fmt: skip
    live.wait_for(live.out, "TensorBoard:")
    _variant(path, path, version=2, shift=100.0, stats=(100.0, 1.0))
    live.wait_for(live.out, "switched to v2")
    assert live.stop(signal.SIGINT) == 0, live.err[-5:]
    assert not [line for line in live.err if line.startswith("warning:")], live.err
    _checkpoints_whole(tmp_path, live)
    assert _tb(tmp_path).Scalars("reward_model/version")[-1].value == 2.0


def test_a_fine_tune_on_a_learned_reward_pulls_toward_its_start_by_default(tmp_path, monkeypatch):
    """The real emulator, a reward model and a start policy: with --kl unset the learner's loss gets
    B = KL_LEARNED_REWARD and last.pt records it; the same fine-tune on the score gets 0."""
    import lib.a2c.train as a2c
    from lib.a2c.config import KL_LEARNED_REWARD, A2CConfig
    from lib.atari.envs import AtariVec
    from lib.models.policy import AtariA2C, policy_checkpoint

    env = AtariVec("SeaquestNoFrameskip-v4", n_envs=1)
    torch.manual_seed(0)
    net = AtariA2C(env.obs_shape, env.n_actions)
    atomic_torch_save(policy_checkpoint(net, env.env_id, env.game, env.action_meanings, step=0), tmp_path / "v0.pt")
    env.close()
    reward = _tiny_real_model(tmp_path / "reward.pt")
    betas: list[float] = []
    real_loss = a2c.a2c_loss

    def spy(*args, **kw):
        betas.append(args[8] if len(args) > 8 else kw.get("kl_beta", 0.0))
        return real_loss(*args, **kw)

    monkeypatch.setattr(a2c, "a2c_loss", spy)
    for name, kw, want in (("rlhf", {"reward": str(reward)}, KL_LEARNED_REWARD), ("control", {}, 0.0)):
        betas.clear()
        cfg = A2CConfig(
            name=name, model=str(tmp_path / "v0.pt"), finetune=True, envs=2, max_steps=256, test_every=0,
            save=str(tmp_path / name), runs_dir=str(tmp_path / "runs"), threads=1, env_threads=1, **kw,
        )  # fmt: skip
        assert a2c.train(cfg) == 0
        assert betas and set(betas) == {want}, (name, betas)
        assert torch.load(tmp_path / name / "last.pt", weights_only=True)["kl"] == want
