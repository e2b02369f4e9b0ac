"""The segment DB: round trip, legacy book segments, truncated files, code-running pickles."""

import collections
import os
import pickle
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

from bench.dbs import book_pickle
from lib.store.segment_writer import save_segment
from lib.store.segments import Segment, SegmentError, decode_segment, list_segments, load_segment, segment_path


def make_segment(t=50, env_index=3, step=12345, seed=0):
    rng = np.random.default_rng(seed)
    frames = np.zeros((t, 210, 160, 3), np.uint8)
    frames[:, 50:60, 40:50] = rng.integers(0, 255, (t, 10, 10, 3), dtype=np.uint8)
    return Segment(
        frames=frames,
        actions=rng.integers(0, 18, t),
        rewards=rng.choice([0.0, 20.0], t).astype(np.float32),
        dones=rng.random(t) < 0.1,
        game_over=np.zeros(t, bool),
        lives=np.full(t, 4, np.int32),
        env_id="SeaquestNoFrameskip-v4",
        action_meanings=("NOOP", "FIRE"),
        env_index=env_index,
        step=step,
        checkpoint="saves/x/best.pt",
        time=123.0,
    )


def test_round_trip(tmp_path):
    seg = make_segment()
    path = save_segment(tmp_path, seg)
    assert path == tmp_path / "03" / "00012345.dat"
    back = load_segment(path)
    for name in ("frames", "actions", "rewards", "dones", "game_over", "lives"):
        np.testing.assert_array_equal(getattr(back, name), getattr(seg, name))
    assert back.env_id == seg.env_id and back.step == 12345 and back.env_index == 3
    assert back.action_meanings == ("NOOP", "FIRE") and back.checkpoint == "saves/x/best.pt"
    assert back.true_return == pytest.approx(float(seg.rewards.sum()))
    assert list_segments(tmp_path) == ["03/00012345.dat"]
    # compressed: far below the 5 MB of raw frames
    assert path.stat().st_size < 200_000
    assert not [p for p in (tmp_path / "03").iterdir() if p.name.startswith(".tmp")]


def test_legacy_book_segment_loads_without_rewards(tmp_path):
    # The book pickles a list of lib.rlhf.EpisodeStep(obs, act): a frozen dataclass.
    mod = types.ModuleType("lib.rlhf")

    @dataclass(frozen=True)
    class EpisodeStep:
        obs: np.ndarray
        act: int

    EpisodeStep.__module__ = "lib.rlhf"
    EpisodeStep.__qualname__ = "EpisodeStep"
    mod.EpisodeStep = EpisodeStep
    sys.modules["lib.rlhf"] = mod
    try:
        steps = [EpisodeStep(np.full((210, 160, 3), i, np.uint8), i % 18) for i in range(50)]
        data = pickle.dumps(steps)
    finally:
        del sys.modules["lib.rlhf"]
    (tmp_path / "00").mkdir()
    (tmp_path / "00" / "00000100.dat").write_bytes(data)
    # a plain class (instance dict) and a named tuple (constructor arguments) pickle differently
    nt = collections.namedtuple("EpisodeStep", "obs act", module="lib.rlhf")
    mod.EpisodeStep = nt
    sys.modules["lib.rlhf"] = mod
    try:
        as_tuple = pickle.dumps([nt(np.full((4, 4, 3), 7, np.uint8), 3)])
    finally:
        del sys.modules["lib.rlhf"]
    for alt in (book_pickle([(np.full((4, 4, 3), 7, np.uint8), 3)]), as_tuple):
        seg = decode_segment(alt)
        assert seg.actions.tolist() == [3] and seg.frames.shape == (1, 4, 4, 3) and seg.frames.max() == 7
    seg = load_segment(tmp_path / "00" / "00000100.dat")
    assert seg.frames.shape == (50, 210, 160, 3)
    assert list(seg.actions[:3]) == [0, 1, 2]
    assert seg.frames[7, 0, 0, 0] == 7
    assert seg.rewards is None
    with pytest.raises(ValueError, match="no true rewards"):
        _ = seg.true_return


def test_truncated_segment_is_a_clear_error(tmp_path):
    path = save_segment(tmp_path, make_segment())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SegmentError, match=str(path.name)):
        load_segment(path)


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_code_running_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = _Evil()
    evil.marker = marker
    path = tmp_path / "00" / "00000001.dat"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps(evil))
    with pytest.raises(SegmentError, match="refusing to load") as e:
        load_segment(path)
    assert "00000001.dat" in str(e.value)
    assert not marker.exists()


def test_garbage_and_missing_files(tmp_path):
    p = tmp_path / "x.dat"
    p.write_bytes(b"not a pickle at all")
    with pytest.raises(SegmentError, match="x.dat"):
        load_segment(p)
    with pytest.raises(SegmentError, match="cannot read"):
        load_segment(tmp_path / "missing.dat")


def test_paths_must_stay_inside_the_db(tmp_path):
    assert segment_path(tmp_path, "03/00000001.dat") == tmp_path / "03/00000001.dat"
    with pytest.raises(SegmentError, match="not a segment name"):
        segment_path(tmp_path, "../etc/passwd")
    (tmp_path / "03").mkdir()
    os.symlink("/etc/passwd", tmp_path / "03" / "00000002.dat")
    with pytest.raises(SegmentError, match="leads outside the DB"):
        segment_path(tmp_path, "03/00000002.dat")
