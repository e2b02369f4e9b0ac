"""04_play.py and lib/play/play.py, lib/atari/video.py: real ALE games, real MP4 files decoded back.

The policies are randomly initialised AtariA2C nets saved in the real checkpoint format: a
random SeaQuest policy loses all its lives in ~400-600 agent steps (under a second), so whole
games stay cheap. Subprocess tests (marked slow) run the script as a user would.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import torch

import lib.play.play
from lib.atari.envs import AtariVec
from lib.atari.video import _PRED, _TRUE, SCALE, STRIP_HEIGHT, Mp4Writer, RewardStrip, compose, upscale
from lib.core.errors import UserError
from lib.models.policy import AtariA2C, policy_checkpoint
from lib.models.reward import DiffRewardModel, RewardModel, reward_checkpoint, save_reward_checkpoint
from lib.models.reward_path import RunningNorm, norm_prior
from lib.play.config import PlayConfig
from lib.play.play import play, prepare_video_dir, summary, video_stem
from lib.store.checkpoints import atomic_torch_save

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "04_play.py"


def decode(path: Path) -> tuple[dict, list[np.ndarray]]:
    """(ffmpeg's metadata, every frame (H, W, 3) uint8) of a video file."""
    gen = imageio_ffmpeg.read_frames(str(path))
    meta = next(gen)
    w, h = meta["size"]
    frames = [np.frombuffer(b, dtype=np.uint8).reshape(h, w, 3) for b in gen]
    return meta, frames


def save_policy(path: Path, env_id: str, seed: int = 0, bare: bool = False) -> Path:
    env = AtariVec(env_id, n_envs=1)
    torch.manual_seed(seed)
    net = AtariA2C(env.obs_shape, env.n_actions)
    ck = policy_checkpoint(net, env.env_id, env.game, env.action_meanings, step=0)
    env.close()
    atomic_torch_save(net.state_dict() if bare else ck, path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    (d / "run1").mkdir()  # saves/<run>/<checkpoint>, as 01_a2c.py writes them
    out = {
        "policy": save_policy(d / "run1" / "best_0001.pt", "SeaquestNoFrameskip-v4"),
        "breakout": save_policy(d / "breakout.pt", "BreakoutNoFrameskip-v4"),
        "breakout_bare": save_policy(d / "breakout_bare.pt", "BreakoutNoFrameskip-v4", bare=True),
    }
    corrupt = d / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 this is not a checkpoint" + bytes(range(256)))
    out["corrupt"] = corrupt
    for name, env_id in (
        ("reward", "SeaquestNoFrameskip-v4"),
        ("reward_breakout", "BreakoutNoFrameskip-v4"),
    ):
        env = AtariVec(env_id, n_envs=1)
        torch.manual_seed(1)
        rm = RewardModel(env.n_actions).eval()
        ck = reward_checkpoint([rm], env.env_id, env.game, env.action_meanings, norm_mean=0.5, norm_std=2.0)
        env.close()
        save_reward_checkpoint(ck, d / f"{name}.pt")
        out[name] = d / f"{name}.pt"
    torch.manual_seed(1)
    ck = reward_checkpoint([DiffRewardModel(18).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    save_reward_checkpoint(ck, d / "reward_diff.pt")
    out["reward_diff"] = d / "reward_diff.pt"
    return out


def run_play(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- in process: a whole game to MP4 ----------------------------------------------------------


def test_full_game_recorded_to_mp4_decodes_back(models: dict[str, Path], tmp_path: Path) -> None:
    lines: list[str] = []
    (res,) = play(PlayConfig(model=str(models["policy"]), record=str(tmp_path), seed=7), log=lines.append)
    # A whole game: all lives lost, long past the first life.
    assert res.end == "game over"
    assert res.steps > 150
    assert res.video == tmp_path / "run1_best_0001_ep01.mp4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1_best_0001_ep01.mp4"]  # no temp files left

    meta, frames = decode(res.video)
    assert meta["codec"] == "h264"
    assert meta["pix_fmt"].startswith("yuv420p")
    assert meta["fps"] == 15.0  # game speed: 60 Hz / frame skip 4
    assert meta["size"] == (160 * SCALE, 210 * SCALE)
    assert len(frames) == res.steps  # one frame per agent step, none dropped or duplicated
    assert meta["duration"] == pytest.approx(res.steps / 15, abs=0.2)
    data = res.video.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")  # +faststart: a browser plays while loading

    # The first video frame is the game's first frame (same seed -> same no-op start), give or
    # take H.264's loss; a frame of another game start would be far off.
    env = AtariVec(n_envs=1, seed=7)
    env.reset()
    first = upscale(env.frames[0]).astype(np.int16)
    env.close()
    assert np.abs(frames[0].astype(np.int16) - first).mean() < 4.0
    assert np.abs(frames[-1].astype(np.int16) - first).mean() > np.abs(frames[0].astype(np.int16) - first).mean()
    assert any("episode 1: score" in line for line in lines)


def test_links_planted_at_temp_names_are_not_followed(models: dict[str, Path], tmp_path: Path) -> None:
    """Audit 4 item 5: symlinks at the old fixed temp names (``.NAME.mp4.part``, ``.NAME.gif.part``)
    sent the MP4 and the GIF to the files they point to and left the final names links to them."""
    out, victims = tmp_path / "videos", tmp_path / "victims"
    out.mkdir()
    victims.mkdir()
    stem = "run1_best_0001_ep01"
    for ext in ("mp4", "gif"):
        (victims / ext).write_bytes(b"the user's file")
        (out / f".{stem}.{ext}.part").symlink_to(victims / ext)
    (res,) = play(
        PlayConfig(model=str(models["policy"]), record=str(out), seed=0, max_steps=20, gif=True), log=lambda _: None
    )
    assert [(victims / ext).read_bytes()[:20] for ext in ("mp4", "gif")] == [b"the user's file"] * 2
    assert not res.video.is_symlink() and len(decode(res.video)[1]) == 20
    assert not res.gif.is_symlink() and res.gif.read_bytes()[:6] == b"GIF89a"
    planted = {f".{stem}.mp4.part", f".{stem}.gif.part"}
    assert {p.name for p in out.iterdir()} == {res.video.name, res.gif.name} | planted  # no temp left


def test_seeded_games_repeat_and_differ_between_envs(models: dict[str, Path]) -> None:
    a = play(PlayConfig(model=str(models["policy"]), episodes=2, seed=3), log=lambda _: None)
    b = play(PlayConfig(model=str(models["policy"]), episodes=2, seed=3), log=lambda _: None)
    assert [(r.score, r.steps) for r in a] == [(r.score, r.steps) for r in b]
    assert [r.index for r in a] == [1, 2]
    assert a[0].steps != a[1].steps  # two different games, not one played twice
    assert all(r.end == "game over" and r.video is None for r in a)


def test_slot_reused_after_game_over(models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One env slot: the second game starts in the env the first one ended in (same-step reset).
    monkeypatch.setattr(lib.play.play, "MAX_PARALLEL", 1)
    res = play(PlayConfig(model=str(models["policy"]), episodes=2, record=str(tmp_path), seed=4), log=lambda _: None)
    assert [(r.index, r.end) for r in res] == [(1, "game over"), (2, "game over")]
    assert res[0].steps != res[1].steps
    for r in res:
        assert len(decode(r.video)[1]) == r.steps


def test_max_steps_cuts_games_and_starts_fresh_ones(models: dict[str, Path]) -> None:
    # 10 games > MAX_PARALLEL slots, all cut: the second wave needs a fresh reset.
    res = play(
        PlayConfig(model=str(models["policy"]), episodes=10, seed=1, max_steps=20, greedy=True), log=lambda _: None
    )
    assert [r.index for r in res] == list(range(1, 11))
    assert all(r.steps == 20 and r.end == "max steps" for r in res)


def test_summary_line() -> None:
    from lib.play.play import EpisodeResult

    res = [EpisodeResult(1, 100.0, 500, "game over"), EpisodeResult(2, 300.0, 700, "game over")]
    line = summary(res)
    assert "2 episode(s): score mean 200.0, std 100.0, max 300" in line
    assert "length mean 600 steps" in line and "refills" not in line  # no gauge was read
    assert "best life" not in line  # no lives recorded
    res[0].lives, res[1].lives = [(60.0, 300), (40.0, 200)], [(60.0, 350), (240.0, 350)]
    assert "length mean 600 steps; best life 240 in 350 steps" in summary(res)
    res[1].lives = [(60.0, 350), (40.0, 350)]  # the same score in two lives: the longer one
    assert "best life 60 in 350 steps" in summary(res)
    from lib.atari.seaquest import OxygenCounts

    res[0].oxygen, res[1].oxygen = OxygenCounts(1, 4, 1), OxygenCounts(2, 4, 0)
    assert "refills 1.50/game, lives lost 4.00/game (12% to oxygen)" in summary(res)


def test_summary_without_a_life_lost_gives_no_shares_of_lives_lost() -> None:
    """No life lost: the shares of lives lost to oxygen and to surfacing are undefined, not 0%."""
    from lib.atari.seaquest import OxygenCounts, SurfaceCounts
    from lib.play.play import EpisodeResult

    res = [EpisodeResult(1, 100.0, 500, "max steps"), EpisodeResult(2, 300.0, 700, "max steps")]
    res[0].oxygen, res[1].oxygen = OxygenCounts(1, 0, 0), OxygenCounts(2, 0, 0)
    line = summary(res)
    assert "refills 1.50/game, lives lost 0.00/game (n/a to oxygen)" in line, line
    res[0].surface, res[1].surface = SurfaceCounts(steps=500), SurfaceCounts(steps=700)
    line = summary(res)
    assert "(n/a to oxygen)" in line and "n/a of lives lost surfacing with no diver" in line, line
    assert "0% of lives lost" not in line, line


# --- the reward view ---------------------------------------------------------------------------


def test_reward_strip_draws_prediction_and_true_reward_where_expected() -> None:
    strip = RewardStrip(clip=5.0)
    for t in range(50):
        strip.add(2.0 if t == 49 else 0.0, 20.0 if t == 30 else 0.0)
    img = strip.render()
    assert img.shape == (STRIP_HEIGHT, 160 * SCALE, 3) and img.dtype == np.uint8
    pred_col = img[:, 49 * 2 + 1]  # x of step 49 (2 px a step), the newest
    ys = np.flatnonzero(np.all(np.abs(pred_col.astype(int) - _PRED) < 40, axis=1))
    zero_ys = np.flatnonzero(np.all(np.abs(img[:, 20 * 2 + 1].astype(int) - _PRED) < 40, axis=1))
    assert len(ys) and len(zero_ys) and ys.min() < zero_ys.min() - 5  # +2 is drawn well above 0
    bar = np.all(img[:, 30 * 2] == _TRUE, axis=1)
    assert bar.sum() > 10  # the 20-point reward is a full-height bar
    assert not np.all(img[:, 20 * 2] == _TRUE, axis=1).any()  # and no bar where nothing was scored


@pytest.mark.parametrize("steps", [1, 159, 160, 5000])
def test_reward_strip_any_episode_length(steps: int) -> None:
    strip = RewardStrip(clip=5.0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        strip.add(float(rng.normal() * 5), float(rng.choice([0, 0, 0, 20, -1])))
    img = strip.render()
    assert img.shape == (STRIP_HEIGHT, 160 * SCALE, 3)
    # The newest step is always at the right edge once the window is full.
    last_x = (min(steps, strip.window) - 1) * 2 + 1
    assert np.any(np.all(np.abs(img[:, last_x].astype(int) - _PRED) < 60, axis=1))


def test_compose_and_writer_sizes(tmp_path: Path) -> None:
    frame = np.zeros((210, 160, 3), dtype=np.uint8)
    assert compose(frame).shape == (420, 320, 3)
    assert compose(frame, RewardStrip(clip=5.0).render()).shape == (420 + STRIP_HEIGHT, 320, 3)
    with pytest.raises(ValueError, match="even"):
        Mp4Writer(tmp_path / "x.mp4", 321, 420)
    w = Mp4Writer(tmp_path / "x.mp4", 320, 420)
    with pytest.raises(ValueError, match="frame must be"):
        w.add(frame)
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_video_names_say_model_and_episode() -> None:
    assert video_stem("saves/demo-ft/best_000020000_score210.0_len785.pt", 3) == (
        "demo-ft_best_000020000_score210.0_len785_ep03"
    )
    assert video_stem("saves/my run/last.pt", 12) == "my_run_last_ep12"


def test_reward_model_normalisation(models: dict[str, Path]) -> None:
    from lib.models.reward import load_reward_model

    rm = load_reward_model(models["reward"], game="seaquest", n_actions=18)
    raw = np.array([0.5, 2.5, -1.5], dtype=np.float32)
    # the reward view's normalisation is the learner's: the training stats until the window fills
    assert norm_prior(rm) == (0.5, 2.0)
    np.testing.assert_allclose(RunningNorm(10_000, prior=norm_prior(rm)).normalise(raw), [0.0, 1.0, -1.0])


def test_a_real_game_splits_into_lives_where_the_lives_counter_drops() -> None:
    from lib.atari.games import play_games

    env = AtariVec(n_envs=1, seed=4)  # a game whose lives score differently
    lives_before: list[int] = []  # the env's lives counter when each step's action was chosen
    rewards: list[float] = []

    class Rewards:
        def started(self, slot, index): ...
        def stepped(self, slot, frame, reward, pred, life_lost):
            rewards.append(reward)

        def finished(self, slot, res): ...
        def aborted(self): ...

    def policy(obs: np.ndarray) -> np.ndarray:
        lives_before.append(int(env.lives[0]))
        return rng.integers(0, env.n_actions, len(obs))

    rng = np.random.default_rng(0)
    try:
        (res,) = play_games(env, policy, 1, observers=[Rewards()])
    finally:
        env.close()
    assert res.end == "game over" and len(rewards) == res.steps
    # A life ends on the step after which the counter is lower, and on the game's last step.
    ends = [t for t in range(res.steps - 1) if lives_before[t + 1] < lives_before[t]] + [res.steps - 1]
    starts = [0] + [t + 1 for t in ends[:-1]]
    want = [(sum(rewards[a : b + 1]), b + 1 - a) for a, b in zip(starts, ends, strict=True)]
    assert res.lives == want and len({s for s, _ in want}) > 1
    assert len(res.lives) == lives_before[0] == 4  # SeaQuest's sub and 3 in reserve; no extra life earned
    assert sum(s for s, _ in res.lives) == res.score and sum(n for _, n in res.lives) == res.steps


def test_lives_end_where_one_is_lost_where_the_game_ends_and_where_it_is_cut() -> None:
    """A hand-made sequence of steps through ``play_games``' bookkeeping: two lives lost, then the
    frame limit (a truncation: no life lost) ends the game; a second game is cut by max steps."""
    from types import SimpleNamespace

    from lib.atari.games import _Games, best_life

    def step(reward: float, lost: bool = False, truncated: bool = False, max_steps: int | None = None) -> None:
        flags = {"terminated": [lost], "truncated": [truncated], "game_over": [truncated]}
        s = SimpleNamespace(true_rewards=np.array([reward]), **{k: np.array(v) for k, v in flags.items()})
        games.stepped(np.array([0]), np.zeros((1, 2, 2, 3), np.uint8), s, None, max_steps)

    games = _Games(1, 2, [])
    games.start_all(1)
    for r, lost in ((10, False), (0, False), (20, True), (5, True), (0, False)):
        step(r, lost)
    step(30, truncated=True)
    step(7)
    step(8, max_steps=2)
    first, second = games.results
    assert (first.score, first.steps, first.end) == (65, 6, "frame limit")
    assert first.lives == [(30, 3), (5, 1), (30, 2)]
    assert (second.end, second.lives) == ("max steps", [(15, 2)])
    assert best_life(games.results) == (30, 3)  # the same score as the last life, and longer


def test_play_games_hands_predict_the_frame_each_step_showed_next() -> None:
    from lib.atari.envs import AtariVec
    from lib.atari.games import play_games

    env = AtariVec(n_envs=2, seed=3)
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def predict(frames: np.ndarray, actions: np.ndarray, shown: np.ndarray, game_over: np.ndarray) -> np.ndarray:
        assert not game_over.any()  # 40 steps of random play end no game
        seen.append((frames.copy(), shown.copy()))
        return np.zeros(len(frames), np.float32)

    rng = np.random.default_rng(0)
    play_games(env, lambda obs: rng.integers(0, env.n_actions, len(obs)), 2, predict=predict, max_steps=40)
    env.close()
    assert len(seen) == 40
    for (_, shown), (then, _) in zip(seen[:-1], seen[1:], strict=True):
        np.testing.assert_array_equal(shown, then)  # what a step showed next is the next step's frame
    assert not all(np.array_equal(f, n) for f, n in seen)  # and not the step's own frame


@pytest.mark.parametrize("reward", ["reward", "reward_diff"])
def test_reward_view_in_process(models: dict[str, Path], tmp_path: Path, reward: str) -> None:
    (res,) = play(
        PlayConfig(model=str(models["policy"]), record=str(tmp_path), reward=str(models[reward]), seed=2),
        log=lambda _: None,
    )
    assert res.end == "game over" and res.score > 0  # a random policy scores in most games
    assert res.reward_corr is not None
    meta, frames = decode(res.video)
    assert meta["size"] == (320, 420 + STRIP_HEIGHT)
    assert len(frames) == res.steps


# --- errors a user can make, in process --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"episodes": 0}, "-n must be at least 1"),
        ({"max_steps": 0}, "--max-steps must be at least 1"),
        ({"gif": True}, "--gif needs -r"),
        ({"dev": "tpu"}, "--dev must be cpu, cuda"),
        ({"env": "BreakoutNoFrameskip-v4"}, "was trained on SeaquestNoFrameskip-v4"),
        ({"env": "NoSuchGame-v4"}, "unknown --env"),
    ],
)
def test_bad_arguments(models: dict[str, Path], kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        play(PlayConfig(model=str(models["policy"]), **kwargs), log=lambda _: None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_gpu_is_a_user_error(models: dict[str, Path]) -> None:
    with pytest.raises(UserError, match="no CUDA GPU is available"):
        play(PlayConfig(model=str(models["policy"]), dev="cuda"), log=lambda _: None)


def test_video_dir_checks(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        prepare_video_dir(f)
    with pytest.raises(UserError, match="cannot write videos"):
        prepare_video_dir(f / "videos")
    assert prepare_video_dir(tmp_path / "a" / "b").is_dir()


# --- the script, as a user runs it -------------------------------------------------------------


@pytest.mark.slow
def test_cli_two_full_games_with_gif(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "videos"
    r = run_play("-m", models["policy"], "-n", "2", "-r", out, "--seed", "5", "--gif")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sum(line.startswith("episode ") for line in lines) == 2
    assert "2 episode(s): score mean" in lines[-1] and "std" in lines[-1] and "max" in lines[-1]
    for ep in (1, 2):
        mp4 = out / f"run1_best_0001_ep{ep:02d}.mp4"
        line = next(line for line in lines if line.startswith(f"episode {ep}:"))
        steps = int(line.split(", ")[1].split()[0])
        assert "(game over)" in line
        assert len(decode(mp4)[1]) == steps
        gif = mp4.with_suffix(".gif")
        assert gif.read_bytes()[:6] == b"GIF89a" and gif.stat().st_size > 10_000


@pytest.mark.slow
def test_cli_reward_view_past_100_steps(models: dict[str, Path], tmp_path: Path) -> None:
    # The book's play script crashed after 100 frames with --reward.
    r = run_play("-m", models["policy"], "-r", tmp_path, "--reward", models["reward"], "--max-steps", "140")
    assert r.returncode == 0, r.stderr
    assert "reward corr" in r.stdout and "140 steps (max steps)" in r.stdout
    meta, frames = decode(tmp_path / "run1_best_0001_ep01.mp4")
    assert len(frames) == 140
    assert meta["size"] == (320, 420 + STRIP_HEIGHT)
    strip = frames[-1][420:].astype(int)
    orange = np.all(np.abs(strip - _PRED) < 60, axis=2)
    assert orange[:, 200:].sum() > 50  # the prediction line reaches across the (scrolling) plot


def _bad_inputs(models: dict[str, Path], tmp: Path) -> dict[str, tuple[list[str | Path], str]]:
    """case -> (arguments, a piece of the one-line error that says what is wrong)."""
    (tmp / "a_file").write_text("not a dir")
    policy = ["-m", models["policy"]]
    return {
        "missing model": (["-m", tmp / "nope.pt"], "model file not found"),
        "corrupt model": (["-m", models["corrupt"]], "is corrupt or not a PyTorch checkpoint"),
        "model for another game": (
            ["-m", models["breakout"], "-e", "SeaquestNoFrameskip-v4"],
            "was trained on BreakoutNoFrameskip-v4",
        ),
        "bare state dict of another game": (
            ["-m", models["breakout_bare"]],
            "bare state dict with 4 actions",
        ),
        "reward model given as policy": (["-m", models["reward"]], "is a reward model, not a policy"),
        "reward model for another game": (
            [*policy, "--reward", models.get("reward_breakout", "")],
            "was trained on BreakoutNoFrameskip-v4",
        ),
        "missing reward model": ([*policy, "--reward", tmp / "nope.pt"], "reward model file not found"),
        "policy given as reward model": (
            [*policy, "--reward", models["policy"]],
            "is a policy, not a reward model",
        ),
        "video dir is a file": ([*policy, "-r", tmp / "a_file"], "is a file, not a directory"),
        "video dir under a file": ([*policy, "-r", tmp / "a_file" / "videos"], "cannot write videos"),
    }


BAD_INPUTS = [
    "missing model",
    "corrupt model",
    "model for another game",
    "bare state dict of another game",
    "reward model given as policy",
    "reward model for another game",
    "missing reward model",
    "policy given as reward model",
    "video dir is a file",
    "video dir under a file",
]


def _with_video_dir(args: list[str | Path], tmp: Path) -> tuple[list[str | Path], Path]:
    videos = tmp / "videos"
    return (args if "-r" in args else [*args, "-r", videos]), videos


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_one_line_exit_2(
    models: dict[str, Path],
    tmp_path: Path,
    case: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """The script's own main in this process (no interpreter start-up): exit 2, one line."""
    args, expected = _bad_inputs(models, tmp_path)[case]
    args, videos = _with_video_dir(args, tmp_path)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *map(str, args), "--max-steps", "5"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exc.value.code == 2, case
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not videos.exists() or not any(videos.iterdir())  # nothing recorded before the check


@pytest.mark.slow
@pytest.mark.parametrize("case", ["corrupt model", "reward model for another game"])
def test_cli_bad_input_one_line_exit_2(models: dict[str, Path], tmp_path: Path, case: str) -> None:
    """The same as a user sees it: a real process, its exit code and stderr."""
    args, expected = _bad_inputs(models, tmp_path)[case]
    args, _ = _with_video_dir(args, tmp_path)
    r = run_play(*args, "--max-steps", "5")
    assert r.returncode == 2, (case, r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_unwritable_video_dir(models: dict[str, Path], tmp_path: Path) -> None:
    """A video dir under a file cannot be made, even by root (a read-only dir would not stop root)."""
    (tmp_path / "afile").write_text("not a directory")
    r = run_play("-m", models["policy"], "-r", tmp_path / "afile" / "videos", "--max-steps", "5")
    assert r.returncode == 2 and r.stderr.startswith("error: cannot write videos"), r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.slow
def test_cli_help_lists_every_flag() -> None:
    r = run_play("--help")
    assert r.returncode == 0
    for flag in ("-m", "-e", "-r", "-n", "--reward", "--dev", "--seed", "--greedy", "--gif", "--max-steps"):
        assert f" {flag}" in r.stdout, flag


def test_a_run_directory_stands_for_its_best_policy(tmp_path: Path) -> None:
    """-m saves/RUN (01_a2c.py, 04_play.py): the best_*.pt with the highest step, else last.pt."""
    from lib.core.errors import UserError
    from lib.models.policy import best_checkpoint_name, policy_file

    run = tmp_path / "v0"
    run.mkdir()
    with pytest.raises(UserError, match="without a policy"):
        policy_file(run)
    (run / "last.pt").write_bytes(b"x")
    assert policy_file(run) == run / "last.pt"
    names = [best_checkpoint_name(s, sc, 700) for s, sc in ((9_000, 120.0), (120_000, 310.5), (40_000, 200.0))]
    for n in names:
        (run / n).write_bytes(b"x")
    assert names[1] == "best_000120000_score310.5_len700.pt"
    assert policy_file(run) == run / names[1]  # the highest step: the last best written
    assert policy_file(run / names[0]) == run / names[0]  # a file is taken as given
