"""The A2C policy network (the book's AtariA2C), its checkpoints' fields and files, and ``--dev``. A
policy checkpoint is a plain dict (``policy_checkpoint``, checked by ``POLICY_FIELDS``); ``last.pt``
adds the optimizer, scheduler and counters for ``--resume``. The book's bare state dicts load too,
the env and shapes then coming from the caller."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lib.core.errors import UserError
from lib.models.reward_path import RewardPath
from lib.store.checkpoints import (
    MAX_ACTIONS,
    POLICY_FORMAT,
    Check,
    check_ck_fields,
    check_state_dict,
    float_in,
    int_in,
    is_dict,
    list_of,
    optional,
    read_checkpoint,
    text,
    trained_elsewhere,
    wrong_kind,
)


def policy_conv(channels: int) -> nn.Sequential:
    """The policy's 3 conv layers (Mnih et al. 2015), flattened: (B, channels, 84, 84) float in [0,
    1] -> (B, 3136) (``AtariA2C.conv``)."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, kernel_size=3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )


class AtariA2C(nn.Module):
    """Actor-critic: 3 conv layers shared, a 512-unit policy head and a 512-unit value head.
    forward: (B, 4, 84, 84) uint8 -> logits (B, n_actions) float32, values (B,) float32."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.conv = policy_conv(obs_shape[0])
        with torch.no_grad():
            size = self.conv(torch.zeros(1, *obs_shape)).shape[1]
        self.policy = nn.Sequential(nn.Linear(size, 512), nn.ReLU(), nn.Linear(512, n_actions))
        self.value = nn.Sequential(nn.Linear(size, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 4, 84, 84) uint8 -> (B, 3136) float: the shared conv layers' output."""
        return self.conv(x.float() / 255.0)

    def heads(self, fx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features (B, 3136) -> logits (B, n_actions), values (B,)."""
        return self.policy(fx), self.value(fx).squeeze(-1)

    @property
    def conv_frozen(self) -> bool:
        return not any(p.requires_grad for p in self.conv.parameters())

    def freeze_conv(self) -> None:
        """Fine-tuning: keep the learned features, train only the heads."""
        for p in self.conv.parameters():
            p.requires_grad_(False)


class StartPolicy:
    """pi_start, the frozen policy a fine-tune started from: what ``01_a2c.py --kl`` pulls toward
    and ``finetune/kl_to_start`` measures. With the conv layers frozen (``--finetune``) both
    policies share the features, so only the policy head is kept; otherwise the whole start net.
    ``state``: a kept ``state_dict()`` (``last.pt``'s ``kl_start``, for --resume)."""

    def __init__(self, net: AtariA2C, state: dict[str, torch.Tensor] | None = None):
        import copy

        self.shared = net.conv_frozen
        self.module: nn.Module = copy.deepcopy(net.policy if self.shared else net).requires_grad_(False).eval()
        if state is not None:
            check_state_dict(state, "last.pt's kl_start")
            try:
                self.module.load_state_dict(state)
            except (RuntimeError, KeyError, ValueError) as e:
                raise UserError(f"last.pt's kl_start does not fit this network ({str(e)[:80]})") from None

    def logits(self, fx: torch.Tensor, states: torch.Tensor | None) -> torch.Tensor:
        """pi_start's logits (B, n_actions) for ``states`` (B, 4, 84, 84) uint8 whose features the
        trained net computed as ``fx`` (B, 3136); no gradient. A shared start policy reads ``fx``
        alone (``states`` may then be None: a fine-tune's learner keeps no frames on the device)."""
        with torch.no_grad():
            if self.shared:
                return self.module(fx)
            if states is None:
                raise ValueError("StartPolicy.logits: a start policy with its own conv layers needs the states")
            return self.module(states)[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}


def kl_to_start(log_prob: torch.Tensor, start_logits: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of KL(pi || pi_start) = sum_a pi(a) (log pi(a) - log pi_start(a));
    ``log_prob`` (B, A) the trained policy's log-probabilities (with gradient)."""
    start_log_prob = torch.log_softmax(start_logits.float(), dim=1)
    return (log_prob.exp() * (log_prob - start_log_prob)).sum(dim=1).mean()


def resolve_device(dev: str | torch.device) -> torch.device:
    """``--dev`` of every stage: 'cpu', 'cuda' or 'cuda:N' -> a device that exists here;
    UserError with one line otherwise (e.g. --dev cuda on a machine without a GPU)."""
    name = str(dev)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise UserError(f"--dev must be cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--dev {name} given but no CUDA GPU is available here: use --dev cpu")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--dev {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def policy_checkpoint(
    net: AtariA2C, env_id: str, game: str, action_meanings: tuple[str, ...], **extra: Any
) -> dict[str, Any]:
    ck = {
        "format": POLICY_FORMAT,
        "version": 1,
        "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()},
        "env_id": env_id,
        "game": game,
        "obs_shape": list(net.obs_shape),
        "n_actions": net.n_actions,
        "action_meanings": list(action_meanings),
    }
    ck.update(extra)
    return ck


BEST_GLOB = "best_*.pt"  # 01_a2c.py's best checkpoints: best_<step, 9 digits>_score<mean>_len<mean>.pt
LAST_NAME = "last.pt"  # 01_a2c.py's latest state (what --resume continues)


def best_checkpoint_name(step: int, score_mean: float, length_mean: float) -> str:
    """The file name of a best checkpoint: the step first, zero-padded, so that a listing reads in
    step order (up to 9 digits; ``best_checkpoints`` sorts by the parsed step)."""
    return f"best_{step:09d}_score{score_mean:.1f}_len{length_mean:.0f}.pt"


BEST_NAME = re.compile(r"best_(\d+)_score.*\.pt")  # what best_checkpoint_name writes
BEST_FIGURES = re.compile(r"best_(\d+)_score(-?\d+(?:\.\d+)?)_len(\d+)\.pt")  # its step, score and length


def best_checkpoint_figures(path: str | os.PathLike) -> tuple[int, float, float] | None:
    """(step, mean score, mean game length) of the evaluation that saved a best checkpoint, read
    from the name ``best_checkpoint_name`` gave it; None for a name it did not write."""
    m = BEST_FIGURES.fullmatch(Path(path).name)
    return None if m is None else (int(m[1]), float(m[2]), float(m[3]))


def best_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """A run's best checkpoints, by the step parsed from the name (past 9 digits text order is
    wrong); other best_*.pt are not ours."""
    steps = {p: m[1] for p in Path(save_dir).glob(BEST_GLOB) if (m := BEST_NAME.fullmatch(p.name))}
    return sorted(steps, key=lambda p: (int(steps[p]), p.name))


def best_checkpoint(save_dir: str | os.PathLike) -> Path | None:
    """A run's best policy: its last best_*.pt written (each beat every earlier evaluation), by the
    step in its name; None when the run has none (it never finished an evaluation)."""
    best = best_checkpoints(save_dir)
    return best[-1] if best else None


def run_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints 01_a2c.py wrote in a run directory: its best ones (by step) and last.pt."""
    last = Path(save_dir) / LAST_NAME
    return best_checkpoints(save_dir) + ([last] if os.path.lexists(last) else [])


def remove_run_checkpoints(save_dir: str | os.PathLike) -> int:
    """Remove a run's checkpoints (``run_checkpoints``: ``--force`` starts the run over, and an old
    best must not stand for the new run); returns how many. Other files stay."""
    found = run_checkpoints(save_dir)
    for p in found:
        try:
            p.unlink()
        except OSError as e:
            raise UserError(f"--force cannot remove the old run's {p}: {e.strerror or e}") from None
    return len(found)


def policy_file(path: str | os.PathLike) -> Path:
    """``-m`` of 01_a2c.py and 04_play.py: a checkpoint file as given, or a run directory (such as
    saves/v0), which stands for its best policy (``best_checkpoint``), else its last.pt."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = best_checkpoint(path) or (path / LAST_NAME if (path / LAST_NAME).is_file() else None)
    if found is None:
        raise UserError(f"-m {path}: a directory without a policy ({BEST_GLOB} or {LAST_NAME})")
    return found


MAX_OBS_SIDE = 256  # the policy sees 84x84: larger observations would build a giant network
POLICY_FIELDS: dict[str, tuple[Check, bool]] = {
    "version": (int_in(0, 1000), False),
    "state_dict": (is_dict, True),
    "obs_shape": (list_of(int_in(1, MAX_OBS_SIDE), 3, 3), True),
    "n_actions": (int_in(1, MAX_ACTIONS), True),
    "env_id": (optional(text(200)), False),
    "game": (optional(text(200)), False),
    "action_meanings": (optional(list_of(text(64), 1, MAX_ACTIONS)), False),
    "step": (optional(float_in(0, 1e15)), False),
    "metrics": (optional(is_dict), False),  # evaluation figures (NaN allowed): shown, never used
    # how a run on a learned reward was paid (lib.models.reward_path); None or absent: the score, or
    # a checkpoint from before the record (04_play.py then shows the default path)
    "reward_path": (optional(RewardPath.read), False),
    # what went through that path in place of -r's prediction (an experiment's reward source), or None
    "reward_source": (optional(text(200)), False),
}


def load_policy(
    path: str | os.PathLike,
    env_id: str | None = None,
    game: str | None = None,
    obs_shape: tuple[int, ...] | None = None,
    n_actions: int | None = None,
    ck: dict[str, Any] | None = None,
) -> tuple[AtariA2C, dict[str, Any]]:
    """Load a policy checkpoint and check it fits the env (game, obs shape, action count); returns
    (net, checkpoint dict). A bare state dict needs obs_shape and n_actions. ``ck``: the file's dict
    when the caller has read it already."""
    ck = read_checkpoint(path, "model") if ck is None else ck
    if ck.get("format") == POLICY_FORMAT:
        check_ck_fields(ck, POLICY_FIELDS, f"model {path}")
        state = ck["state_dict"]
        ck_shape = tuple(ck["obs_shape"])
        ck_actions = int(ck["n_actions"])
        if ck_shape[0] > 16 or min(ck_shape[1:]) < 36:
            raise UserError(f"model {path} declares observations {ck_shape}: not an Atari policy's")
        other = trained_elsewhere(ck, game)
        if other is not None:
            raise UserError(
                f"model {path} was trained on {other}, not {env_id or game}: pass --env {other} or another model"
            )
        if obs_shape is not None and tuple(obs_shape) != ck_shape:
            raise UserError(f"model {path} expects observations {ck_shape}, the env gives {tuple(obs_shape)}")
        if n_actions is not None and n_actions != ck_actions:
            raise UserError(f"model {path} has {ck_actions} actions, the env {env_id or game} has {n_actions}")
    elif ck and all(isinstance(v, torch.Tensor) for v in ck.values()):
        # The book's format: a bare state dict.
        if obs_shape is None or n_actions is None:
            raise UserError(f"model {path} is a bare state dict: the env must give its shapes")
        state, ck_shape, ck_actions = ck, tuple(obs_shape), n_actions
        ck = {"state_dict": state}
    else:
        raise wrong_kind(path, ck, "policy") or UserError(f"model {path} is not a policy checkpoint")
    check_state_dict(state, f"model {path}")
    net = AtariA2C(ck_shape, ck_actions)
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"model {path} does not fit the A2C network ({str(e).splitlines()[0][:120]})") from None
    return net, ck
