"""RewardModelWrapper: the agent learns from a reward model instead of the game score (``01_a2c.py
-r``). Each agent step runs one batched forward for all envs while the env's threads step the games
(a diff model, which needs the frame a step led to, after the step). The learner's reward is the raw
prediction normalised (``--reward-norm``), clipped (``--reward-clip``) and scaled; ``pred_rewards``
keep the raw predictions and ``true_rewards`` the score. With ``reload`` a changed model file that
then held still is loaded, checked and swapped in between two steps, its norm restarted from its
stored stats, since Bradley-Terry leaves each model's offset free. A diff model's input is made
grey once a frame: each step's frames are those the step before led to. Why these choices:
docs/reference.md and docs/results.md."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from lib.atari.envs import VecStep, grey84
from lib.core.errors import UserError, warn
from lib.core.files import file_state
from lib.models.policy import resolve_device
from lib.models.reward import RewardPredictor, load_reward_model
from lib.models.reward_path import Norm, RewardPath, norm_prior
from lib.store.checkpoints import state_is_finite

RELOAD_POLL_S = 1.0  # --reward-reload: seconds between two looks (a stat) at the reward model file


def model_version(model: RewardPredictor, loaded: int) -> int:
    """A reward model's version: its checkpoint's ``metrics["version"]`` when an int >= 1
    (``--follow`` writes it), else ``loaded - 1``: 0 for a starting file that names none, so the
    follower's v1 is never taken for the model it replaces."""
    v = model.metrics.get("version")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else loaded - 1


class StepFrames:
    """The RGB frames (N, H, W, 3) of one vector step as the wrapper holds them for a diff model's
    forward, and their grey (``grey84``), made at the first ``grey()`` and kept: the frames a step
    led to are the frames the next step's actions are chosen on, so both forwards share one grey."""

    def __init__(self, rgb: np.ndarray):
        self.rgb = rgb
        self._grey: np.ndarray | None = None

    def grey(self) -> np.ndarray:
        """(N, 84, 84) uint8, the wrapper's own ``grey84`` (never the policy's stack: on CUDA that
        comes from ``TorchGrey84``, a grey level off, and the model would see other numbers)."""
        if self._grey is None:
            self._grey = grey84(self.rgb)
        return self._grey


class RewardSource(Protocol):
    """What goes through the reward path in place of the model's prediction: the hook an experiment
    gives ``lib.a2c.train.train`` (``experiments.lab_a2c``'s oracle arm sends the true score).
    ``name`` says what it is in one-line errors."""

    name: str

    def __call__(self, st: VecStep) -> np.ndarray:
        """(N,) the values of one finished step, one per env."""
        ...

    def stats(self, model: RewardPredictor) -> tuple[float, float] | None:
        """The (mean, std) ``--reward-norm labels`` fixes for these values (from ``model``'s
        checkpoint, say); None where there are none."""
        ...


class RewardModelWrapper:
    """A vector env whose ``rewards`` come from a reward model. It has AtariVec's interface (n_envs,
    game, env_id, n_actions, action_meanings, frames, reset, step, step_async/step_wait); any other
    attribute is the inner env's."""

    def __init__(
        self,
        env: Any,
        model_path: str | os.PathLike,
        device: torch.device | str = "cpu",
        path: RewardPath | None = None,
        infer_threads: int | None = 1,
        reload: bool = False,
        poll_s: float = RELOAD_POLL_S,
        verbose: bool = True,
        source: RewardSource | None = None,
    ):
        """``path``: how a raw prediction becomes the learner's reward (``lib.models.reward_path``;
        the default path where None). ``reload``: switch to each new good version of
        ``model_path``, looking at most every ``poll_s`` seconds; ``verbose``: print each switch.
        ``source``: what goes through the path in place of the model's prediction (an experiment's
        hook, ``RewardSource``); the model is still loaded and checked, and its stats serve."""
        self.env = env
        self.reward_path = path or RewardPath()
        self.source = source
        self.path = Path(model_path)
        self.device = resolve_device(device)
        self.reload, self.poll_s, self.verbose = reload, poll_s, verbose
        self._state = file_state(self.path)  # before reading: a change while it loads is seen later
        self._seen = self._state  # the state of the last look
        self._next_look = time.monotonic() + poll_s
        self.loaded = 1  # files loaded; a checkpoint that names no version is v(loaded - 1)
        self.on_switch: Callable[[int, str], None] | None = None  # (version, path) after each switch
        self._use(self._checked(self.path))
        self.infer_threads = infer_threads if self.model.device.type == "cpu" else None
        self._pending: torch.Tensor | None = None
        self._before: tuple[StepFrames, torch.Tensor] | None = None  # a diff model's step input
        self._last: dict[str, float] = {}
        self._infer_s = 0.0
        self._steps = 0

    def _checked(self, path: Path) -> RewardPredictor:
        """The reward model at ``path``, loaded safely and checked against what this wrapper needs;
        UserError with one line otherwise."""
        model = load_reward_model(path, game=self.env.game, n_actions=self.env.n_actions, device=self.device)
        frame_shape = tuple(np.shape(self.env.frames)[1:])
        if frame_shape != model.frame_shape:
            raise UserError(f"reward model {path} takes frames {model.frame_shape}, the env gives {frame_shape}")
        if not all(state_is_finite(net.state_dict()) for net in model.nets):
            raise UserError(f"reward model {path}: its weights (BatchNorm folded in) are not finite")
        if self.reward_path.norm == "labels" and self._stored_stats(model) is None:
            what = f"statistics of {self.source.name}" if self.source else "normalisation statistics"
            raise UserError(
                f"reward model {path} stores no {what} of its labelled clips (trained by an older stage 3, or on "
                f"a DB without true rewards): retrain it, or use --reward-norm running"
            )
        return model

    def _stored_stats(self, model: RewardPredictor) -> tuple[float, float] | None:
        """The fixed (mean, std) of ``--reward-norm labels``: the model's predictions over its
        labelled clips, or a source's own (``RewardSource.stats``)."""
        return self.source.stats(model) if self.source else norm_prior(model)

    def _use(self, model: RewardPredictor) -> None:
        """Learn from ``model`` from the next step on, its norm started afresh from its stored stats
        (a new model's offset is its own)."""
        self.model = model
        # the frames the last step led to (a diff model's, for the next step): none after a switch,
        # which the next step then copies and greys afresh
        self._shown: StepFrames | None = None
        self.version = model_version(model, self.loaded)
        # the model's stats say nothing of a source's values: its running norm starts with no prior
        stats = self._stored_stats(model) if self.reward_path.norm == "labels" or not self.source else None
        self.norm: Norm = self.reward_path.new_norm(self.env.n_envs, stats)  # labels: _checked made sure of stats

    def poll(self) -> bool:
        """--reward-reload: look at the file (at most every ``poll_s``) and switch to it when it has
        changed, held still since the last look, and loads and checks; a file that does not is
        skipped with one warning, until it changes again. Returns whether it switched."""
        now = time.monotonic()
        if not self.reload or now < self._next_look:
            return False
        self._next_look = now + self.poll_s
        state, seen = file_state(self.path), self._seen
        self._seen = state
        if state == self._state or state != seen:
            return False  # unchanged, or still changing: look again next time
        self._state = state  # this state is dealt with now, switched to or warned about once
        if state is None:
            warn(f"reward model {self.path} is gone: still learning from v{self.version}")
            return False
        try:
            model = self._checked(self.path)
        except UserError as e:
            warn(f"{e}; still learning from v{self.version}")
            return False
        if self.model.env_id and model.env_id and model.env_id != self.model.env_id:
            warn(
                f"reward model {self.path} was trained on {model.env_id}, v{self.version} on "
                f"{self.model.env_id}: still learning from v{self.version}"
            )
            return False
        if file_state(self.path) != state:
            return False  # replaced while it was read: the newer file is taken at a later look
        if model.same_as(self.model):
            return False  # the same model (a touch, the same bytes installed again): nothing to restart
        self.loaded += 1
        self._use(model)
        if self.verbose:
            print(f"reward model: switched to v{self.version} ({self.path})", flush=True)
        if self.on_switch is not None:
            self.on_switch(self.version, str(self.path))
        return True

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: forward them to the inner env.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def n_envs(self) -> int:
        return self.env.n_envs

    @property
    def game(self) -> str:
        return self.env.game

    @property
    def env_id(self) -> str:
        return self.env.env_id

    @property
    def n_actions(self) -> int:
        return self.env.n_actions

    @property
    def action_meanings(self) -> tuple[str, ...]:
        return self.env.action_meanings

    @property
    def frames(self) -> np.ndarray:
        return self.env.frames

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self._shown = None  # the env shows new games: no step led to their frames
        return self.env.reset(*args, **kwargs)

    def step_async(self, actions: np.ndarray) -> None:
        """Start the env step, then run the reward model on the frames the actions were taken on
        while the env's threads step (the input is copied before the env can replace ``frames``; a
        diff model's is held as the last step led to it where it can be, ``_frames_now``). With
        --reward-reload a new version is switched to first (``poll``), between two steps."""
        self.poll()
        t0 = time.perf_counter()
        acts = torch.from_numpy(np.asarray(actions, dtype=np.int64).copy())
        if self.source:
            self.env.step_async(actions)
            self._before = None
            self._pending = torch.empty(0)  # the source reads the step: step_wait asks it
            self._infer_s += time.perf_counter() - t0
            return
        if self.model.needs_next:
            # a diff model needs the frames the step leads to: its forward runs in step_wait
            self._before = (self._frames_now(), acts)
            self.env.step_async(actions)
            self._infer_s += time.perf_counter() - t0
            return
        frames = torch.from_numpy(np.array(self.env.frames, dtype=np.uint8, copy=True))
        self.env.step_async(actions)
        self._pending = self._forward(lambda: self.model.predict_members(frames, acts))  # (K, N)
        self._infer_s += time.perf_counter() - t0

    def _frames_now(self) -> StepFrames:
        """The frames this step's actions are chosen on, for a diff model. Where ``frames`` is still
        the very array the last step led to (step_wait held it; no reset, switch or replacement
        since), it is that step's ``StepFrames``: no copy, and its grey is made once for both
        steps. This relies on what the env already owes ``step_wait``'s held ``shown``: it hands out
        a new frames array at each step and never writes into one it handed out (``AtariVec``: a
        new array from ale-py at each ``recv``). Anything else is copied before the env steps."""
        shown, frames = self._shown, self.env.frames
        if shown is not None and frames is shown.rgb and shown.rgb.dtype == np.uint8:
            return shown
        return StepFrames(np.array(frames, dtype=np.uint8, copy=True))

    def _forward(self, predict: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``predict()``, the members' predictions (K, N), on ``infer_threads`` torch threads on
        CPU: the env's C++ threads are busy stepping or spin-waiting, and a forward on all cores
        would only fight them. The count is set only where it differs (each set costs)."""
        threads = torch.get_num_threads()
        if self.infer_threads is None or threads == self.infer_threads:
            return predict()
        torch.set_num_threads(self.infer_threads)
        try:
            return predict()
        finally:
            torch.set_num_threads(threads)

    def step(self, actions: np.ndarray) -> Any:
        self.step_async(actions)
        return self.step_wait().complete()

    def step_wait(self) -> Any:
        """Finish the env step; its VecStep gets ``pred_rewards`` (raw) and ``rewards``. A diff
        model's forward is left to ``VecStep.complete()``: the training loop sends the next step
        first, so the forward runs while the env's threads step."""
        if self._pending is None and self._before is None:
            raise RuntimeError("step_wait() without step_async()")
        st = self.env.step_wait()
        if self.source:
            self._pending = None
            self._predicted(st, torch.from_numpy(np.asarray(self.source(st), dtype=np.float32)[None]), self.norm)
            return st
        if self._before is None:
            self._predicted(st, self._pending, self.norm)
            self._pending = None
            return st
        before, acts = self._before
        self._before = None
        # the env hands out new frame arrays at each step_wait, so these stay this step's while the
        # next step runs; kept as the next step's frames (``_frames_now``)
        shown = self._shown = StepFrames(np.asarray(self.env.frames))
        ended = np.array(st.game_over, dtype=bool)
        # this step's model and norm: a switch before complete() (the next step_async) is the next step's
        model, norm = self.model, self.norm

        def forward() -> None:
            t0 = time.perf_counter()
            # where the step ended the game, the frame before stands in for the next game's
            # (``step_next_frames``) in the input only: ``shown``'s own grey stays the next step's
            members = self._forward(lambda: model.predict_members_grey(before.grey(), shown.grey(), acts, ended))
            self._infer_s += time.perf_counter() - t0
            self._predicted(st, members, norm)

        st.pending = forward
        return st

    def _predicted(self, st: Any, members_t: torch.Tensor | None, norm: Norm) -> None:
        """Put the members' predictions (K, N) into ``st``: raw mean, normalised on ``norm``,
        clipped."""
        assert members_t is not None
        members = members_t.float().cpu().numpy()
        raw = members.mean(0).astype(np.float32)
        paid, clipped = self.reward_path.pay(raw, norm, st.true_rewards)
        st.pred_rewards = raw
        st.rewards = paid
        self._steps += 1
        self._last = {
            "pred_mean": float(raw.mean()),
            "pred_std": float(raw.std()),
            "clipped": clipped,
            "disagreement": float(members.std(0).mean()) if len(members) > 1 else 0.0,
        }

    def stats(self) -> dict[str, float]:
        """Scalars for TensorBoard: the norm's mean/median/std, the last step's raw prediction
        mean/std, the share clipped, the ensemble disagreement (0 for one model), the model's ms per
        agent step, and ``version``."""
        out = {"norm_mean": self.norm.mean, "norm_median": self.norm.center, "norm_std": self.norm.std, **self._last}
        out["version"] = self.version
        out["scale"] = self.reward_path.scale
        if self._steps:
            out["infer_ms_per_step"] = 1000.0 * self._infer_s / self._steps
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    def close(self) -> None:
        self.env.close()
