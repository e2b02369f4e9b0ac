"""A2C on Atari (the book's settings), optionally recording segments or learning a reward model.

Reads top to bottom as the roles of a run, as CleanRL's files read. SB3's names mean other things
here: ``train`` is the whole loop (SB3's ``learn``), ``Learner.learn`` is one gradient step (SB3's
``train``) and ``act_step`` acts in every env (a step of SB3's ``collect_rollouts``). In order:
the loss (the settings, ``A2CConfig``, are in ``lib/a2c_config.py``; the command line in
``lib/a2c_cli.py``), the checks that run before anything
is written (``check_run``), building the run (``build_run``: envs with the wrapper stack in one
place, nets, optimiser, resume), one learner step (``Learner``), game statistics (``GameStats``),
progress logging (``ProgressLog``), evaluation and checkpoints, and ``train``: the loop.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lib.a2c_config import (
    ADAM_EPS,
    BATCH_SIZE,
    CLIP_GRAD,
    ENTROPY_BETA,
    FINETUNE_LEARNING_RATE,
    GAMMA,
    LEARNING_RATE,
    LR_DECAY_STEPS,
    MAX_RECORD_ENVS,
    MAX_STEP_COUNT,
    REWARD_STEPS,
    A2CConfig,
)
from lib.behaviour import behaviour_observers, behaviour_stats, format_behaviour
from lib.checkpoints import (
    atomic_torch_save,
    check_fields,
    float_in,
    int_in,
    list_of,
    optional,
    read_checkpoint,
    state_is_finite,
    text,
)
from lib.distributed import Dist, NullWriter, env_uniforms
from lib.envs import AtariVec, VecStep, default_env_threads, rom_name
from lib.errors import UserError
from lib.experience import BOOT_FINAL, BOOT_NEXT, NStepCollector, Transitions
from lib.games import play_games, score_stats, select_actions
from lib.model import (
    AtariA2C,
    best_checkpoint_name,
    load_policy,
    policy_checkpoint,
    remove_run_checkpoints,
    resolve_device,
    run_checkpoints,
)
from lib.recorder import EpisodeRecorderWrapper
from lib.seeds import EVAL_SEED_OFFSET
from lib.segments import MAX_ENV_STEP, check_db_game
from lib.stats import StepCorrelation, pearson
from lib.tb import hparams_table, run_dir

# How the run reports.
LOG_PERIOD_S = 10.0  # a progress line and the charts/ scalars this often
RECENT_GAMES = 100  # the console's running mean score is over this many finished games
LOSS_MEAN_OF = 10  # losses/* in TensorBoard: the mean of this many learner steps


# --- the loss -----------------------------------------------------------------------------------


def a2c_loss(
    net: AtariA2C,
    batch: Transitions,
    boot_values: np.ndarray,
    device: torch.device,
    entropy_beta: float,
    bf16: bool = False,
    weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A2C loss on a batch of n-step transitions.

    target = returns + discount * V(s_boot) (boot_values are 0 where the episode terminated);
    boot_values: (B,) float32, computed without gradient. ``weight`` scales the returned loss (not
    the metrics): with K ranks, B / (all ranks' B), so the summed gradients are those of the mean
    over every rank's transitions.
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
    return loss * weight, metrics


def autocast(device: torch.device, enabled: bool) -> torch.autocast:
    """bfloat16 autocast for the forward passes (--bf16); a no-op context when disabled."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def act(
    net: AtariA2C, obs: np.ndarray, device: torch.device, bf16: bool, uniforms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One batched forward for all envs: (actions sampled from the policy, V(obs)).

    ``uniforms`` (N,) in [0, 1), one per env (``env_uniforms``): the action is the first whose
    cumulative probability exceeds it (inverse-CDF sampling). Actions and values come back to the
    host together: one device synchronisation per vector step."""
    with torch.no_grad(), autocast(device, bf16):
        logits, values = net(torch.from_numpy(obs).to(device, non_blocking=True))
        cum = F.softmax(logits.float(), dim=1).cumsum(dim=1)
        u = torch.from_numpy(uniforms).to(device, dtype=torch.float32)[:, None]
        actions = (cum < u).sum(dim=1).clamp_max(logits.shape[1] - 1)
        both = torch.stack([actions.float(), values.float()]).cpu().numpy()
    return both[0].astype(np.int64), both[1]


def _values(net: AtariA2C, obs: np.ndarray, device: torch.device, bf16: bool = False) -> np.ndarray:
    with torch.no_grad(), autocast(device, bf16):
        return net(torch.from_numpy(obs).to(device))[1].float().cpu().numpy()


class NonFiniteError(UserError):
    """The loss, a gradient or the weights went NaN/inf (a too-high --lr, a broken reward model):
    the run stops with one line and keeps the last finite checkpoint."""


# --- before anything is written -----------------------------------------------------------------


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


def _finite_or_minus_inf(v: Any) -> None:
    """best_mean: a number; -inf before the first evaluation."""
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v == math.inf:
        raise ValueError(f"must be a number or -inf, got {str(v)[:40]!r}")


RESUME_FIELDS: dict[str, tuple[Any, bool]] = {  # besides the dicts progress, optimizer, scheduler
    "lr": (float_in(0, 1, lo_open=True), False),
    "lr_decay_steps": (int_in(1, MAX_STEP_COUNT), False),
    "env_steps": (optional(list_of(int_in(0, MAX_ENV_STEP), max_len=4096)), False),
    "tb_dir": (optional(text(4096)), False),
}
PROGRESS_FIELDS: dict[str, tuple[Any, bool]] = {
    "step": (int_in(0, MAX_STEP_COUNT), True),
    "train_steps": (int_in(0, MAX_STEP_COUNT), True),
    "best_mean": (_finite_or_minus_inf, True),
    "games": (int_in(0, MAX_STEP_COUNT), True),
}


def _check_resumable(ck: dict[str, Any], path: Path) -> None:
    """--resume needs what only ``last.pt`` holds: optimizer, scheduler and counters, each of the
    right type and range (a handed-over file is not trusted: one line for anything else)."""
    if not all(isinstance(ck.get(k), dict) for k in ("progress", "optimizer", "scheduler")):
        raise UserError(
            f"{path} is not a resumable checkpoint (no optimizer state or step counters; a copied "
            f"best_*.pt?): start a new run from it with -m {path}"
        )
    check_fields(ck, RESUME_FIELDS, f"checkpoint {path}")
    check_fields(ck["progress"], PROGRESS_FIELDS, f"checkpoint {path} progress")


def _tb_dir_to_continue(cfg: A2CConfig, resume_ck: dict[str, Any]) -> Path | None:
    """The TensorBoard run a resumed run continues: the one its last.pt names, but only a run of
    this name directly under --runs-dir (a handed-over file does not choose where we write)."""
    raw = resume_ck.get("tb_dir")
    if not raw:
        return None
    tb = Path(raw)
    try:
        inside = tb.parent.resolve() == Path(cfg.runs_dir).resolve() and tb.name.startswith(f"{cfg.name}__")
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        print(f"warning: last.pt names TensorBoard run {str(raw)[:120]!r} outside --runs-dir: starting a new one")
        return None
    return tb


def check_run(cfg: A2CConfig) -> dict[str, Any] | None:
    """Everything about the files that can be wrong, before anything is written. Returns the
    ``last.pt`` dict to resume from (None for a new run)."""
    last_path = cfg.save_dir / "last.pt"
    resume_ck: dict[str, Any] | None = None
    if cfg.resume:
        if not last_path.exists():
            raise UserError(f"--resume: no {last_path} to resume from (start the run without --resume)")
        resume_ck = read_checkpoint(last_path, "checkpoint")
        _check_resumable(resume_ck, last_path)
    elif not cfg.force and cfg.save_dir.is_dir() and any(cfg.save_dir.glob("*.pt")):
        raise UserError(
            f"{cfg.save_dir} already holds the run {cfg.name!r}: continue it with --resume, start it over "
            f"with --force (replaces its checkpoints), or pick another -n"
        )
    if cfg.force and cfg.model and Path(cfg.model).resolve() in {p.resolve() for p in run_checkpoints(cfg.save_dir)}:
        raise UserError(
            f"--force would remove {cfg.model}, the policy -m starts from: copy it out of {cfg.save_dir} first, "
            f"or pick another -n"
        )
    _check_writable_dir(cfg.save_dir, "checkpoint dir")
    _check_writable_dir(Path(cfg.runs_dir), "TensorBoard dir")
    if cfg.db_path:
        _check_writable_dir(Path(cfg.db_path), "DB dir")
        check_db_game(cfg.db_path, cfg.env)
    return resume_ck


# --- building the run ---------------------------------------------------------------------------


@dataclass
class Progress:
    """Counters that survive --resume."""

    step: int = 0
    train_steps: int = 0
    best_mean: float = -math.inf
    games: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "step": self.step,
            "train_steps": self.train_steps,
            "best_mean": self.best_mean,
            "games": self.games,
        }


@dataclass
class Run:
    """What a training run is made of (``build_run``) and how it saves itself."""

    cfg: A2CConfig
    device: torch.device
    game: str
    base_env: Any  # AtariVec: the game itself
    env: Any  # base_env with the wrapper stack (``make_env_stack``)
    recorder: EpisodeRecorderWrapper | None
    eval_env: Any | None
    net: AtariA2C
    finetune: bool
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    lr: float
    decay_steps: int
    progress: Progress
    writer: Any  # TensorBoard SummaryWriter
    tb_dir: Path
    resumed: bool
    eval_rng: np.random.Generator = field(default_factory=np.random.default_rng)
    dist: Dist = field(default_factory=Dist)

    @property
    def global_envs(self) -> int:
        """Envs over all ranks: what one vector step adds to the step counter."""
        return self.cfg.envs * self.dist.world

    @property
    def env_ids(self) -> np.ndarray:
        """(envs,) global indices of this rank's envs."""
        return self.dist.rank * self.cfg.envs + np.arange(self.cfg.envs)

    def save(self, path: Path, **extra: Any) -> None:
        """Rank 0 writes; the weights must be finite (a NaN never replaces a good file)."""
        if not self.dist.is_main:
            return
        if not state_is_finite(self.net.state_dict()):
            raise NonFiniteError(f"the policy's weights are not finite: {path} not written")
        ck = policy_checkpoint(
            self.net,
            self.cfg.env,
            self.game,
            self.base_env.action_meanings,
            step=self.progress.step,
            finetune=self.finetune,
            **extra,
        )
        atomic_torch_save(ck, path)

    def save_last(self) -> None:
        """``last.pt``: what --resume needs besides the weights."""
        self.save(
            self.cfg.save_dir / "last.pt",
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            lr=self.lr,
            lr_decay_steps=self.decay_steps,
            progress=self.progress.as_dict(),
            env_steps=self.recorder.env_steps.tolist() if self.recorder else None,
            tb_dir=str(self.tb_dir),
        )

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()  # writes the queued segments; closes the env below it
            for e in self.recorder.writer.errors[:3]:
                print(f"warning: {e}", file=sys.stderr)
        else:
            self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


def make_env_stack(
    cfg: A2CConfig,
    base_env: Any,
    device: torch.device,
    rng: np.random.Generator,
    resume_ck: dict[str, Any] | None,
    dist: Dist | None = None,
) -> tuple[Any, EpisodeRecorderWrapper | None]:
    """The env the learner steps, wrapper by wrapper. Order matters: the recorder sees the game's
    own frames and true reward; the reward model then replaces the reward the learner gets."""
    dist = dist or Dist()
    env, recorder = base_env, None  # AtariVec: DeepMind set-up, 84x84 grey 4-stack + RGB frames
    if cfg.db_path:
        counters = (resume_ck or {}).get("env_steps")
        if counters is not None and (len(counters) != cfg.envs or dist.active):
            counters = None  # another --envs, or ranks (last.pt has rank 0's): the env's own files tell
        _make_dir(Path(cfg.db_path), "DB dir")
        checkpoint = str(cfg.model) if cfg.model else None
        if not dist.is_main:
            dist.barrier()  # rank 0 first: it takes the DB's recorder lock and writes db.json
        env = recorder = EpisodeRecorderWrapper(
            env,
            cfg.db_path,
            cfg.record_prob,
            cfg.segment_steps,
            rng=rng,
            step_counters=counters,
            checkpoint=checkpoint,
            index_offset=dist.rank * cfg.envs,
            lock=dist.is_main,
        )
        if dist.is_main:
            dist.barrier()
    if cfg.reward:
        from lib.reward_wrapper import RewardModelWrapper

        env = RewardModelWrapper(env, cfg.reward, device=device, penalty=cfg.reward_penalty)
    return env, recorder


def _policy(cfg: A2CConfig, resume_ck: dict[str, Any] | None, env: Any) -> tuple[AtariA2C, bool, Progress]:
    """The network to train (new, from -m, or from last.pt), whether its conv layers are frozen,
    and the counters to continue from."""
    game = rom_name(cfg.env)
    if resume_ck is not None:
        net, _ = load_policy(cfg.save_dir / "last.pt", cfg.env, game, env.obs_shape, env.n_actions, ck=resume_ck)
        progress = Progress(**{k: resume_ck["progress"][k] for k in ("step", "train_steps", "best_mean", "games")})
        return net, bool(resume_ck.get("finetune", False)), progress
    if cfg.model:
        net, _ = load_policy(cfg.model, cfg.env, game, env.obs_shape, env.n_actions)
        return net, cfg.finetune, Progress()
    return AtariA2C(env.obs_shape, env.n_actions), False, Progress()


def _optimiser(
    cfg: A2CConfig, net: AtariA2C, finetune: bool, resume_ck: dict[str, Any] | None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, float, int]:
    """Adam over the trainable parameters with the book's linear decay to 0 (counted in learner
    steps of BATCH_SIZE transitions); a resumed run continues its own lr, schedule and moments."""
    ck = resume_ck or {}
    lr = ck.get("lr", cfg.lr or (FINETUNE_LEARNING_RATE if finetune else LEARNING_RATE))
    decay_steps = ck.get("lr_decay_steps", cfg.lr_decay_steps or cfg.max_steps or LR_DECAY_STEPS)
    optimizer = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=lr, eps=ADAM_EPS)
    decay_iters = max(1, decay_steps // BATCH_SIZE)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: max(0.0, 1.0 - it / decay_iters))
    if resume_ck is not None:
        where = cfg.save_dir / "last.pt"
        try:
            optimizer.load_state_dict(resume_ck["optimizer"])
            scheduler.load_state_dict(resume_ck["scheduler"])
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError, AttributeError) as e:
            raise UserError(
                f"checkpoint {where}: its optimizer state does not fit this network ({str(e)[:80]})"
            ) from None
        if not all(state_is_finite(moments) for moments in optimizer.state.values()):
            raise UserError(f"checkpoint {where}: its optimizer state holds NaN or infinite values")
    return optimizer, scheduler, lr, decay_steps


def env_threads(cfg: A2CConfig, dist: Dist) -> int:
    """--env-threads, or the cores this process may use shared among the ranks on this machine."""
    return cfg.env_threads or max(1, default_env_threads() // dist.local_world)


def build_run(cfg: A2CConfig, make_env: Callable[..., Any] = AtariVec, dist: Dist | None = None) -> Run:
    """Check, then build everything the loop needs. ``make_env(env_id, n_envs, seed=, num_threads=,
    device=)`` makes a vector env (``AtariVec``; tests pass a small fake). Under torchrun (``dist``)
    this rank plays the global envs rank*envs ... with their own seeds; rank 0 alone evaluates and
    writes checkpoints and TensorBoard."""
    dist = dist or Dist()
    device = resolve_device(cfg.dev)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.db_path and cfg.envs * dist.world > MAX_RECORD_ENVS:
        raise UserError(
            f"recording names env directories 00-{MAX_RECORD_ENVS - 1}: at most {MAX_RECORD_ENVS} envs over all "
            f"ranks with --db-path, got {cfg.envs * dist.world}"
        )
    game = rom_name(cfg.env)
    resume_ck = check_run(cfg)
    dist.barrier()  # every rank has checked before any writes
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed if dist.rank == 0 else [cfg.seed, dist.rank])
    threads = env_threads(cfg, dist)
    offset = dist.rank * cfg.envs
    base_env = make_env(cfg.env, cfg.envs, seed=cfg.seed + offset, num_threads=threads, device=device)
    net, finetune, progress = _policy(cfg, resume_ck, base_env)
    if finetune:
        net.freeze_conv()
    net.to(device)
    if device.type == "cpu":
        # oneDNN's convolutions run faster on NHWC: the learner's forward + backward + Adam on 128
        # states took 68 -> 53 ms on 2 cores (Intel, AVX-512). Same values, other strides; the
        # checkpoints load either way.
        net.conv.to(memory_format=torch.channels_last)
    dist.broadcast_module(net)
    env, recorder = make_env_stack(cfg, base_env, device, rng, resume_ck, dist)
    eval_env = None
    if cfg.test_every and dist.is_main:
        seed = cfg.seed + EVAL_SEED_OFFSET
        eval_env = make_env(cfg.env, cfg.test_episodes, seed=seed, num_threads=threads, device=device)
    optimizer, scheduler, lr, decay_steps = _optimiser(cfg, net, finetune, resume_ck)

    writer: Any = NullWriter()
    tb_dir = Path(cfg.runs_dir)
    if dist.is_main:
        _make_dir(Path(cfg.runs_dir), "TensorBoard dir")  # first: /proc-like paths pass the writable check
        _make_dir(cfg.save_dir, "checkpoint dir")
        if cfg.force and (n := remove_run_checkpoints(cfg.save_dir)):  # -m DIR must not find the old run's best
            print(f"--force: removed the old run's {n} checkpoint(s) from {cfg.save_dir}", flush=True)
        extra = {"finetune": finetune, "n_actions": base_env.n_actions, "ranks": dist.world, "env_threads": threads}
        writer, tb_dir = _tensorboard(cfg, game, progress, resume_ck, lr, decay_steps, extra)
    return Run(
        cfg,
        device,
        game,
        base_env,
        env,
        recorder,
        eval_env,
        net,
        finetune,
        optimizer,
        scheduler,
        lr,
        decay_steps,
        progress,
        writer,
        tb_dir,
        resume_ck is not None,
        eval_rng=np.random.default_rng(cfg.seed + EVAL_SEED_OFFSET),
        dist=dist,
    )


def _tensorboard(
    cfg: A2CConfig,
    game: str,
    progress: Progress,
    resume_ck: dict[str, Any] | None,
    lr: float,
    decay_steps: int,
    extra: dict[str, Any],
) -> tuple[Any, Path]:
    """The run's SummaryWriter (a resumed run continues its own log) with the settings as a table."""
    from torch.utils.tensorboard import SummaryWriter

    tb_dir = _tb_dir_to_continue(cfg, resume_ck) if resume_ck is not None else None
    if tb_dir is None:
        tb_dir = run_dir(cfg.runs_dir, cfg.name, "a2c", game, cfg.seed)
    writer = SummaryWriter(str(tb_dir), purge_step=progress.step if resume_ck is not None else None)
    if resume_ck is None:
        settings = {
            **vars(cfg),
            "gamma": GAMMA,
            "lr_used": lr,
            "entropy_beta": ENTROPY_BETA,
            "batch": BATCH_SIZE,
            "reward_steps": REWARD_STEPS,
            "clip_grad": CLIP_GRAD,
            "adam_eps": ADAM_EPS,
            "lr_decay_steps": decay_steps,
            "game": game,
            **extra,
        }
        writer.add_text("hyperparameters", hparams_table(settings))
    return writer, tb_dir


# --- one learner step ---------------------------------------------------------------------------


class MeanTracker:
    """Averages noisy per-train-step scalars over ``every`` values before writing them to
    TensorBoard; ``flush()`` writes what is left (ptan's TBMeanTracker cannot, so a short run
    would log no loss at all)."""

    def __init__(self, writer: Any, every: int = LOSS_MEAN_OF):
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


class Learner:
    """Turns transitions into A2C updates, one per BATCH_SIZE transitions (over all ranks).

    The transitions a vector step completes bootstrap from V(obs after that step). The acting
    forward pass of the next step computes exactly those values, so ``learn`` takes them from
    there (``values``): the learner does one forward + backward per batch, not two forwards.

    Under torchrun each rank keeps its own transitions; one small all-reduce per vector step sums
    the ranks' counts (and their stop requests), so all ranks update on the same step, and the
    gradients are summed before the optimiser step (``Dist.sum_grads``)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.params = [p for p in run.net.parameters() if p.requires_grad]
        self.waiting: Transitions | None = None
        self.ready: list[Transitions] = []
        self.ready_boot: list[np.ndarray] = []
        self.metrics: dict[str, float] = {}
        self.tracker = MeanTracker(run.writer, every=LOSS_MEAN_OF)

    def learn(self, values: np.ndarray, stop: bool = False) -> bool:
        """Bootstrap the waiting transitions with ``values`` (V of the current obs, per env) and take
        an optimiser step when a batch is full. ``stop``: this process wants to stop (Ctrl-C);
        returns whether any rank does, so that all stop on the same step."""
        waiting, self.waiting = self.waiting, None
        run = self.run
        if waiting is not None and len(waiting):
            boot = np.zeros(len(waiting), dtype=np.float32)  # 0 where the episode terminated
            nxt = waiting.boot_mode == BOOT_NEXT
            boot[nxt] = values[waiting.env[nxt]]
            fin = waiting.boot_mode == BOOT_FINAL  # truncated: the episode's own last obs
            if fin.any():
                boot[fin] = _values(run.net, waiting.boot_obs[fin], run.device, run.cfg.bf16)
            self.ready.append(waiting)
            self.ready_boot.append(boot)
        local = sum(len(t) for t in self.ready)
        total, stops = run.dist.all_sum([float(local), float(stop)])
        if total >= BATCH_SIZE:
            self._update(local, total)
        return stops > 0

    def _update(self, local: int, total: float) -> None:
        run = self.run
        run.optimizer.zero_grad(set_to_none=False)  # a rank with nothing yet still adds zeros
        m: dict[str, float] = {}
        if local:
            batch, boot_all = Transitions.concat(self.ready), np.concatenate(self.ready_boot)
            self.ready, self.ready_boot = [], []
            weight = local * run.dist.world / total  # the mean over every rank's transitions
            loss, m = a2c_loss(run.net, batch, boot_all, run.device, ENTROPY_BETA, run.cfg.bf16, weight)
            loss.backward()
        run.dist.sum_grads(self.params)
        if run.dist.active:
            for p in self.params:
                p.grad.div_(run.dist.world)  # summed gradients of weighted means -> the global mean
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, CLIP_GRAD).item()
        if not math.isfinite(grad_norm) or any(not math.isfinite(v) for v in m.values()):
            raise NonFiniteError(
                f"non-finite loss or gradient at step {run.progress.step:,} (loss {m.get('losses/total', 'n/a')}, "
                f"grad norm {grad_norm}): stopped before the optimiser step; lower --lr or check the reward model"
            )
        m["losses/grad_norm"] = grad_norm
        run.optimizer.step()
        run.scheduler.step()
        run.progress.train_steps += 1
        self.metrics = m
        for k, v in m.items():
            self.tracker.track(k, v, run.progress.step)


# --- game statistics and progress ---------------------------------------------------------------


class GameStats:
    """Whole games (all lives) of the training envs: true score, length, and with -r the reward
    model's predicted return, written to TensorBoard as each game ends."""

    def __init__(self, n_envs: int) -> None:
        self.score = np.zeros(n_envs)
        self.pred = np.zeros(n_envs)
        self.length = np.zeros(n_envs, dtype=np.int64)
        self.recent: deque[float] = deque(maxlen=RECENT_GAMES)
        self.recent_pairs: deque[tuple[float, float]] = deque(maxlen=RECENT_GAMES)  # (true, predicted)
        self.step_corr = StepCorrelation()  # per-step predicted vs true reward since the last log line

    def update(self, st: VecStep, progress: Progress, writer: Any) -> None:
        self.score += st.true_rewards
        self.length += 1
        if st.pred_rewards is not None:
            # The learner's reward (normalised), not the raw prediction: Bradley-Terry leaves the
            # raw offset free, so a raw sum falls with a game's length whatever the model prefers.
            self.pred += st.rewards
            self.step_corr.add(st.pred_rewards, st.true_rewards)
        for i in np.flatnonzero(st.game_over):
            progress.games += 1
            self.recent.append(float(self.score[i]))
            writer.add_scalar("charts/episode_score", self.score[i], progress.step)
            writer.add_scalar("charts/episode_length", self.length[i], progress.step)
            if st.pred_rewards is not None:
                writer.add_scalar("reward_model/episode_pred_return", self.pred[i], progress.step)
                self.recent_pairs.append((float(self.score[i]), float(self.pred[i])))
            self.score[i] = self.pred[i] = 0.0
            self.length[i] = 0

    def true_vs_pred_corr(self) -> float | None:
        """Reward-hacking monitor: does the learned return still track the score? (None: too few games)"""
        if len(self.recent_pairs) < 3:
            return None
        tr, pr = np.array(self.recent_pairs).T
        corr = pearson(tr, pr)
        return None if math.isnan(corr) else corr


def _fmt_time(sec: float) -> str:
    sec = int(max(sec, 0))
    return f"{sec // 3600}:{sec % 3600 // 60:02d}:{sec % 60:02d}"


class ProgressLog:
    """Every LOG_PERIOD_S: one console line and the charts/, recorder/ and reward_model/ scalars.
    Evaluation time is left out of the speed and the ETA."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.t_start = self.t_last = time.time()
        self.start_step = self.step_last = run.progress.step
        self.eval_seconds = 0.0

    def skip(self, seconds: float) -> None:
        """``seconds`` of evaluation just passed: not training time."""
        self.eval_seconds += seconds
        self.t_last, self.step_last = time.time(), self.run.progress.step

    def tick(self, games: GameStats, learner: Learner) -> None:
        now, run = time.time(), self.run
        if now - self.t_last < LOG_PERIOD_S:
            return
        step, w = run.progress.step, run.writer
        sps = (step - self.step_last) / (now - self.t_last)
        w.add_scalar("charts/steps_per_sec", sps, step)
        w.add_scalar("charts/lr", run.scheduler.get_last_lr()[0], step)
        line = f"step {step:>11,} | {sps:6,.0f} steps/s"
        if games.recent:
            line += f" | games {run.progress.games:,}, score(last {len(games.recent)}) {np.mean(games.recent):7.1f}"
        if learner.metrics:
            line += f" | loss {learner.metrics['losses/total']:.3f} ent {learner.metrics['losses/entropy']:.2f}"
        if run.recorder is not None:
            w.add_scalar("recorder/segments", run.recorder.segments_written, step)
            line += f" | segments {run.recorder.segments_written:,}"
        if run.cfg.reward:
            for k, v in run.env.stats().items():
                w.add_scalar(f"reward_model/{k}", v, step)
            if (corr := games.true_vs_pred_corr()) is not None:
                w.add_scalar("reward_model/true_vs_pred_corr", corr, step)
            if (corr := games.step_corr.value()) is not None:
                w.add_scalar("reward_model/step_corr", corr, step)
                line += f" | step corr {corr:+.2f}"
            games.step_corr = StepCorrelation()
        if run.cfg.max_steps:
            rate = (step - self.start_step) / max(now - self.t_start - self.eval_seconds, 1e-6)
            line += f" | ETA {_fmt_time((run.cfg.max_steps - step) / max(rate, 1e-6))}"
        print(line, flush=True)
        self.t_last, self.step_last = now, step


# --- evaluation and checkpoints -----------------------------------------------------------------


def evaluate(
    net: AtariA2C,
    env: Any,
    device: torch.device,
    stop: list[bool] | None = None,
    bf16: bool = False,
    rng: np.random.Generator | None = None,
) -> dict[str, float] | None:
    """Play one full game (all lives) in each env side by side with actions sampled from the
    policy (``lib.games.play_games``, as 04_play.py plays). Returns score and length stats
    (unclipped game score, agent steps), or None if stopped by a signal."""
    rng = rng or np.random.default_rng()

    def policy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad(), autocast(device, bf16):
            return select_actions(net(torch.from_numpy(obs).to(device))[0], False, rng)

    net.eval()
    try:
        stopper = (lambda: stop[0]) if stop else None
        results = play_games(env, policy, env.n_envs, observers=behaviour_observers(env), stop=stopper)
    finally:
        net.train()
    return None if results is None else {**score_stats(results), **behaviour_stats(results)}


def evaluate_and_save(run: Run, stop: list[bool]) -> float:
    """An evaluation, the eval/* scalars, a best_*.pt when the mean score is the best so far, and
    last.pt. Returns the seconds it took."""
    t0 = time.time()
    step = run.progress.step
    res = evaluate(run.net, run.eval_env, run.device, stop, run.cfg.bf16, run.eval_rng)
    if res is None:  # stopped by Ctrl-C
        return time.time() - t0
    for k, v in res.items():
        run.writer.add_scalar(f"eval/{k}", v, step)
    msg = (
        f"eval at {step:,}: score {res['score_mean']:.1f} ± {res['score_std']:.1f} "
        f"(max {res['score_max']:.0f}), length {res['length_mean']:.0f} [{time.time() - t0:.1f}s]"
    )
    if behaviour := format_behaviour(res):
        msg += f", {behaviour}"
    if res["score_mean"] > run.progress.best_mean:
        run.progress.best_mean = res["score_mean"]
        path = run.cfg.save_dir / best_checkpoint_name(step, res["score_mean"], res["length_mean"])
        run.save(path, metrics=res)
        if run.recorder is not None:
            run.recorder.checkpoint = str(path)  # segments from now on name the policy that played them
        msg += f" -> new best, saved {path}"
    print(msg, flush=True)
    run.save_last()
    return time.time() - t0


# --- the loop -----------------------------------------------------------------------------------


class _Stopper:
    """Ctrl-C / SIGTERM set a flag; the loop finishes its step and shuts down cleanly."""

    def __init__(self, quiet: bool = False) -> None:
        self.flag = [False]
        self.quiet = quiet  # ranks other than 0 say nothing (torchrun sends the signal to all)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stopper:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.flag[0]:
            raise KeyboardInterrupt  # second Ctrl-C: stop waiting
        self.flag[0] = True
        if not self.quiet:
            print(f"\n{signal.Signals(signum).name}: finishing the current step and saving...", flush=True)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(cfg: A2CConfig, make_env: Callable[..., Any] = AtariVec, dist: Dist | None = None) -> int:
    """Train until --max-steps or Ctrl-C; evaluate and save along the way; report where things are.

    The env steps in its C++ threads while this thread works: as soon as a step's results are in
    (``step_wait``), the next actions are chosen and sent (``step_async``), and the n-step
    bookkeeping and the learner's update run while the env steps. The computations are those of
    act -> learn -> step in that order: the actions of a step are chosen before the update that
    its stepping overlaps, and the update bootstraps from the values of that same forward pass."""
    run = build_run(cfg, make_env, dist)
    if run.dist.is_main:
        announce(run)
    collector = NStepCollector(cfg.envs, run.base_env.obs_shape, REWARD_STEPS, GAMMA)
    learner, games, log = Learner(run), GameStats(cfg.envs), ProgressLog(run)
    clip = not cfg.reward  # the score is sign-clipped (DeepMind); a learned reward is scaled by its wrapper
    test_every = cfg.test_every
    next_test = (run.progress.step // test_every + 1) * test_every if test_every else None
    status, failure = "finished", None
    obs = run.env.reset()
    run.net.train()
    with _Stopper(quiet=not run.dist.is_main) as stopper:
        try:
            actions, values = act_step(run, obs)
            while True:
                st = run.env.step_wait()
                prev_obs, prev_actions, obs = obs, actions, st.obs
                run.progress.step += run.global_envs
                if next_test is not None and run.progress.step >= next_test:
                    next_test += test_every
                    if run.dist.is_main:
                        log.skip(evaluate_and_save(run, stopper.flag))
                done = bool(cfg.max_steps) and run.progress.step >= cfg.max_steps
                if not done:
                    actions, values = act_step(run, obs)  # the env steps from here while this thread works
                st.complete()  # a diff reward model's forward on this step (RewardModelWrapper)
                games.update(st, run.progress, run.writer)
                if run.dist.is_main:
                    log.tick(games, learner)
                rewards = np.sign(st.rewards) if clip else st.rewards
                learner.waiting = collector.add(
                    prev_obs, prev_actions, rewards, st.terminated, st.truncated, st.obs, st.final_obs
                )
                if done:
                    break
                if learner.learn(values, stopper.flag[0]):  # all ranks stop on the same step
                    run.env.step_wait()
                    status = "interrupted"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
        except NonFiniteError as e:
            status, failure = "stopped", e
        finally:
            run.close()
            if failure is None:
                run.save_last()
            learner.tracker.flush()
            run.writer.close()
    if run.dist.is_main:
        report(run, status, log)
    if failure is not None:
        raise failure
    return 0


def act_step(run: Run, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Choose this vector step's actions (per-env random streams: ``env_uniforms``), start the env
    stepping with them, and return (actions, V(obs))."""
    t = run.progress.step // run.global_envs
    u = env_uniforms(run.cfg.seed, run.env_ids, t)
    actions, values = act(run.net, obs, run.device, run.cfg.bf16, u)
    run.env.step_async(actions)
    return actions, values


def announce(run: Run) -> None:
    cfg = run.cfg
    print(
        f"A2C on {cfg.env} ({run.game}), {cfg.envs} envs, {run.base_env.n_actions} actions, device {run.device}"
        + (f", finetune from {cfg.model}" if run.finetune and cfg.model else "")
        + (f", resumed at step {run.progress.step:,}" if run.resumed else "")
        + (f", reward model {cfg.reward}" if cfg.reward else "")
        + (f" with penalty {cfg.reward_penalty:g} x ensemble std" if cfg.reward_penalty else "")
        + (f", recording into {cfg.db_path} (p={cfg.record_prob})" if cfg.db_path else ""),
        flush=True,
    )
    print(f"TensorBoard: tensorboard --logdir {cfg.runs_dir}   (this run: {run.tb_dir})", flush=True)


def report(run: Run, status: str, log: ProgressLog) -> None:
    cfg, step = run.cfg, run.progress.step
    elapsed = time.time() - log.t_start
    print(
        f"{status} at step {step:,} after {_fmt_time(elapsed)} "
        f"({(step - log.start_step) / max(elapsed, 1e-6):,.0f} steps/s incl. evaluation)",
        flush=True,
    )
    print(
        f"  checkpoints: {cfg.save_dir}/ (last.pt for --resume"
        + (", best_*.pt by eval score)" if cfg.test_every else ")")
    )
    if run.recorder is not None:
        failed = run.recorder.segments_failed
        lost = f", {failed} could not be written: see the warning above" if failed else ""
        print(f"  segments:    {cfg.db_path} ({run.recorder.segments_written} written this run{lost})")
    print(f"  TensorBoard: {run.tb_dir}")
    if run.recorder is not None and run.recorder.segments_written:
        print(f"next: label them with  python 02_label_ui.py -d {cfg.db_path}")
