"""The A2C policy network (the book's AtariA2C) and its checkpoints.

A checkpoint is a plain dict loadable with ``torch.load(..., weights_only=True)``:
``{"format", "version", "state_dict", "env_id", "game", "obs_shape", "n_actions",
"action_meanings", "step", "metrics", ...}``; ``last.pt`` adds the optimizer, scheduler and
counters for ``--resume``. A bare state dict (the book's format) also loads; then env and
shapes come from the caller.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lib.errors import UserError
from lib.files import atomic_write

POLICY_FORMAT = "rlhf-atari-policy"
REWARD_FORMAT = "rlhf-atari-reward"


def checkpoint_kind(ck: dict[str, Any]) -> str:
    """What a checkpoint dict holds: "policy" or "reward" (our formats), "bare policy" (the book's
    A2C state dict) or "bare reward" (the book's reward-net state dict), else "unknown"."""
    fmt = ck.get("format")
    if fmt in (POLICY_FORMAT, REWARD_FORMAT):
        return "policy" if fmt == POLICY_FORMAT else "reward"
    if ck and all(isinstance(v, torch.Tensor) for v in ck.values()):
        if "out.0.weight" in ck:
            return "bare reward"
        if "policy.2.weight" in ck:
            return "bare policy"
    return "unknown"


def wrong_kind(path: str | os.PathLike, ck: dict[str, Any], want: str) -> UserError | None:
    """The one message for a policy given where a reward model is wanted, and the other way round."""
    kind = checkpoint_kind(ck).removeprefix("bare ")
    if want == "policy" and kind == "reward":
        return UserError(f"{path} is a reward model, not a policy: pass it with --reward (-r), the policy with -m")
    if want == "reward" and kind == "policy":
        return UserError(f"{path} is a policy, not a reward model: pass it with -m, the reward model with -r")
    return None


def policy_conv(channels: int) -> nn.Sequential:
    """The policy's 3 conv layers (Mnih et al. 2015), flattened: (B, channels, 84, 84) float in [0, 1]
    -> (B, 3136). ``AtariA2C.conv``, and the encoder a reward model can borrow from a policy
    (``DiffRewardModel(encoder=True)``)."""
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

    forward: (B, 4, 84, 84) uint8 -> logits (B, n_actions) float32, values (B,) float32
    """

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
        fx = self.conv(x.float() / 255.0)
        return self.policy(fx), self.value(fx).squeeze(-1)

    def freeze_conv(self) -> None:
        """Fine-tuning: keep the learned features, train only the heads."""
        for p in self.conv.parameters():
            p.requires_grad_(False)


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


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a unique temp file, fsync, rename: a crash never leaves a half checkpoint,
    and two runs saving at once never share a temp file."""
    atomic_write(path, lambda f: torch.save(obj, f))


def read_checkpoint(path: str | os.PathLike, what: str = "model") -> dict[str, Any]:
    """Load a checkpoint dict safely (weights_only); UserError with one line on any problem."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} file not found: {path}")
    if path.is_dir():
        raise UserError(f"{what} path is a directory, expected a .pt file: {path}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        # Whatever a broken or foreign file makes torch.load raise (UnpicklingError also covers
        # a file that weights_only refuses to load because it would run code; a text file can
        # give KeyError), it is the same message.
        raise UserError(f"{what} {path} is corrupt or not a PyTorch checkpoint") from None
    if not isinstance(ck, dict):
        raise UserError(f"{what} {path} is not a checkpoint dict")
    return ck


def load_policy(
    path: str | os.PathLike,
    env_id: str | None = None,
    game: str | None = None,
    obs_shape: tuple[int, ...] | None = None,
    n_actions: int | None = None,
    ck: dict[str, Any] | None = None,
) -> tuple[AtariA2C, dict[str, Any]]:
    """Load a policy checkpoint and check it fits the env (game, obs shape, action count).

    Returns (net, checkpoint dict). For a bare state dict, obs_shape and n_actions must be given.
    ``ck``: the file's dict when the caller has read it already (``read_checkpoint``).
    """
    ck = read_checkpoint(path, "model") if ck is None else ck
    if ck.get("format") == POLICY_FORMAT:
        state = ck["state_dict"]
        ck_shape = tuple(ck["obs_shape"])
        ck_actions = int(ck["n_actions"])
        ck_game = ck.get("game")
        if game is not None and ck_game is not None and ck_game != game:
            raise UserError(
                f"model {path} was trained on {ck.get('env_id', ck_game)}, not {env_id or game}: "
                f"pass --env {ck.get('env_id', ck_game)} or another model"
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
    net = AtariA2C(ck_shape, ck_actions)
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"model {path} does not fit the A2C network ({str(e).splitlines()[0][:120]})") from None
    return net, ck
