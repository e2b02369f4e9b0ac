"""A run of stage 1 and its files: the checks before anything is written (``check_run``), the run's
state (``Run``, built by ``build_run``), game statistics, evaluation and checkpoints. The loss,
learner and loop that use it are in ``lib/a2c/train.py``."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from lib.a2c.config import (
    ADAM_EPS,
    BATCH_SIZE,
    FINETUNE_LEARNING_RATE,
    LEARNING_RATE,
    LR_DECAY_STEPS,
    MAX_RECORD_ENVS,
    MAX_STEP_COUNT,
    A2CConfig,
    kl_beta,
    learned_with,
    resumed_config,
)
from lib.a2c.distributed import Dist, NullWriter
from lib.a2c.recorder import EpisodeRecorderWrapper
from lib.atari.behaviour import behaviour_observers, behaviour_stats, format_behaviour
from lib.atari.envs import VecStep, default_env_threads, rom_name
from lib.atari.games import play_games, score_stats, select_actions
from lib.atari.saved_states import vec_env
from lib.core.errors import UserError
from lib.core.files import LockHeld, file_state, hold_lock
from lib.core.settings import EVAL_SEED_OFFSET
from lib.core.stats import StepCorrelation, pearson
from lib.core.tb import hparams_table, run_dir
from lib.models.policy import (
    AtariA2C,
    StartPolicy,
    best_checkpoint_name,
    load_policy,
    policy_checkpoint,
    remove_run_checkpoints,
    resolve_device,
    run_checkpoints,
)
from lib.store.checkpoints import (
    atomic_torch_save,
    check_ck_fields,
    checked_adam_state,
    float_in,
    int_in,
    is_bool,
    is_dict,
    list_of,
    optional,
    read_checkpoint,
    state_is_finite,
    text,
)
from lib.store.segment_writer import check_db_game
from lib.store.segments import MAX_ENV_STEP
from lib.store.states import start_states

if TYPE_CHECKING:
    from lib.a2c.reward_env import RewardSource

FUSED_ADAM_DEVICES = ("cpu", "cuda")  # where torch has a fused Adam (the learner's optimiser)

# How the run reports.
RECENT_GAMES = 100  # the console's running mean score is over this many finished games


def autocast(device: torch.device, enabled: bool) -> torch.autocast:
    """bfloat16 autocast for the forward passes (--precision bf16); a no-op context when disabled."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of a CPU that computes bf16 itself


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes bfloat16 in hardware (AVX512-BF16 or AMX), from ``/proc/cpuinfo``'s
    flags (``cpuinfo``: that text; None reads it; no file counts as no). Else torch emulates bf16."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[-1].split()}
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def resolve_precision(precision: str, device: torch.device, cpuinfo: str | None = None) -> str:
    """--precision as run: "fp32" or "bf16"; "auto" is bf16 on a CPU with native bf16
    (``cpu_has_native_bf16``) or a CUDA device that supports it, fp32 anywhere else."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_native_bf16(cpuinfo) else "fp32"
    return "fp32"


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


def _make_dirs(dirs: list[tuple[Path, str]]) -> None:
    """Make each directory in order. Where one cannot be made (a path the writable check passes,
    such as one under /proc), remove the ones this call made and raise: a failed run leaves none
    behind."""
    made: list[Path] = []
    try:
        for path, what in dirs:
            missing = [p for p in (path, *path.parents) if not p.exists()]
            _make_dir(path, what)
            made += reversed(missing)
    except UserError:
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def _run_dirs(cfg: A2CConfig) -> list[tuple[Path, str]]:
    """What a run writes into, in the order it is made: TensorBoard, checkpoints, the DB."""
    dirs = [(Path(cfg.runs_dir), "TensorBoard dir"), (cfg.save_dir, "checkpoint dir")]
    return dirs + ([(Path(cfg.db_path), "DB dir")] if cfg.db_path else [])


def _finite_or_minus_inf(v: Any) -> None:
    """best_mean: a number; -inf before the first evaluation."""
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v == math.inf:
        raise ValueError(f"must be a number or -inf, got {str(v)[:40]!r}")


RESUME_FIELDS: dict[str, tuple[Any, bool]] = {  # besides the dicts progress, optimizer, scheduler
    "lr": (float_in(0, 1, lo_open=True), False),
    "lr_decay_steps": (int_in(1, MAX_STEP_COUNT), False),
    "env_steps": (optional(list_of(int_in(0, MAX_ENV_STEP), max_len=4096)), False),
    "tb_dir": (optional(text(4096)), False),
    "kl_start": (optional(is_dict), False),
    "kl": (optional(float_in(0, 1e6)), False),
    "kl_coef": (optional(float_in(0, 1e6)), False),
    "finetune": (is_bool, False),
    "settings": (optional(is_dict), False),  # how it learns (lib.a2c.config.LEARNED_WITH); none before the record
    "reward_source": (optional(text(200)), False),  # what went through -r's path (paid_from)
}
PROGRESS_FIELDS: dict[str, tuple[Any, bool]] = {
    "step": (int_in(0, MAX_STEP_COUNT), True),
    "train_steps": (int_in(0, MAX_STEP_COUNT), True),
    "best_mean": (_finite_or_minus_inf, True),
    "games": (int_in(0, MAX_STEP_COUNT), True),
}


# --reward-oracle, before it moved to the lab, recorded itself among the settings: such a last.pt was
# paid what the lab's oracle source pays, and resumes only through it
ORACLE_SOURCE = "the true score (experiments.lab_a2c --reward-oracle)"


def paid_from(ck: dict[str, Any]) -> str | None:
    """What a checkpoint's run sent through -r's path in place of the model's prediction (a reward
    source's name, ``Hooks.reward_source``); None: the model's own predictions."""
    source = ck.get("reward_source")
    if isinstance(source, str):
        return source
    settings = ck.get("settings")
    return ORACLE_SOURCE if isinstance(settings, dict) and settings.get("reward_oracle") is True else None


def check_same_source(ck: dict[str, Any], hooks: Hooks, path: Path) -> None:
    """--resume goes on paid as the run was: one line where ``hooks`` would send another source (or
    none) through -r's path than ``ck``'s run did."""
    had, given = paid_from(ck), hooks.reward_source.name if hooks.reward_source else None
    if had != given:
        what = {None: "-r's predictions"}
        raise UserError(
            f"--resume: {path} was paid {what.get(had, had)} through -r's path, this run would be paid "
            f"{what.get(given, given)}: resume it the way it ran, or start a new run from it with -m {path} -n NEW"
        )


def _check_resumable(ck: dict[str, Any], path: Path) -> None:
    """--resume needs what only ``last.pt`` holds: optimizer, scheduler and counters, each of the
    right type and range (a handed-over file is not trusted: one line for anything else)."""
    if not all(isinstance(ck.get(k), dict) for k in ("progress", "optimizer", "scheduler")):
        raise UserError(
            f"{path} is not a resumable checkpoint (no optimizer state or step counters; a copied "
            f"best_*.pt?): start a new run from it with -m {path}"
        )
    check_ck_fields(ck, RESUME_FIELDS, f"checkpoint {path}")
    check_ck_fields(ck["progress"], PROGRESS_FIELDS, f"checkpoint {path} progress")


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


def _holds_a_run(cfg: A2CConfig) -> UserError:
    return UserError(
        f"{cfg.save_dir} already holds the run {cfg.name!r}: continue it with --resume, start it over "
        f"with --force (replaces its checkpoints), or pick another -n"
    )


RUN_LOCK = ".run.lock"  # in a checkpoint dir: held by the live run that writes into it


def _hold_save_dir(cfg: A2CConfig, last_seen: tuple[int, int, int] | None, held: list[int]) -> None:
    """Hold the run's checkpoint dir (``<dir>/.run.lock``, ``lib.core.files.hold_lock``, as the one
    recorder of a DB holds the DB) and add the descriptor to ``held``; nothing if held already. One
    live run per directory: a second, new, --resume or --force, would write its last.pt and best_*.pt
    over the first's. Under the lock, what ``check_run`` saw must still be so: the last.pt a resumed
    run read (``last_seen``, ``lib.core.files.file_state``) is the one there, a new run's dir holds no
    checkpoint. UserError with one line naming the holder otherwise."""
    if held:
        return
    try:
        fd = hold_lock(cfg.save_dir / RUN_LOCK)
    except LockHeld as e:
        raise UserError(
            f"{cfg.save_dir} is in use by another run ({e.holder}): wait until it ends, or pick another -n"
        ) from None
    except OSError as e:
        raise UserError(f"cannot lock checkpoint dir {cfg.save_dir}: {e.strerror or e}") from None
    try:
        last = cfg.save_dir / "last.pt"
        if cfg.resume and file_state(last) != last_seen:
            raise UserError(f"{last} was replaced while this run started (by a run of it that just ended?): run again")
        if not cfg.resume and not cfg.force and any(cfg.save_dir.glob("*.pt")):
            raise _holds_a_run(cfg)
    except BaseException:
        os.close(fd)
        raise
    held.append(fd)


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
        raise _holds_a_run(cfg)
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


class StepMarks(Protocol):
    """Marks the steps a readout wants apart, by the frames (N, H, W, 3) their actions are chosen on:
    a fine-tune logs its KL to the start policy on the marked steps as ``finetune/kl_<name>``
    (``experiments.lab_a2c`` marks SeaQuest's low-gauge steps)."""

    name: str

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        """(N,) bool, one per env."""
        ...


@dataclass(frozen=True)
class Hooks:
    """Where an experiment reaches into stage 1, beside ``train``'s ``make_env`` (as SB3's callbacks
    do): the product carries no flag or readout that only an experiment uses. ``reward_source``:
    what goes through -r's path in place of the model's prediction; ``marks``: steps whose KL is
    logged apart."""

    reward_source: RewardSource | None = None
    marks: StepMarks | None = None


@dataclass(kw_only=True)
class Run:
    """What a training run is made of (``build_run``) and how it saves itself; built by name only."""

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
    start: StartPolicy | None = None  # a fine-tune's start policy (--kl, finetune/kl_to_start)
    kl_coef: float = 0.0  # the KL coefficient in use: --kl, or where --kl-target has moved it
    dir_lock: int | None = None  # rank 0 holds the checkpoint dir while it runs (``_hold_save_dir``)
    hooks: Hooks = field(default_factory=Hooks)  # what an experiment reaches in with

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
            precision=self.cfg.precision,
            reward_path=paid.record() if (paid := self.cfg.reward_path()) is not None else None,
            reward_source=self.hooks.reward_source.name if self.hooks.reward_source else None,
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
            kl_start=self.start.state_dict() if self.start is not None else None,
            kl=self.cfg.kl,
            kl_coef=self.kl_coef,
            settings=learned_with(self.cfg),
        )

    def release(self) -> None:
        """Let another run have the checkpoint dir: once the last last.pt is written."""
        if self.dir_lock is not None:
            os.close(self.dir_lock)  # closing the descriptor releases the flock
            self.dir_lock = None

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
    source: RewardSource | None = None,
) -> tuple[Any, EpisodeRecorderWrapper | None]:
    """The env the learner steps, wrapper by wrapper. Order matters: the recorder sees the game's
    own frames and true reward; the reward model then replaces the reward the learner gets (or
    ``source``'s values through its path: ``Hooks.reward_source``)."""
    dist = dist or Dist()
    env, recorder = base_env, None  # AtariVec: DeepMind set-up, 84x84 grey 4-stack + RGB frames
    reward_env = None
    if cfg.reward:
        from lib.a2c.reward_env import RewardModelWrapper

        # loaded and checked first, around the game itself, so that a broken -r leaves no DB
        # behind; the recorder goes in between below
        reward_env = RewardModelWrapper(
            base_env,
            cfg.reward,
            device=device,
            path=cfg.reward_path(),
            reload=cfg.reward_reload,
            verbose=dist.is_main,
            source=source,
        )
    if cfg.db_path:
        counters = (resume_ck or {}).get("env_steps")
        if counters is not None and (len(counters) != cfg.envs or dist.active):
            counters = None  # another --envs, or ranks (last.pt has rank 0's): the env's own files tell
        # the first write of a run that records: its directories together (rank 0), after every check
        _make_dirs(_run_dirs(cfg) if dist.is_main else [(Path(cfg.db_path), "DB dir")])
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
    if reward_env is not None:
        reward_env.env = env  # the recorder sees the game's own frames and true reward
        env = reward_env
    return env, recorder


def note_reward_versions(reward_env: Any, writer: Any, progress: Progress, recorder: Any | None) -> None:
    """Note which reward model version the learner uses, now and at each --reward-reload switch: the
    scalar ``reward_model/version``, a ``reward_model/switches`` text line per switch, and
    ``reward_version`` in the ``meta`` of each segment recorded from then on."""

    def note(version: int, path: str | None) -> None:
        writer.add_scalar("reward_model/version", version, progress.step)
        if path is not None:
            line = f"step {progress.step:,}: switched to v{version} ({path})"
            writer.add_text("reward_model/switches", line, progress.step)
        if recorder is not None:
            recorder.meta["reward_version"] = version

    note(reward_env.version, None)
    reward_env.on_switch = note


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


def lr_schedule_steps(cfg: A2CConfig) -> int:
    """Agent steps a new run's lr decays over (what its last.pt records as ``lr_decay_steps``)."""
    return cfg.lr_decay_steps or cfg.max_steps or LR_DECAY_STEPS


def _optimiser(
    cfg: A2CConfig,
    net: AtariA2C,
    finetune: bool,
    resume_ck: dict[str, Any] | None,
    say: Callable[[str], None] = print,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, float, int]:
    """Adam over the trainable parameters (the book's betas and eps) with the book's linear decay to
    0, counted in learner steps of BATCH_SIZE transitions. A resumed run continues its own moments
    and its own schedule (the lr and length its last.pt records, at its update count); Adam's other
    settings are always this run's, never the file's: only the checked moments and step are loaded.
    ``say``: where a new schedule of a resumed run is announced."""
    ck = resume_ck or {}
    lr = ck.get("lr", cfg.lr or (FINETUNE_LEARNING_RATE if finetune else LEARNING_RATE))
    decay_steps = ck.get("lr_decay_steps", lr_schedule_steps(cfg))
    params = [p for p in net.parameters() if p.requires_grad]
    # One fused kernel for all parameters: 6x faster than torch's default per-tensor loop on CPU
    # (docs/benchmarks.md); the same update, the same state_dict.
    fused = params[0].device.type in FUSED_ADAM_DEVICES
    optimizer = torch.optim.Adam(params, lr=lr, eps=ADAM_EPS, fused=fused)
    updates = 0
    if resume_ck is not None:
        path = cfg.save_dir / "last.pt"
        state, updates = checked_adam_state(resume_ck["optimizer"], params, f"checkpoint {path}")
        counted = resume_ck.get("progress", {}).get("train_steps", updates)
        if updates != counted:
            raise UserError(
                f"checkpoint {path}: its optimizer has taken {updates:,} steps but its counters say {counted:,}: "
                "not one run's state"
            )
        # this run's param groups (betas, eps, fused, ...) with the file's checked moments
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
        step = resume_ck.get("progress", {}).get("step", 0)
        decay_steps = _schedule_to_continue(cfg, path, lr, decay_steps, updates, step, say)
    decay_iters = max(1, decay_steps // BATCH_SIZE)
    for group in optimizer.param_groups:
        group["initial_lr"] = lr  # what LambdaLR scales; it requires it to start at an update other than 0
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: max(0.0, 1.0 - it / decay_iters), last_epoch=updates - 1
    )
    return optimizer, scheduler, lr, decay_steps


def _schedule_to_continue(
    cfg: A2CConfig, path: Path, lr: float, decay_steps: int, updates: int, step: int, say: Callable[[str], None]
) -> int:
    """The agent steps a resumed run's lr decays over: its own (``decay_steps``, from last.pt), or a
    new length, said in one line, where --lr-decay-steps gives one or where its own has ended (the lr
    is 0) and --max-steps goes beyond it. Refused where the lr would be 0 with nothing to decay over."""
    ended = updates >= max(1, decay_steps // BATCH_SIZE)
    if cfg.lr_decay_steps and cfg.lr_decay_steps != decay_steps:
        new, flag = cfg.lr_decay_steps, "--lr-decay-steps"
    elif ended and cfg.max_steps > step:
        new, flag = cfg.max_steps, "--max-steps"
    elif ended:
        raise UserError(
            f"--resume: {path} is at step {step:,}, the end of its lr schedule ({decay_steps:,} agent steps), where "
            f"the lr is 0: give --max-steps beyond {step:,} (its lr then decays to 0 there), or start a new run "
            f"from it with -m {path} -n NEW"
        )
    else:
        return decay_steps
    left = 1.0 - updates / max(1, new // BATCH_SIZE)
    if left <= 0:
        raise UserError(f"--resume: {flag} {new:,} ends the lr schedule before step {step:,}, where {path} is")
    had = f"its own ended at {decay_steps:,}" if ended else f"its own ran to {decay_steps:,}"
    say(f"--resume: the lr decays to 0 at step {new:,} ({flag}; {had}): lr {lr * left:.3g} at step {step:,}")
    return new


def _start_policy(cfg: A2CConfig, net: AtariA2C, resume_ck: dict[str, Any] | None) -> StartPolicy | None:
    """A fine-tune's start policy (--kl, finetune/kl_to_start): from -m, or the one last.pt kept."""
    start = None
    if resume_ck is not None and resume_ck.get("kl_start") is not None:
        start = StartPolicy(net, resume_ck["kl_start"])
    elif resume_ck is None and cfg.model:
        start = StartPolicy(net)
    if cfg.kl and start is None:
        raise UserError(f"--kl: {cfg.save_dir / 'last.pt'} keeps no start policy to pull toward (run it without --kl)")
    return start


def kl_coef_at_start(cfg: A2CConfig, resume_ck: dict[str, Any] | None) -> float:
    """The coefficient the first update uses: --kl (resolved), or with --kl-target where a resumed
    run's controller had moved it."""
    if cfg.kl_target is not None and resume_ck is not None and resume_ck.get("kl_coef") is not None:
        return float(resume_ck["kl_coef"])
    return float(cfg.kl or 0.0)


def env_threads(cfg: A2CConfig, dist: Dist) -> int:
    """--env-threads, or the cores this process may use shared among the ranks on this machine."""
    return cfg.env_threads or max(1, default_env_threads() // dist.local_world)


def _starts(cfg: A2CConfig, dist: Dist) -> dict[str, Any]:
    """``make_env``'s keyword for the training envs: with --start-states, ``starts=`` (the DB's
    states, each restored once here, and --start-share); without it, none."""
    if not cfg.start_states:
        return {}
    states = start_states(cfg.start_states)
    if dist.is_main:
        print(
            f"{len(states)} saved states from {cfg.start_states}; {cfg.start_share:.0%} of lives start from one",
            flush=True,
        )  # noqa: E501
    return {"starts": (states, cfg.start_share)}


def build_run(
    cfg: A2CConfig, make_env: Callable[..., Any] = vec_env, dist: Dist | None = None, hooks: Hooks | None = None
) -> Run:
    """Check, then build everything the loop needs. ``make_env(env_id, n_envs, seed=, num_threads=,
    device=)`` makes a vector env (``lib.atari.saved_states.vec_env``; tests pass a fake). Under torchrun
    this rank plays the global envs rank*envs ... with their own seeds; rank 0 alone evaluates and
    writes checkpoints and TensorBoard."""
    dist = dist or Dist()
    device = resolve_device(cfg.dev)
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.db_path and cfg.envs * dist.world > MAX_RECORD_ENVS:
        raise UserError(
            f"recording names env directories 00-{MAX_RECORD_ENVS - 1}: at most {MAX_RECORD_ENVS} envs over all "
            f"ranks with --db-path, got {cfg.envs * dist.world}"
        )
    game = rom_name(cfg.env)
    say = (lambda line: print(line, flush=True)) if dist.is_main else (lambda line: None)
    seen = file_state(cfg.save_dir / "last.pt")  # the last.pt check_run reads: the one a resumed run goes on from
    resume_ck = check_run(cfg)
    held: list[int] = []  # rank 0's lock of the checkpoint dir, once taken; released if the build fails
    hold = partial(_hold_save_dir, cfg, seen, held) if dist.is_main else (lambda: None)
    try:
        if cfg.save_dir.is_dir():
            hold()  # before a second run's --force removes, or its eval writes, anything of this one's
        return _assemble(cfg, resume_ck, make_env, dist, device, game, say, hold, held, hooks or Hooks())
    except BaseException:
        for fd in held:
            os.close(fd)
        raise


def _place_policy(net: AtariA2C, finetune: bool, device: torch.device, dist: Dist) -> None:
    """The policy as it trains: its conv layers frozen for a fine-tune, on ``device``, and every
    rank's weights rank 0's."""
    if finetune:
        net.freeze_conv()
    net.to(device)
    if device.type == "cpu":
        # oneDNN's convolutions run faster on NHWC: same values, other strides; checkpoints load
        # either way.
        net.conv.to(memory_format=torch.channels_last)
    dist.broadcast_module(net)


def _assemble(
    cfg: A2CConfig,
    resume_ck: dict[str, Any] | None,
    make_env: Callable[..., Any],
    dist: Dist,
    device: torch.device,
    game: str,
    say: Callable[[str], None],
    hold: Callable[[], None],
    held: list[int],
    hooks: Hooks,
) -> Run:
    """``build_run``'s second half, once the files are checked: the settings a resumed run goes on
    with, the envs, the policy, the optimiser and TensorBoard. ``hold()`` takes rank 0's lock of the
    checkpoint dir (into ``held``) once that directory exists."""
    if resume_ck is not None:
        cfg = resumed_config(cfg, resume_ck, cfg.save_dir / "last.pt", say)
        check_same_source(resume_ck, hooks, cfg.save_dir / "last.pt")
    dist.barrier()  # every rank has checked before any writes
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed if dist.rank == 0 else [cfg.seed, dist.rank])
    threads = env_threads(cfg, dist)
    offset = dist.rank * cfg.envs
    starts = _starts(cfg, dist)
    base_env = make_env(cfg.env, cfg.envs, seed=cfg.seed + offset, num_threads=threads, device=device, **starts)
    net, finetune, progress = _policy(cfg, resume_ck, base_env)
    _place_policy(net, finetune, device, dist)
    start = _start_policy(cfg, net, resume_ck)
    cfg = replace(cfg, kl=kl_beta(cfg, start is not None, resume_ck))
    env, recorder = make_env_stack(cfg, base_env, device, rng, resume_ck, dist, hooks.reward_source)
    eval_env = None
    if cfg.test_every and dist.is_main:
        seed = cfg.seed + EVAL_SEED_OFFSET
        eval_env = make_env(cfg.env, cfg.test_episodes, seed=seed, num_threads=threads, device=device)
    optimizer, scheduler, lr, decay_steps = _optimiser(cfg, net, finetune, resume_ck, say)

    writer: Any = NullWriter()
    tb_dir = Path(cfg.runs_dir)
    if dist.is_main:
        _make_dirs(_run_dirs(cfg))  # made already where the run records (make_env_stack)
        hold()  # a new directory: held from now on, before anything is written into it
        if cfg.force and (n := remove_run_checkpoints(cfg.save_dir)):  # -m DIR must not find the old run's best
            print(f"--force: removed the old run's {n} checkpoint(s) from {cfg.save_dir}", flush=True)
        extra = {"finetune": finetune, "n_actions": base_env.n_actions, "ranks": dist.world, "env_threads": threads}
        writer, tb_dir = _tensorboard(cfg, game, progress, resume_ck, lr, decay_steps, extra)
    if cfg.reward:
        note_reward_versions(env, writer, progress, recorder)
        if cfg.reward_reload and dist.is_main:
            print(f"reward model: v{env.version} ({cfg.reward}); --reward-reload switches to each new one", flush=True)
    return Run(
        cfg=cfg,
        device=device,
        game=game,
        base_env=base_env,
        env=env,
        recorder=recorder,
        eval_env=eval_env,
        net=net,
        finetune=finetune,
        optimizer=optimizer,
        scheduler=scheduler,
        lr=lr,
        decay_steps=decay_steps,
        progress=progress,
        writer=writer,
        tb_dir=tb_dir,
        resumed=resume_ck is not None,
        eval_rng=np.random.default_rng(cfg.seed + EVAL_SEED_OFFSET),
        dist=dist,
        start=start,
        kl_coef=kl_coef_at_start(cfg, resume_ck),
        dir_lock=held[0] if held else None,
        hooks=hooks,
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
            "lr_used": lr,
            "batch": BATCH_SIZE,
            "adam_eps": ADAM_EPS,
            "lr_decay_steps": decay_steps,
            "game": game,
            **extra,
        }
        writer.add_text("hyperparameters", hparams_table(settings))
    return writer, tb_dir


# --- game statistics and progress ---------------------------------------------------------------


class GameStats:
    """Whole games (all lives) of the training envs: true score, length, and with -r the reward
    model's predicted return, written to TensorBoard as each game ends."""

    def __init__(self, n_envs: int, finetune: bool = False) -> None:
        self.finetune = finetune  # a run from -m: finetune/score (and learned_return) per game
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
            if self.finetune:  # the over-optimisation picture: the proxy's return beside the true score
                writer.add_scalar("finetune/score", self.score[i], progress.step)
                if st.pred_rewards is not None:
                    writer.add_scalar("finetune/learned_return", self.pred[i], progress.step)
            self.score[i] = self.pred[i] = 0.0
            self.length[i] = 0

    def true_vs_pred_corr(self) -> float | None:
        """Reward-hacking monitor: does the learned return still track the score? (None: too few games)"""
        if len(self.recent_pairs) < 3:
            return None
        tr, pr = np.array(self.recent_pairs).T
        corr = pearson(tr, pr)
        return None if math.isnan(corr) else corr


# --- evaluation and checkpoints -----------------------------------------------------------------


def evaluate_policy(
    net: AtariA2C,
    env: Any,
    device: torch.device,
    stop: Callable[[], bool] | None = None,
    bf16: bool = False,
    rng: np.random.Generator | None = None,
) -> dict[str, float] | None:
    """Play one full game (all lives) in each env side by side with actions sampled from the
    policy (``lib.atari.games.play_games``, as 04_play.py plays). Returns score and length stats
    (unclipped game score, agent steps), or None if stopped by a signal."""
    rng = rng or np.random.default_rng()

    def policy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad(), autocast(device, bf16):
            return select_actions(net(torch.from_numpy(obs).to(device))[0], False, rng)

    net.eval()
    try:
        results = play_games(env, policy, env.n_envs, observers=behaviour_observers(env), stop=stop)
    finally:
        net.train()
    return None if results is None else {**score_stats(results), **behaviour_stats(results)}


def evaluate_and_save(run: Run, stop: Callable[[], bool]) -> float:
    """An evaluation, the eval/* scalars, a best_*.pt when the mean score is the best so far, and
    last.pt. Returns the seconds it took."""
    t0 = time.time()
    step = run.progress.step
    res = evaluate_policy(run.net, run.eval_env, run.device, stop, run.cfg.bf16, run.eval_rng)
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
