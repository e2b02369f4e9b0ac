"""Play a saved policy for full games (04_play.py): scores, gameplay videos, and the reward model's
view. A game is every life until game over, as Atari scores are reported, and ALE cuts it at 108,000
frames, so every game ends. Several games run side by side with one batched forward per step;
exactly ``episodes`` games are started and all are played out, so short games are not favoured in
the statistics."""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lib.atari.behaviour import behaviour_observers, behaviour_stats, format_behaviour
from lib.atari.envs import DEFAULT_ENV, AtariVec, rom_name
from lib.atari.games import EpisodeResult, best_life, play_games, select_actions
from lib.atari.video import GAME_FPS, SCALE, Mp4Writer, RewardStrip, compose, mp4_to_gif
from lib.core.errors import UserError
from lib.core.stats import pearson
from lib.models.policy import POLICY_FIELDS, load_policy, policy_file, resolve_device
from lib.models.reward_path import DEFAULT_NORM_WINDOW, Norm, RewardPath, norm_prior
from lib.play.config import PlayConfig
from lib.store.checkpoints import POLICY_FORMAT, check_ck_fields, read_checkpoint, wrong_kind

MAX_PARALLEL = 8  # games played side by side; more only adds memory and open ffmpeg processes


def policy_env_id(model: str | os.PathLike, env: str | None, ck: dict[str, Any]) -> str:
    """The env to play: the checkpoint's own env id when it has one (then ``env`` must be the same
    game), else ``env``, else the default."""
    if (err := wrong_kind(model, ck, "policy")) is not None:
        raise err
    if ck.get("format") == POLICY_FORMAT:
        check_ck_fields(ck, POLICY_FIELDS, f"model {model}")  # before its env id makes an env
    ck_env = ck.get("env_id") if ck.get("format") == POLICY_FORMAT else None
    if ck_env is None:
        return env or DEFAULT_ENV
    if env is not None and rom_name(env) != rom_name(ck_env):
        raise UserError(f"model {model} was trained on {ck_env}, not {env}: drop --env or pass another model")
    return ck_env


def check_bare_actions(model: str | os.PathLike, venv: AtariVec, ck: dict[str, Any]) -> None:
    """A bare state dict (the book's format) knows no game, but its policy head tells the action
    count: say so plainly when it does not fit the env instead of a state-dict size mismatch."""
    head = ck.get("policy.2.weight")  # (n_actions, 512)
    if isinstance(head, torch.Tensor) and head.ndim == 2 and head.shape[0] != venv.n_actions:
        raise UserError(
            f"model {model} is a bare state dict with {head.shape[0]} actions, {venv.env_id} has "
            f"{venv.n_actions}: pass -e with the game it was trained on"
        )


def prepare_video_dir(path: str | os.PathLike) -> Path:
    """Create the video directory and prove it is writable (root ignores permission bits, so a
    real file is written and removed). UserError with one line when it is not."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"video dir {path} is a file, not a directory: pass another -r")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"cannot write videos to {path}: {e.strerror or e}") from None
    return path


def video_stem(model: str | os.PathLike, index: int) -> str:
    """File name (no extension) saying model and episode: saves/demo-ft/best_0042.pt, 3 ->
    'demo-ft_best_0042_ep03'."""
    model = Path(model)
    run = model.resolve().parent.name
    name = f"{run}_{model.stem}" if run else model.stem
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._") or "model"
    return f"{name}_ep{index:02d}"


def load_reward(path: str | os.PathLike, game: str, n_actions: int, device: str) -> Any:
    """The reward model for the reward view (see lib/models/reward.py); UserError for a model of
    another game, a policy, or a corrupt file."""
    from lib.models.reward import load_reward_model

    return load_reward_model(path, game=game, n_actions=n_actions, device=device)


def paid_path(ck: dict[str, Any], rm: Any, log: Callable[[str], None] = print) -> RewardPath:
    """The reward path the policy's run was paid through, as its checkpoint records it
    (``lib.models.reward_path``); the default path for a checkpoint that records none (a run on
    the score, or one from before the record). "labels" needs the reward model's stats: without
    them the view falls back to the running norm, said in one line."""
    rec = ck.get("reward_path") if ck.get("format") == POLICY_FORMAT else None
    path = RewardPath.read(rec) if rec is not None else RewardPath()  # checked with POLICY_FIELDS
    if path.norm == "labels" and norm_prior(rm) is None:
        log("reward view: the reward model stores no statistics of its labelled clips: shown with the running norm")
        path = replace(path, norm="running", window=DEFAULT_NORM_WINDOW)
    return path


def play(cfg: PlayConfig, log: Callable[[str], None] = print) -> list[EpisodeResult]:
    """Play ``cfg.episodes`` full games with the policy in ``cfg.model``; returns them in episode
    order. With ``cfg.record`` each game is recorded to ``<dir>/<run>_<checkpoint>_epNN.mp4`` (and
    ``.gif`` with ``cfg.gif``); with ``cfg.reward`` each video shows the reward view and each result
    carries the predicted-vs-true reward correlation. Every input is checked before the first step."""
    cfg.check()
    model, episodes, greedy, gif, max_steps = cfg.model, cfg.episodes, cfg.greedy, cfg.gif, cfg.max_steps
    video_dir, reward, seed = cfg.record, cfg.reward, cfg.seed
    dev = resolve_device(cfg.dev)
    model = policy_file(model)  # a run directory stands for its best policy
    ck = read_checkpoint(model, "model")  # read once: missing or corrupt files fail here
    env_id = policy_env_id(model, cfg.env, ck)
    n_envs = min(episodes, MAX_PARALLEL)
    # emulator threads: the cores this process may use unless told (0), at most one a game
    venv = AtariVec(env_id, n_envs=n_envs, seed=seed, num_threads=cfg.env_threads or None, device=dev)
    try:
        check_bare_actions(model, venv, ck)
        net, _ = load_policy(model, env_id, venv.game, venv.obs_shape, venv.n_actions, ck=ck)
        net.to(dev).eval()
        rm = load_reward(reward, venv.game, venv.n_actions, str(dev)) if reward is not None else None
        vdir = prepare_video_dir(video_dir) if video_dir is not None else None

        how = "greedy" if greedy else "sampled"
        log(f"playing {episodes} game(s) of {env_id} with {model} ({how} actions, {n_envs} side by side, {dev})")
        path = paid_path(ck, rm, log) if rm is not None else None
        if path is not None:
            source = ck.get("reward_source") if ck.get("format") == POLICY_FORMAT else None
            sent = f"; the run sent {source} through it, the strip shows this model's" if source else ""
            log(f"reward view: {reward} (paid as the run was: {path.describe()}{sent})")
        rng = np.random.default_rng(seed)
        # One intra-op thread: forwards of <= 8 observations gain nothing from more, and the ALE
        # threads and ffmpeg need the cores (spin-waiting OpenMP threads slow a busy machine down
        # badly).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _play_loop(venv, net, dev, episodes, vdir, model, rm, path, greedy, gif, max_steps, rng, log)
        finally:
            torch.set_num_threads(threads)
    finally:
        venv.close()


class _GameRecorder:
    """A ``GameObserver`` for 04_play.py: one MP4 per game (with the reward view under it when a
    reward model is given), the predicted-vs-true reward correlation, a console line per game. The
    view shows each raw prediction as the policy's run was paid it (``path``: one norm over the
    games side by side, as over the run's envs); the correlation is of the raw predictions (it
    ignores scale and shift)."""

    def __init__(
        self,
        n_slots: int,
        vdir: Path | None,
        model: str | os.PathLike,
        path: RewardPath | None,
        stats: tuple[float, float] | None,
        gif: bool,
        log: Callable[[str], None],
    ) -> None:
        self.vdir, self.model, self.path, self.gif, self.log = vdir, model, path, gif, log
        self.with_reward = path is not None
        # a game slot stands for one of the run's envs: "window" keeps a window per slot, the other
        # norms are one over all games
        self.norms: list[Norm] = []
        if path is not None:
            shared = path.new_norm(1, stats)
            self.norms = [path.new_norm(1, stats) if path.norm == "window" else shared for _ in range(n_slots)]
        self.index = [0] * n_slots
        self.writers: list[Mp4Writer | None] = [None] * n_slots
        self.strips: list[RewardStrip | None] = [None] * n_slots
        self.series: list[tuple[list[float], list[float]]] = [([], []) for _ in range(n_slots)]

    def started(self, slot: int, index: int) -> None:
        self.index[slot] = index
        self.series[slot] = ([], [])
        # drawn to the largest pay the path gives, and named under the strip
        with_strip = self.path is not None and self.vdir is not None
        self.strips[slot] = RewardStrip(self.path.bound(), self.path.describe()) if with_strip else None

    def stepped(self, slot: int, frame: np.ndarray, reward: float, pred: float | None, life_lost: bool) -> None:
        if pred is not None:
            self.series[slot][0].append(pred)
            self.series[slot][1].append(reward)
        writer, strip = self.writers[slot], self.strips[slot]
        if writer is None and self.vdir is not None:  # sized by the game's own frames
            height = frame.shape[0] * SCALE + (strip.height if strip else 0)
            path = self.vdir / f"{video_stem(self.model, self.index[slot])}.mp4"
            writer = self.writers[slot] = Mp4Writer(path, frame.shape[1] * SCALE, height, fps=GAME_FPS)
        if writer is not None:
            if strip is not None and pred is not None and self.path is not None:
                paid, _ = self.path.pay(np.array([pred], dtype=np.float32), self.norms[slot], np.array([reward]))
                strip.add(float(paid[0]), reward)
            writer.add(compose(frame, strip.render() if strip else None))

    def finished(self, slot: int, res: EpisodeResult) -> None:
        writer, self.writers[slot] = self.writers[slot], None
        if writer is not None:
            res.video = writer.close()
            if self.gif:
                res.gif = mp4_to_gif(res.video, res.video.with_suffix(".gif"))
        if self.with_reward:
            corr = pearson(*self.series[slot])
            res.reward_corr = None if math.isnan(corr) else corr  # None: a constant series (nothing scored)
        self.log(format_episode(res, self.with_reward))

    def aborted(self) -> None:
        for w in self.writers:
            if w is not None:
                w.abort()


def _play_loop(
    venv: AtariVec,
    net: torch.nn.Module,
    dev: torch.device,
    episodes: int,
    vdir: Path | None,
    model: str | os.PathLike,
    rm: Any,
    path: RewardPath | None,
    greedy: bool,
    gif: bool,
    max_steps: int | None,
    rng: np.random.Generator,
    log: Callable[[str], None],
) -> list[EpisodeResult]:
    """``play_games`` with this policy, the reward model's raw prediction and a recorder."""

    def policy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return select_actions(net(torch.as_tensor(obs, device=dev))[0], greedy, rng)

    def predict(frames: np.ndarray, actions: np.ndarray, shown: np.ndarray, game_over: np.ndarray) -> np.ndarray:
        return np.asarray(rm.predict(frames, actions, shown, game_over), dtype=np.float32).reshape(-1)

    stats = norm_prior(rm) if rm is not None else None
    recorder = _GameRecorder(venv.n_envs, vdir, model, path if rm is not None else None, stats, gif, log)
    results = play_games(
        venv,
        policy,
        episodes,
        observers=[*behaviour_observers(venv), recorder],
        predict=predict if rm is not None else None,
        max_steps=max_steps,
        log=log,
    )
    assert results is not None  # no stop callback: never abandoned
    return results


def format_episode(res: EpisodeResult, with_reward: bool = False) -> str:
    """One console line per game; ``with_reward`` adds the predicted/true reward correlation."""
    parts = [f"episode {res.index}: score {res.score:g}, {res.steps} steps ({res.end})"]
    if (best := best_life([res])) is not None:
        parts.append(f"best life {format_life(best)}")
    if res.oxygen is not None:
        ox = res.oxygen
        parts.append(f"refills {ox.refills}, lives lost {ox.deaths} ({ox.oxygen_deaths} to oxygen)")
    if res.video is not None:
        parts.append(f"video {res.video}")
    if res.gif is not None:
        parts.append(f"gif {res.gif}")
    if with_reward:
        corr = "n/a (a constant series)" if res.reward_corr is None else f"{res.reward_corr:+.3f}"
        parts.append(f"reward corr {corr}")
    return ", ".join(parts)


def format_life(life: tuple[float, int]) -> str:
    """A life's (score, agent steps) as '460 in 580 steps'."""
    return f"{life[0]:g} in {life[1]} steps"


def summary(results: list[EpisodeResult], with_reward: bool = False) -> str:
    """Mean, std (population) and max of the scores, mean length, the best single life (the book's
    figure: ``lib.atari.games.best_life``), and the mean reward correlation."""
    scores = np.array([r.score for r in results], dtype=np.float64)
    steps = np.array([r.steps for r in results], dtype=np.float64)
    line = (
        f"{len(results)} episode(s): score mean {scores.mean():.1f}, std {scores.std():.1f}, "
        f"max {scores.max():g}; length mean {steps.mean():.0f} steps"
    )
    if (best := best_life(results)) is not None:
        line += f"; best life {format_life(best)}"
    if behaviour := format_behaviour(behaviour_stats(results)):
        line += f"; {behaviour}"
    if with_reward:
        corrs = [r.reward_corr for r in results if r.reward_corr is not None]
        if corrs:
            line += f"; reward corr mean {np.mean(corrs):+.3f} over {len(corrs)}"
        else:
            line += "; reward corr n/a (no points scored)"
    return line
