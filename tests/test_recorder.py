"""EpisodeRecorderWrapper: segments pair frame t with action t and reward t."""

import numpy as np

from lib.a2c.recorder import EpisodeRecorderWrapper
from lib.atari.envs import AtariVec, VecStep
from lib.store.segments import list_segments, load_segment


class CountingEnv:
    """Toy vector env: frame pixel = step number, reward of step t = 10 t + env."""

    def __init__(self, n_envs=2):
        self.n_envs, self.env_id, self.action_meanings = n_envs, "Toy-v0", ("A", "B", "C")
        self.t = 0
        self.frames = np.zeros((n_envs, 210, 160, 3), np.uint8)
        self.lives = np.full(n_envs, 3, np.int32)

    def reset(self):
        return np.zeros((self.n_envs, 1), np.uint8)

    def step_async(self, actions):
        self._a = actions

    def step_wait(self):
        r = (10 * self.t + np.arange(self.n_envs)).astype(np.float32)
        self.t += 1
        self.frames = np.full((self.n_envs, 210, 160, 3), self.t % 256, np.uint8)
        z = np.zeros(self.n_envs, bool)
        obs = np.zeros((self.n_envs, 1), np.uint8)
        return VecStep(obs, r, r.copy(), z, z, z, obs, self.lives.copy())

    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def close(self):
        pass


def test_toy_env_alignment(tmp_path):
    env = EpisodeRecorderWrapper(
        CountingEnv(2), tmp_path, record_prob=1.0, segment_steps=5, rng=np.random.default_rng(0)
    )
    env.reset()
    for t in range(12):
        env.step(np.array([t % 3, (t + 1) % 3]))
    env.close()
    segs = list_segments(tmp_path)
    assert segs == ["00/00000005.dat", "00/00000010.dat", "01/00000005.dat", "01/00000010.dat"]
    seg = load_segment(tmp_path / "01/00000010.dat")
    # steps 5..9 of env 1: frame shown before step t has pixel t, action (t+1)%3, reward 10t+1
    assert list(seg.frames[:, 0, 0, 0]) == [5, 6, 7, 8, 9]
    assert list(seg.actions) == [(t + 1) % 3 for t in range(5, 10)]
    assert list(seg.rewards) == [10 * t + 1 for t in range(5, 10)]
    assert seg.env_index == 1 and seg.step == 10 and seg.env_id == "Toy-v0"


def test_never_overwrites_an_existing_db(tmp_path):
    for _ in range(2):
        env = EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=4)
        env.reset()
        for _t in range(4):
            env.step(np.array([0]))
        env.close()
    assert list_segments(tmp_path) == ["00/00000004.dat", "00/00000008.dat"]


def test_a_planted_huge_name_does_not_move_a_new_recorders_counter(tmp_path):
    """A 1-byte 00/999999999999.dat (12 digits: no recorder writes it) made a new recorder continue
    env 0 from 10**12, beyond what its checkpoint's env_steps accept (--resume was refused)."""
    (tmp_path / "00").mkdir()
    (tmp_path / "00" / "999999999999.dat").write_bytes(b"x")
    env = EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=4)
    env.reset()
    for _t in range(4):
        env.step(np.array([0]))
    env.close()
    assert "00/00000004.dat" in list_segments(tmp_path, warn=None)


def test_real_ale_frames_actions_rewards(tmp_path):
    """On the real emulator: the recorded frame is the one the action was chosen on."""
    base = AtariVec("SeaquestNoFrameskip-v4", 2, seed=1)
    env = EpisodeRecorderWrapper(base, tmp_path, record_prob=1.0, segment_steps=30, rng=np.random.default_rng(0))
    env.reset()
    rng = np.random.default_rng(0)
    seen_frames, seen_actions, seen_rewards = [], [], []
    for _ in range(30):
        a = rng.integers(0, base.n_actions, 2)
        seen_frames.append(base.frames[0].copy())
        st = env.step(a)
        seen_actions.append(a[0])
        seen_rewards.append(st.true_rewards[0])
    env.close()
    seg = load_segment(tmp_path / "00/00000030.dat")
    np.testing.assert_array_equal(seg.frames, np.stack(seen_frames))
    np.testing.assert_array_equal(seg.actions, seen_actions)
    np.testing.assert_array_equal(seg.rewards, seen_rewards)
    assert seg.frames.shape == (30, 210, 160, 3)
    assert seg.action_meanings[:2] == ("NOOP", "FIRE")
    # the frames move: it is a real game, not a frozen screen
    assert len({f.tobytes() for f in seg.frames}) > 10


# --- issue 24: one recorder per DB, never a replaced segment, failures counted, bounds ----------


def _record(env, steps):
    env.reset()
    for _ in range(steps):
        env.step(np.zeros(env.env.n_envs, dtype=np.int64))


def test_a_second_recorder_on_the_same_db_is_one_line_naming_the_holder(tmp_path):
    import os

    import pytest

    from lib.core.errors import UserError

    first = EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=2)
    with pytest.raises(UserError, match=f"being recorded into by another run \\(pid {os.getpid()} on ") as e:
        EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=2)
    assert "\n" not in str(e.value)
    _record(first, 4)
    first.close()
    second = EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=2)  # released
    _record(second, 2)
    second.close()
    assert list_segments(tmp_path) == ["00/00000002.dat", "00/00000004.dat", "00/00000006.dat"]


def test_the_lock_goes_with_a_killed_process(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]);"
        "from lib.a2c.recorder import lock_db; lock_db(sys.argv[2]); print('locked', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(root), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        import pytest

        from lib.core.errors import UserError

        with pytest.raises(UserError, match=f"pid {p.pid}"):
            EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=2)
    finally:
        p.kill()
        p.wait()
    EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=2).close()


def test_an_existing_segment_is_never_replaced_and_the_clash_is_counted(tmp_path):
    (tmp_path / "00").mkdir()
    env = EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=2)
    # another writer (not a recorder of ours) puts a file where our next segment goes
    (tmp_path / "00" / "00000002.dat").write_bytes(b"theirs")
    _record(env, 4)
    env.close()
    assert (tmp_path / "00" / "00000002.dat").read_bytes() == b"theirs"
    assert env.segments_written == 1 and env.segments_failed == 1
    assert len(env.writer.errors) == 1 and "1 segment(s) could not be written" in env.writer.errors[0]
    assert "exists already, not replaced" in env.writer.errors[0]


def test_disk_full_segments_are_counted_and_reported(tmp_path, monkeypatch):
    import errno

    import lib.store.segment_writer

    def full(path, data, fsync=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    env = EpisodeRecorderWrapper(CountingEnv(2), tmp_path, record_prob=1.0, segment_steps=2)
    monkeypatch.setattr(lib.store.segment_writer, "create_exclusive", full)
    _record(env, 6)
    env.close()
    assert env.segments_written == 0 and env.segments_failed == 6
    assert env.writer.errors == [
        f"6 segment(s) could not be written into {tmp_path} (0 were; first: 00/00000002.dat: "
        "[Errno 28] No space left on device)"
    ]


def test_segment_steps_are_bounded_by_what_readers_accept(tmp_path):
    import pytest

    from lib.a2c.recorder import MAX_SEGMENT_STEPS
    from lib.store.segments import MAX_RAW_BYTES

    assert MAX_SEGMENT_STEPS * 210 * 160 * 3 < MAX_RAW_BYTES
    with pytest.raises(ValueError, match="segment_steps must be in 1..1000"):
        EpisodeRecorderWrapper(CountingEnv(1), tmp_path, segment_steps=1400)
    EpisodeRecorderWrapper(CountingEnv(1), tmp_path, segment_steps=MAX_SEGMENT_STEPS).close()


def test_the_longest_segment_a_recorder_may_write_is_read_back(tmp_path):
    """MAX_SEGMENT_STEPS full-size frames of noise (incompressible): every reader takes it."""
    from lib.a2c.recorder import MAX_SEGMENT_STEPS
    from lib.store.segment_writer import encode_segment
    from lib.store.segments import Segment, load_segment

    t = MAX_SEGMENT_STEPS
    frames = np.random.default_rng(0).integers(0, 256, (t, 210, 160, 3), dtype=np.uint8)
    seg = Segment(frames=frames, actions=np.zeros(t, np.int64), rewards=np.zeros(t, np.float32), env_index=0, step=t)
    (tmp_path / "s.dat").write_bytes(encode_segment(seg, level=1))
    assert len(load_segment(tmp_path / "s.dat")) == t


def test_stale_segment_temps_are_removed_at_the_next_start(tmp_path):
    import os

    (tmp_path / "00").mkdir()
    stale = tmp_path / "00" / ".00000050.dat.abc123.tmp"
    other = tmp_path / "00" / ".notes.tmp"  # not a name we make
    for p in (stale, other):
        p.write_bytes(b"half")
        os.utime(p, (1, 1))
    EpisodeRecorderWrapper(CountingEnv(1), tmp_path, segment_steps=2).close()
    assert not stale.exists() and other.exists()
