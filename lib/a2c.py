"""A2C on Atari (the book's settings), optionally recording segments or learning a reward model.

Reads top to bottom: arguments, checks, the loss, evaluation, the training loop.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lib.envs import DEFAULT_ENV, AtariVec, rom_name
from lib.errors import UserError
from lib.experience import BOOT_FINAL, BOOT_NEXT, NStepCollector, Transitions
from lib.model import (
    AtariA2C,
    atomic_torch_save,
    load_policy,
    policy_checkpoint,
    read_checkpoint,
    resolve_device,
)
from lib.recorder import DEFAULT_RECORD_PROB, DEFAULT_SEGMENT_STEPS, EpisodeRecorderWrapper
from lib.segments import check_db_game

# The book's hyper-parameters (Lapan, ch. 19 / ch. 12).
GAMMA = 0.99
LEARNING_RATE = 7e-4
FINETUNE_LEARNING_RATE = 7e-5
ENTROPY_BETA = 0.01
BATCH_SIZE = 128
REWARD_STEPS = 5
CLIP_GRAD = 0.1
ADAM_EPS = 1e-5
LR_DECAY_STEPS = 10_000_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="01_a2c.py",
        description="Train an A2C agent on an Atari game. With --db-path it records random segments of "
        "its play for labeling; with -r it learns from a reward model instead of the game score.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "-n", "--name", required=True, help="run name: checkpoints go to saves/<name>, logs to runs/"
    )
    p.add_argument(
        "--env", default=DEFAULT_ENV, help="ALE game, e.g. SeaquestNoFrameskip-v4 or BreakoutNoFrameskip-v4"
    )
    p.add_argument("--dev", default="cpu", help="torch device for the networks: cpu or cuda")
    p.add_argument("-m", "--model", help="start from this saved policy (.pt) instead of from scratch")
    p.add_argument(
        "--finetune",
        action="store_true",
        help=f"freeze the conv layers of -m and train the heads with lr {FINETUNE_LEARNING_RATE}",
    )
    p.add_argument(
        "-r",
        "--reward",
        help="learn from this reward model (.pt from 03_reward_train.py) instead of the game score",
    )
    p.add_argument("--save", help="checkpoint directory (default: saves/<name>)")
    p.add_argument("--db-path", help="record segments into this DB directory (recording is off without it)")
    p.add_argument("--envs", type=int, default=16, help="number of games played side by side")
    p.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="stop cleanly after this many agent steps, summed over all envs (0: run until Ctrl-C)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for envs, network init and recording")
    p.add_argument(
        "--record-prob",
        type=float,
        default=DEFAULT_RECORD_PROB,
        help="per agent step and env, probability to start recording a segment (default gives ~2,500 segments over 10M steps)",
    )
    p.add_argument(
        "--segment-steps", type=int, default=DEFAULT_SEGMENT_STEPS, help="agent steps per recorded segment"
    )
    p.add_argument(
        "--test-every", type=int, default=100_000, help="evaluate every this many agent steps (0: never)"
    )
    p.add_argument(
        "--test-episodes",
        type=int,
        default=10,
        help="full games (all lives) per evaluation, played side by side",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="start the run <name> over even though saves/<name> holds checkpoints (they are replaced)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run <name> from saves/<name>/last.pt (optimizer, step counter, LR schedule)",
    )
    p.add_argument(
        "--lr",
        type=float,
        help=f"learning rate (default {LEARNING_RATE}, {FINETUNE_LEARNING_RATE} with --finetune); decays linearly to 0 over --lr-decay-steps",
    )
    p.add_argument(
        "--lr-decay-steps",
        type=int,
        default=0,
        help=f"agent steps over which the lr decays to 0 (0: --max-steps if given, else {LR_DECAY_STEPS:,})",
    )
    p.add_argument("--runs-dir", default="runs", help="TensorBoard log root")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="run the networks' forward passes in bfloat16 autocast (weights and loss stay float32): ~2x faster learner on CPUs with AVX512-BF16/AMX and on GPUs",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: one per core)")
    return p


class MeanTracker:
    """Averages noisy per-train-step scalars over ``every`` values before writing them to
    TensorBoard; ``flush()`` writes what is left (ptan's TBMeanTracker cannot, so a short run
    would log no loss at all)."""

    def __init__(self, writer: Any, every: int = 10):
        self.writer, self.every = writer, every
        self._values: dict[str, list[float]] = {}
        self._step = 0

    def track(self, name: str, value: float, step: int) -> None:
        vals = self._values.setdefault(name, [])
        vals.append(value)
        self._step = step
        if len(vals) >= self.every:
            self.writer.add_scalar(name, float(np.mean(vals)), step)
            vals.clear()

    def flush(self) -> None:
        for name, vals in self._values.items():
            if vals:
                self.writer.add_scalar(name, float(np.mean(vals)), self._step)
                vals.clear()


@dataclass
class Progress:
    """Counters that survive --resume."""

    step: int = 0
    train_steps: int = 0
    best_mean: float = -math.inf
    games: int = 0


# --- checks (before anything is written) ----------------------------------------------------


def _check_writable_dir(path: Path, what: str) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} exists and is not a directory")
    q = path
    while not q.exists():
        q = q.parent
    if not q.is_dir() or not os.access(q, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {what} {path}: {q} is not a writable directory")


def _make_dir(path: Path, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {what} {path}: {e.strerror or e}") from None


def _check_resumable(ck: dict[str, Any], path: Path) -> None:
    """--resume needs what only ``last.pt`` holds: optimizer, scheduler and counters."""
    progress = ck.get("progress")
    keys = ("step", "train_steps", "best_mean", "games")
    if not (
        isinstance(progress, dict)
        and all(isinstance(progress.get(k), int | float) for k in keys)
        and isinstance(ck.get("optimizer"), dict)
        and isinstance(ck.get("scheduler"), dict)
    ):
        raise UserError(
            f"{path} is not a resumable checkpoint (no optimizer state or step counters; a copied "
            f"best_*.pt?): start a new run from it with -m {path}"
        )


def check_args(args: argparse.Namespace) -> None:
    if args.envs < 1:
        raise UserError(f"--envs must be at least 1, got {args.envs}")
    if not 0.0 <= args.record_prob <= 1.0:
        raise UserError(f"--record-prob must be a probability in [0, 1], got {args.record_prob}")
    if args.segment_steps < 1:
        raise UserError(f"--segment-steps must be at least 1, got {args.segment_steps}")
    if args.max_steps < 0:
        raise UserError(f"--max-steps must be >= 0, got {args.max_steps}")
    if args.test_every < 0:
        raise UserError(f"--test-every must be >= 0, got {args.test_every}")
    if args.test_episodes < 1:
        raise UserError(f"--test-episodes must be at least 1, got {args.test_episodes}")
    if args.lr is not None and not args.lr > 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    if args.threads < 0:
        raise UserError(f"--threads must be >= 0, got {args.threads}")
    if args.lr_decay_steps < 0:
        raise UserError(f"--lr-decay-steps must be >= 0, got {args.lr_decay_steps}")
    if args.finetune and not (args.model or args.resume):
        raise UserError("--finetune needs a policy to start from: give -m MODEL")
    if args.resume and args.force:
        raise UserError("--resume continues the run, --force starts it over: give one of them")
    if args.resume and args.model:
        raise UserError("--resume continues saves/<name>/last.pt; do not also give -m")
    if not args.name or "/" in args.name or args.name in (".", ".."):
        raise UserError(f"--name must be a plain name (no '/'), got {args.name!r}")


# --- the loss ---------------------------------------------------------------------------------


def a2c_loss(
    net: AtariA2C,
    batch: Transitions,
    boot_values: np.ndarray,
    device: torch.device,
    entropy_beta: float,
    bf16: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A2C loss on a batch of n-step transitions.

    target = returns + discount * V(s_boot) (boot_values are 0 where the episode terminated);
    boot_values: (B,) float32, computed without gradient.
    """
    states = torch.from_numpy(batch.obs).to(device)
    actions = torch.from_numpy(batch.actions).to(device)
    target = torch.from_numpy(batch.returns + batch.discount * boot_values).to(device)

    with autocast(device, bf16):
        logits, values = net(states)
    logits, values = logits.float(), values.float()
    # Critic: regress V(s) on the n-step target.
    loss_value = F.mse_loss(values, target)
    # Actor: raise log pi(a|s) in proportion to the advantage (no gradient through the critic).
    log_prob = F.log_softmax(logits, dim=1)
    adv = target - values.detach()
    loss_policy = -(adv * log_prob[torch.arange(len(actions), device=device), actions]).mean()
    # Entropy bonus keeps the policy exploring (the book's beta 0.01).
    entropy = -(log_prob.exp() * log_prob).sum(dim=1).mean()
    loss = loss_policy + loss_value - entropy_beta * entropy
    metrics = {
        "losses/policy": loss_policy.item(),
        "losses/value": loss_value.item(),
        "losses/entropy": entropy.item(),
        "losses/total": loss.item(),
        "losses/advantage": adv.mean().item(),
    }
    return loss, metrics


def autocast(device: torch.device, enabled: bool) -> torch.autocast:
    """bfloat16 autocast for the forward passes (--bf16); a no-op context when disabled."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def _values(net: AtariA2C, obs: np.ndarray, device: torch.device, bf16: bool = False) -> np.ndarray:
    with torch.no_grad(), autocast(device, bf16):
        return net(torch.from_numpy(obs).to(device))[1].float().cpu().numpy()


# --- evaluation -------------------------------------------------------------------------------


def evaluate(
    net: AtariA2C, env: AtariVec, device: torch.device, stop: list[bool] | None = None, bf16: bool = False
) -> dict[str, float] | None:
    """Play one full game (all lives) in each env side by side, actions sampled from the policy;
    games are capped at ALE's 108,000 frames. Returns score and length stats (unclipped game
    score, agent steps), or None if stopped by a signal."""
    net.eval()
    obs = env.reset()
    n = env.n_envs
    scores = np.zeros(n)
    lengths = np.zeros(n, dtype=np.int64)
    finished = np.zeros(n, dtype=bool)
    while not finished.all():
        if stop and stop[0]:
            net.train()
            return None
        with torch.no_grad(), autocast(device, bf16):
            logits, _ = net(torch.from_numpy(obs).to(device))
            actions = torch.multinomial(F.softmax(logits.float(), dim=1), 1).squeeze(1).cpu().numpy()
        st = env.step(actions)
        active = ~finished
        scores[active] += st.true_rewards[active]
        lengths[active] += 1
        finished |= st.game_over
        obs = st.obs
    net.train()
    return {
        "score_mean": float(scores.mean()),
        "score_std": float(scores.std()),
        "score_max": float(scores.max()),
        "length_mean": float(lengths.mean()),
        "length_max": float(lengths.max()),
    }


# --- training ---------------------------------------------------------------------------------


class _Stopper:
    """Ctrl-C / SIGTERM set a flag; the loop finishes its step and shuts down cleanly."""

    def __init__(self) -> None:
        self.flag = [False]
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stopper:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.flag[0]:
            raise KeyboardInterrupt  # second Ctrl-C: stop waiting
        self.flag[0] = True
        print(f"\n{signal.Signals(signum).name}: finishing the current step and saving...", flush=True)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _hparams_table(args: argparse.Namespace, extra: dict[str, Any]) -> str:
    rows = {**vars(args), **extra}
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in sorted(rows.items()))


def _fmt_time(sec: float) -> str:
    sec = int(max(sec, 0))
    return f"{sec // 3600}:{sec % 3600 // 60:02d}:{sec % 60:02d}"


def train(args: argparse.Namespace) -> int:
    check_args(args)
    device = resolve_device(args.dev)
    if args.threads:
        torch.set_num_threads(args.threads)
    game = rom_name(args.env)
    save_dir = Path(args.save or Path("saves") / args.name)
    last_path = save_dir / "last.pt"

    # Everything that can be wrong is checked before anything is written.
    resume_ck: dict[str, Any] | None = None
    if args.resume:
        if not last_path.exists():
            raise UserError(f"--resume: no {last_path} to resume from (start the run without --resume)")
        resume_ck = read_checkpoint(last_path, "checkpoint")
        _check_resumable(resume_ck, last_path)
    elif not args.force and save_dir.is_dir() and any(save_dir.glob("*.pt")):
        raise UserError(
            f"{save_dir} already holds the run {args.name!r}: continue it with --resume, start it over "
            f"with --force (replaces its checkpoints), or pick another -n"
        )
    _check_writable_dir(save_dir, "checkpoint dir")
    _check_writable_dir(Path(args.runs_dir), "TensorBoard dir")
    if args.db_path:
        _check_writable_dir(Path(args.db_path), "DB dir")
        check_db_game(args.db_path, args.env)

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    base_env = AtariVec(args.env, args.envs, seed=args.seed)
    obs_shape, n_actions = base_env.obs_shape, base_env.n_actions

    progress = Progress()
    if resume_ck is not None:
        net, _ = load_policy(last_path, args.env, game, obs_shape, n_actions)
        finetune = bool(resume_ck.get("finetune", False))
        progress = Progress(
            **{k: resume_ck["progress"][k] for k in ("step", "train_steps", "best_mean", "games")}
        )
    elif args.model:
        net, _ = load_policy(args.model, args.env, game, obs_shape, n_actions)
        finetune = args.finetune
    else:
        net = AtariA2C(obs_shape, n_actions)
        finetune = False
    if finetune:
        net.freeze_conv()
    net.to(device)

    env: Any = base_env
    recorder: EpisodeRecorderWrapper | None = None
    if args.db_path:
        counters = np.asarray(resume_ck["env_steps"]) if resume_ck and "env_steps" in resume_ck else None
        if counters is not None and len(counters) != args.envs:
            counters = None
        _make_dir(Path(args.db_path), "DB dir")
        recorder = EpisodeRecorderWrapper(
            env, args.db_path, args.record_prob, args.segment_steps, rng=rng, step_counters=counters,
            checkpoint=str(args.model) if args.model else None,
        )  # fmt: skip
        env = recorder
    if args.reward:
        from lib.reward_wrapper import RewardModelWrapper

        env = RewardModelWrapper(env, args.reward, device=device)
    eval_env = AtariVec(args.env, args.test_episodes, seed=args.seed + 10_000) if args.test_every else None

    lr = args.lr or (FINETUNE_LEARNING_RATE if finetune else LEARNING_RATE)
    if resume_ck is not None:
        lr = resume_ck.get("lr", lr)
    decay_steps = args.lr_decay_steps or args.max_steps or LR_DECAY_STEPS
    if resume_ck is not None:
        decay_steps = resume_ck.get("lr_decay_steps", decay_steps)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr, eps=ADAM_EPS)
    # Polynomial (power 1) decay to 0, counted in training steps of BATCH_SIZE transitions.
    decay_iters = max(1, decay_steps // BATCH_SIZE)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: max(0.0, 1.0 - it / decay_iters))
    if resume_ck is not None:
        optimizer.load_state_dict(resume_ck["optimizer"])
        scheduler.load_state_dict(resume_ck["scheduler"])

    _make_dir(save_dir, "checkpoint dir")
    _make_dir(Path(args.runs_dir), "TensorBoard dir")
    from torch.utils.tensorboard import SummaryWriter

    if resume_ck is not None and resume_ck.get("tb_dir"):
        tb_dir = Path(resume_ck["tb_dir"])
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        tb_dir = Path(args.runs_dir) / f"{args.name}__a2c__{game}__s{args.seed}__{stamp}"
    writer = SummaryWriter(str(tb_dir), purge_step=progress.step if resume_ck is not None else None)
    if resume_ck is None:
        writer.add_text("hyperparameters", _hparams_table(args, {
            "gamma": GAMMA, "lr_used": lr, "entropy_beta": ENTROPY_BETA, "batch": BATCH_SIZE,
            "reward_steps": REWARD_STEPS, "clip_grad": CLIP_GRAD, "adam_eps": ADAM_EPS,
            "lr_decay_steps": decay_steps, "finetune": finetune, "n_actions": n_actions, "game": game,
        }))  # fmt: skip

    def save(path: Path, **extra: Any) -> None:
        ck = policy_checkpoint(
            net, args.env, game, base_env.action_meanings, step=progress.step, finetune=finetune, **extra
        )
        atomic_torch_save(ck, path)

    def save_last() -> None:
        save(
            last_path,
            optimizer=optimizer.state_dict(),
            scheduler=scheduler.state_dict(),
            lr=lr,
            lr_decay_steps=decay_steps,
            progress={"step": progress.step, "train_steps": progress.train_steps, "best_mean": progress.best_mean,
                      "games": progress.games},
            env_steps=recorder.env_steps.tolist() if recorder else None,
            tb_dir=str(tb_dir),
        )  # fmt: skip

    collector = NStepCollector(args.envs, obs_shape, REWARD_STEPS, GAMMA)
    # The game score is sign-clipped (DeepMind); a learned reward is normalised and clipped by
    # lib/reward_wrapper.py instead.
    clip_rewards = not args.reward
    game_score = np.zeros(args.envs)
    game_pred = np.zeros(args.envs)
    game_len = np.zeros(args.envs, dtype=np.int64)
    recent_scores: list[float] = []
    recent_pairs: list[tuple[float, float]] = []  # (true score, predicted return) per game, for -r
    ready: list[Transitions] = []
    ready_boot: list[np.ndarray] = []
    waiting: Transitions | None = None
    next_test = (progress.step // args.test_every + 1) * args.test_every if args.test_every else None
    start_step = progress.step
    t_start = t_last = time.time()
    step_last = progress.step
    eval_seconds = 0.0
    last_metrics: dict[str, float] = {}
    status = "finished"

    print(
        f"A2C on {args.env} ({game}), {args.envs} envs, {n_actions} actions, device {device}"
        + (f", finetune from {args.model}" if finetune and args.model else "")
        + (f", resumed at step {progress.step:,}" if resume_ck is not None else "")
        + (f", reward model {args.reward}" if args.reward else "")
        + (f", recording into {args.db_path} (p={args.record_prob})" if args.db_path else ""),
        flush=True,
    )
    print(f"TensorBoard: tensorboard --logdir {args.runs_dir}   (this run: {tb_dir})", flush=True)

    obs = env.reset()
    net.train()
    tracker = MeanTracker(writer, every=10)
    with _Stopper() as stopper:
        try:
            while True:
                if stopper.flag[0]:
                    status = "interrupted"
                    break
                if args.max_steps and progress.step >= args.max_steps:
                    break

                with torch.no_grad(), autocast(device, args.bf16):
                    logits, values = net(torch.from_numpy(obs).to(device))
                    actions = torch.multinomial(F.softmax(logits.float(), dim=1), 1).squeeze(1).cpu().numpy()
                values_np = values.float().cpu().numpy()

                # Transitions emitted by the last step bootstrap from V(current obs), which the
                # acting forward pass just computed: no second forward in the learner.
                if waiting is not None and len(waiting):
                    boot = np.zeros(len(waiting), dtype=np.float32)
                    nxt = waiting.boot_mode == BOOT_NEXT
                    boot[nxt] = values_np[waiting.env[nxt]]
                    fin = waiting.boot_mode == BOOT_FINAL
                    if fin.any():
                        boot[fin] = _values(net, waiting.boot_obs[fin], device, args.bf16)
                    ready.append(waiting)
                    ready_boot.append(boot)
                    if sum(len(t) for t in ready) >= BATCH_SIZE:
                        batch = Transitions.concat(ready)
                        loss, m = a2c_loss(
                            net, batch, np.concatenate(ready_boot), device, ENTROPY_BETA, args.bf16
                        )
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        grad_norm = torch.nn.utils.clip_grad_norm_(params, CLIP_GRAD)
                        optimizer.step()
                        scheduler.step()
                        progress.train_steps += 1
                        ready, ready_boot = [], []
                        m["losses/grad_norm"] = grad_norm.item()
                        last_metrics = m
                        for k, v in m.items():
                            tracker.track(k, v, progress.step)
                waiting = None

                st = env.step(actions)
                rewards = np.sign(st.rewards) if clip_rewards else st.rewards
                waiting = collector.add(
                    obs, actions, rewards, st.terminated, st.truncated, st.obs, st.final_obs
                )
                obs = st.obs
                progress.step += args.envs

                game_score += st.true_rewards
                game_len += 1
                if st.pred_rewards is not None:
                    game_pred += st.pred_rewards
                for i in np.flatnonzero(st.game_over):
                    progress.games += 1
                    recent_scores.append(float(game_score[i]))
                    writer.add_scalar("charts/episode_score", game_score[i], progress.step)
                    writer.add_scalar("charts/episode_length", game_len[i], progress.step)
                    if st.pred_rewards is not None:
                        writer.add_scalar("reward_model/episode_pred_return", game_pred[i], progress.step)
                        recent_pairs.append((float(game_score[i]), float(game_pred[i])))
                    game_score[i] = game_pred[i] = 0.0
                    game_len[i] = 0
                recent_scores = recent_scores[-100:]
                recent_pairs = recent_pairs[-100:]

                now = time.time()
                if now - t_last >= 10.0:
                    sps = (progress.step - step_last) / (now - t_last)
                    writer.add_scalar("charts/steps_per_sec", sps, progress.step)
                    writer.add_scalar("charts/lr", scheduler.get_last_lr()[0], progress.step)
                    if recorder is not None:
                        writer.add_scalar("recorder/segments", recorder.segments_written, progress.step)
                    if args.reward:
                        for k, v in env.stats().items():
                            writer.add_scalar(f"reward_model/{k}", v, progress.step)
                        if len(recent_pairs) >= 3:
                            tr, pr = np.array(recent_pairs).T
                            if tr.std() > 0 and pr.std() > 0:
                                # Reward-hacking monitor: does the learned return still track the score?
                                corr = float(np.corrcoef(tr, pr)[0, 1])
                                writer.add_scalar("reward_model/true_vs_pred_corr", corr, progress.step)
                    line = f"step {progress.step:>11,} | {sps:6,.0f} steps/s"
                    if recent_scores:
                        line += f" | games {progress.games:,}, score(last {len(recent_scores)}) {np.mean(recent_scores):7.1f}"
                    if last_metrics:
                        line += f" | loss {last_metrics['losses/total']:.3f} ent {last_metrics['losses/entropy']:.2f}"
                    if recorder is not None:
                        line += f" | segments {recorder.segments_written:,}"
                    if args.max_steps:
                        rate = (progress.step - start_step) / max(now - t_start - eval_seconds, 1e-6)
                        eta = (args.max_steps - progress.step) / max(rate, 1e-6)
                        line += f" | ETA {_fmt_time(eta)}"
                    print(line, flush=True)
                    t_last, step_last = now, progress.step

                if next_test is not None and progress.step >= next_test:
                    next_test += args.test_every
                    t0 = time.time()
                    res = evaluate(net, eval_env, device, stopper.flag, args.bf16)
                    eval_seconds += time.time() - t0
                    t_last = time.time()
                    step_last = progress.step
                    if res is None:
                        continue
                    for k, v in res.items():
                        writer.add_scalar(f"eval/{k}", v, progress.step)
                    msg = (
                        f"eval at {progress.step:,}: score {res['score_mean']:.1f} ± {res['score_std']:.1f} "
                        f"(max {res['score_max']:.0f}), length {res['length_mean']:.0f} [{time.time() - t0:.1f}s]"
                    )
                    if res["score_mean"] > progress.best_mean:
                        progress.best_mean = res["score_mean"]
                        name = f"best_{progress.step:09d}_score{res['score_mean']:.1f}_len{res['length_mean']:.0f}.pt"
                        save(save_dir / name, metrics=res)
                        if recorder is not None:
                            recorder.checkpoint = str(save_dir / name)
                        msg += f" -> new best, saved {save_dir / name}"
                    print(msg, flush=True)
                    save_last()
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            if recorder is not None:
                recorder.close()
                for e in recorder.writer.errors[:3]:
                    print(f"warning: {e}", file=sys.stderr)
            else:
                env.close()
            if eval_env is not None:
                eval_env.close()
            save_last()
            tracker.flush()
            writer.close()

    elapsed = time.time() - t_start
    print(
        f"{status} at step {progress.step:,} after {_fmt_time(elapsed)} "
        f"({(progress.step - start_step) / max(elapsed, 1e-6):,.0f} steps/s incl. evaluation)",
        flush=True,
    )
    print(
        f"  checkpoints: {save_dir}/ (last.pt for --resume"
        + (", best_*.pt by eval score)" if args.test_every else ")")
    )
    if recorder is not None:
        print(f"  segments:    {args.db_path} ({recorder.segments_written} written this run)")
    print(f"  TensorBoard: {tb_dir}")
    if recorder is not None and recorder.segments_written:
        print(f"next: label them with  python 02_label_ui.py -d {args.db_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return train(args)
