"""The reward models and their checkpoints. ``DiffRewardModel`` (``--arch diff``, the default) sees
what a step did: the grey 84x84 frame and its change to the frame the step led to, block-averaged.
``RewardModel`` (``--arch book``) is the book's conv net on the colour frame (Lapan, ch. 19); its
parameter names are the book's, so the book's bare state dicts load. ``preference_loss`` is the
Bradley-Terry loss of Christiano et al. 2017. ``RewardPredictor`` runs a loaded model for inference,
with BatchNorm folded into the convolutions. ``reward_input`` makes every caller's input, so
training and play cannot feed the net different things. Figures: docs/results.md."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lib.atari.envs import POLICY_FRAME, grey84
from lib.core.errors import UserError
from lib.models.policy import resolve_device
from lib.models.reward_spec import ARCHS, DIFF_BLOCK, MAX_ENSEMBLE, check_block
from lib.store.checkpoints import (
    MAX_ACTIONS,
    REWARD_FORMAT,
    atomic_torch_save,
    check_ck_fields,
    check_state_dict,
    checkpoint_kind,
    float_in,
    int_in,
    is_bool,
    is_dict,
    list_of,
    optional,
    plain_values,
    read_checkpoint,
    text,
    trained_elsewhere,
    wrong_kind,
)

REWARD_VERSION = 1
FULL_FRAME = (210, 160, 3)
CONV_FILTERS = 16
CONV_LAYERS = ((7, 3), (5, 2), (3, 1), (3, 1))  # (kernel, stride) of the book's 4 conv layers
HIDDEN = 64
DROPOUT = 0.5
NOISE_EPS = 0.1  # the paper's "10% of the answers are uniformly random"
INPUT_CHUNK = 64  # frames per slice of the float input (64 x 400 KB = 26 MB)
# ARCHS and DIFF_BLOCK (4x12) live in lib/models/reward_spec.py, torch-free for the stages' --help
FLOW_FEATURES = 2  # --diff-flow: the scene's vertical and horizontal shift (scene_flow)
FLOW_EPS = 1e-3  # scene_flow's guard against a frame without edges (sum of squared gradients)
OLD_DIFF_BLOCK = (12, 12)  # diff checkpoints made before the "diff_block" field
MAX_FRAME_SIDE = 1024  # as lib.store.segments.MAX_FRAME_SIDE
MAX_DOWNSCALE = 8


def input_shape_of(frame_shape: Sequence[int], downscale: int = 1) -> tuple[int, int, int]:
    """Network input (C, H, W) for frames (H, W, 3) shrunk ``downscale`` times (2x2 average = 2)."""
    h, w, c = frame_shape
    return (c, h // downscale, w // downscale)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _half_mask(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A uint8 tensor of ``shape`` with fair 0/1 entries from random bytes: faster than
    ``bernoulli_``."""
    n = math.prod(shape)
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(8, dtype=torch.uint8, device=device)
    b = torch.randint(0, 256, ((n + 7) // 8, 1), dtype=torch.uint8, device=device)
    return ((b >> shifts) & 1).view(-1)[:n].view(shape)


class _HalfDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            n, c, h, w = x.shape
            mask = _half_mask((n, h, w, c), x.device).permute(0, 3, 1, 2)  # same memory order as x
        else:
            mask = _half_mask(tuple(x.shape), x.device)
        ctx.save_for_backward(mask)  # 1 byte an element
        # uint8 x float multiplies are ~2x slower than float x float: convert the mask first
        return x * mask.to(x.dtype).mul_(2.0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return grad * mask.to(grad.dtype).mul_(2.0)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` (same behaviour, no parameters) with a fast mask for p = 0.5, the book's rate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.p == 0.5 and not self.inplace:
            return _HalfDropout.apply(x)
        return super().forward(x)


class RewardModel(nn.Module):
    """The book's reward model, trainable (train mode: BatchNorm batch statistics and dropout);
    ``downscale`` d > 1 averages d x d blocks first. forward: frames (B, H, W, 3) uint8 or float
    0..255, actions (B,) int64 -> rewards (B,) float32."""

    arch = "book"
    needs_next = False

    def __init__(self, n_actions: int, frame_shape: Sequence[int] = FULL_FRAME, downscale: int = 1):
        super().__init__()
        if downscale < 1:
            raise ValueError(f"downscale must be >= 1, got {downscale}")
        self.n_actions = int(n_actions)
        self.frame_shape = tuple(int(x) for x in frame_shape)
        self.downscale = int(downscale)
        self.input_shape = input_shape_of(self.frame_shape, self.downscale)
        layers: list[nn.Module] = []
        ch = self.input_shape[0]
        for kernel, stride in CONV_LAYERS:
            layers += [
                nn.Conv2d(ch, CONV_FILTERS, kernel_size=kernel, stride=stride),
                nn.BatchNorm2d(CONV_FILTERS),
                FastDropout(p=DROPOUT),
                nn.LeakyReLU(),
            ]
            ch = CONV_FILTERS
        layers.append(nn.Flatten())
        self.conv = nn.Sequential(*layers)
        self.conv_out_shape = conv_out_shape(self.input_shape)
        size = math.prod(self.conv_out_shape)
        self.out = nn.Sequential(nn.Linear(size + self.n_actions, HIDDEN), nn.LeakyReLU(), nn.Linear(HIDDEN, 1))

    def preprocess(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 -> (B, 3, H/d, W/d) float in [0, 1], channels-last memory."""
        x = to_input(frames, self.downscale)
        # a fresh tensor from uint8 frames: scale in place (one 10 MB pass less per 100 frames)
        return x.mul_(1.0 / 255.0) if frames.dtype == torch.uint8 else x / 255.0

    def forward(self, frames: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if len(frames) <= INPUT_CHUNK:
            x = self.conv(self.preprocess(frames))
        else:
            # The float input is the largest tensor (400 KB a frame). Made and convolved in chunks,
            # no tensor exceeds glibc's 32 MB mmap threshold, so freed memory is reused instead of
            # being unmapped and faulted in again each micro-batch. The first conv is per-frame, so
            # this changes nothing; BatchNorm still sees the whole micro-batch.
            first = torch.cat([self.conv[0](self.preprocess(f)) for f in frames.split(INPUT_CHUNK)])
            x = self.conv[1:](first)
        act = F.one_hot(actions.long(), self.n_actions).to(x.dtype)
        return self.out(torch.cat((x, act), dim=1)).squeeze(-1)


def conv_out_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
    """(C, H, W) after the 4 conv layers; ValueError when the frame is too small for them."""
    _, h, w = input_shape
    for kernel, stride in CONV_LAYERS:
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    if h < 1 or w < 1:
        raise ValueError(f"input {tuple(input_shape)} is too small for the reward model's conv layers")
    return (CONV_FILTERS, h, w)


def to_input(frames: torch.Tensor, downscale: int = 1) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, H/d, W/d) float32 in 0..255, channels-last memory (no copy of
    the layout: NHWC memory *is* channels-last NCHW). ``downscale`` d > 1 averages d x d blocks."""
    x = frames.permute(0, 3, 1, 2).float()
    if downscale > 1:
        x = F.avg_pool2d(x, downscale)
    return x


# --- the model's input: one function for every caller ----------------------------------------


def step_next_frames(before: np.ndarray, after: np.ndarray, game_over: np.ndarray | None = None) -> np.ndarray:
    """The frame each step led to: ``after``, except ``before`` where the step ended the game (the
    env already shows the next game's first frame there). Any per-step arrays: RGB or grey frames."""
    ended = np.zeros(len(before), dtype=bool) if game_over is None else np.asarray(game_over, dtype=bool)
    if not ended.any():
        return after
    out = np.array(after, copy=True)
    out[ended] = before[ended]
    return out


def segment_next_frames(frames: np.ndarray, game_over: np.ndarray | None = None) -> np.ndarray:
    """The frame each step of a clip led to: the clip's next frame; the last step (and a step that
    ended the game) gets its own. A ``game_over`` of another length than the clip is ignored."""
    shown = np.concatenate([frames[1:], frames[-1:]])
    ended = game_over if game_over is not None and len(game_over) == len(frames) else None
    return step_next_frames(frames, shown, ended)


def reward_input(
    arch: str,
    frames: np.ndarray | torch.Tensor,
    shown: np.ndarray | torch.Tensor | None = None,
    game_over: np.ndarray | None = None,
) -> np.ndarray | torch.Tensor:
    """The reward model's input for B steps, the one function every caller uses (training,
    ``--evaluate``, the wrapper, the page, 04_play.py), so none feeds the net different things.
    ``frames`` (B, H, W, 3) uint8: what each action was chosen on; ``shown``: what the env showed
    after each step (None: ``frames`` is a clip); ``game_over`` (B,) bool: the steps that ended the
    game. Returns ``frames`` for "book"; for "diff", (B, 2, 84, 84) uint8: each frame and the one
    its step led to, in the policy's grey 84x84. ValueError for another arch."""
    if arch == "book":
        return frames
    if arch != "diff":
        raise ValueError(f"unknown reward model arch {arch!r}")
    grey = grey84(np.asarray(frames))
    if shown is None:
        return np.stack([grey, segment_next_frames(grey, game_over)], axis=1)
    shown = np.asarray(shown)
    if shown.shape != tuple(frames.shape):
        raise ValueError(f"next frames {tuple(shown.shape)} do not match frames {tuple(frames.shape)}")
    return diff_step_input(grey, grey84(shown), game_over)


def diff_step_input(grey: np.ndarray, grey_shown: np.ndarray, game_over: np.ndarray | None = None) -> np.ndarray:
    """``reward_input("diff", frames, shown, game_over)`` from frames ``grey84`` has made grey
    already: ``grey`` (B, 84, 84) uint8 what each action was chosen on, ``grey_shown`` what the env
    showed after each step. (B, 2, 84, 84) uint8. For a caller that keeps a step's grey ``shown``
    as the next step's ``grey`` (the wrapper), so each frame is made grey once."""
    return np.stack([grey, step_next_frames(grey, grey_shown, game_over)], axis=1)


# --- the diff net: what the step changed -----------------------------------------------------


class DiffRewardModel(nn.Module):
    """A reward model that sees what each step did: the grey 84x84 frame the action was chosen on
    and its absolute change to the next, each averaged over ``block`` blocks (default 4x12) and
    scaled to unit std (``scale_to``), then the book's head. The change is where points show: the
    frame an action is chosen on cannot show its outcome. ``mask_rows`` blanks that many top rows
    (the paper's score masking). ``flow`` adds the scene's vertical and horizontal shift
    (``scene_flow``: in SeaQuest, the sub climbing); ``flow_scene`` adds each shift times each block
    of the frame. forward: x (B, 2, 84, 84) uint8 from ``reward_input``, actions (B,) int64 ->
    rewards (B,) float32."""

    arch = "diff"
    needs_next = True

    def __init__(
        self,
        n_actions: int,
        frame_shape: Sequence[int] = FULL_FRAME,
        mask_rows: int = 0,
        block: Sequence[int] = DIFF_BLOCK,
        flow: bool = False,
        flow_scene: bool = False,
    ):
        super().__init__()
        if not 0 <= mask_rows < POLICY_FRAME:
            raise ValueError(f"mask_rows must be in 0..{POLICY_FRAME - 1}, got {mask_rows}")
        self.block = check_block(block)
        self.n_actions = int(n_actions)
        self.frame_shape = tuple(int(x) for x in frame_shape)
        self.downscale = 1
        self.input_shape = (2, POLICY_FRAME, POLICY_FRAME)
        if flow_scene and not flow:
            raise ValueError("flow_scene needs flow")
        self.flow, self.flow_scene = bool(flow), bool(flow_scene)
        blocks = (POLICY_FRAME // self.block[0]) * (POLICY_FRAME // self.block[1])
        n = 2 * blocks
        n += FLOW_FEATURES if self.flow else 0
        n += FLOW_FEATURES * blocks if self.flow_scene else 0
        # buffers, so that a checkpoint's state dict carries them
        self.register_buffer("scale", torch.ones(n))
        self.register_buffer("mask_rows", torch.tensor(int(mask_rows)))
        self.out = nn.Sequential(nn.Linear(n + self.n_actions, HIDDEN), nn.LeakyReLU(), nn.Linear(HIDDEN, 1))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 2, 84, 84) uint8 -> (B, n) float, unscaled: block means of |next - frame| and of the
        frame, then the flow features if asked (``scene_flow``)."""
        x = x.float().mul_(1.0 / 255.0)
        if int(self.mask_rows):
            x[:, :, : int(self.mask_rows)] = 0.0
        change = x[:, 1:] - x[:, :1]
        frame = F.avg_pool2d(x[:, :1], self.block).flatten(1)
        parts = [F.avg_pool2d(change.abs(), self.block).flatten(1), frame]
        if self.flow:
            shift = scene_flow(x)
            parts.append(shift)
            if self.flow_scene:
                parts.append((shift[:, :, None] * frame[:, None, :]).flatten(1))
        return torch.cat(parts, dim=1)

    @torch.no_grad()
    def scale_to(self, f: torch.Tensor) -> None:
        """Set the per-feature scale to 1 / std of unscaled features ``f``, at most 1000. A feature
        that never varies gets 0, so a change the model never saw cannot move its output."""
        std = f.to(self.scale.device).std(0)
        self.scale.copy_(torch.where(std > 1e-6, 1.0 / std.clamp_min(1e-3), torch.zeros_like(std)))

    def feature_key(self) -> tuple[Any, ...]:
        """The key a training run caches ``features`` under: all they depend on besides the input."""
        return (self.block, int(self.mask_rows), self.flow, self.flow_scene)

    def head(self, f: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Per-step rewards (B,) from unscaled ``features`` (B, n) and the actions (B,)."""
        act = F.one_hot(actions.long(), self.n_actions).to(f.dtype)
        return self.out(torch.cat((f * self.scale, act), dim=1)).squeeze(-1)

    def forward(self, x: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x), actions)


def scene_flow(x: torch.Tensor) -> torch.Tensor:
    """(B, 2, H, W) float (frame, next) -> (B, 2): the least-squares shift in pixels (down, right
    positive) that explains next - frame (Lucas-Kanade, one window); 0 for a still or edgeless
    scene."""
    change = x[:, 1] - x[:, 0]
    mean = 0.5 * (x[:, 0] + x[:, 1])
    # central differences, on the interior pixels only (an edge pixel has no gradient to add)
    gy, dy = 0.5 * (mean[:, 2:] - mean[:, :-2]), change[:, 1:-1]
    gx, dx = 0.5 * (mean[:, :, 2:] - mean[:, :, :-2]), change[:, :, 1:-1]
    v = [-(d * g).sum((1, 2)) / ((g * g).sum((1, 2)) + FLOW_EPS) for d, g in ((dy, gy), (dx, gx))]
    return torch.stack(v, dim=1)


# --- the loss --------------------------------------------------------------------------------


def preference_loss(
    r1: torch.Tensor, r2: torch.Tensor, mu: torch.Tensor, noise: float = 0.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry cross-entropy of predicted segment returns against preference labels. r1, r2:
    (P,) predicted returns of each pair's first and second segment; mu: (P,) P(first better): 1.0,
    0.0 or 0.5. ``noise`` ε, the paper's share of random answers: p' = (1 − ε) p + ε/2, which bounds
    the loss of a label the model is sure is wrong. Returns (mean loss, metrics): loss, accuracy on
    non-tie pairs (nan if none), their count."""
    if r1.shape != r2.shape or r1.shape != mu.shape or r1.ndim != 1:
        raise ValueError(
            f"r1, r2 and mu must all have shape (P,), got {tuple(r1.shape)}, {tuple(r2.shape)}, {tuple(mu.shape)}"
        )
    d = r1 - r2
    if noise > 0:
        log_keep, log_rand = math.log(1.0 - noise), math.log(noise / 2)
        log_p = torch.logaddexp(F.logsigmoid(d) + log_keep, torch.full_like(d, log_rand))
        log_q = torch.logaddexp(F.logsigmoid(-d) + log_keep, torch.full_like(d, log_rand))
        loss = -(mu * log_p + (1.0 - mu) * log_q).mean()
    else:
        loss = F.binary_cross_entropy_with_logits(d, mu)
    with torch.no_grad():
        decided = mu != 0.5
        n = int(decided.sum())
        acc = float(((d[decided] > 0) == (mu[decided] > 0.5)).float().mean()) if n else float("nan")
    return loss, {"loss": float(loss.detach()), "accuracy": acc, "decided": float(n)}


# --- lean inference --------------------------------------------------------------------------


class LeanRewardNet(nn.Module):
    """Eval-only copy of a RewardModel: BatchNorm and the 1/255 scale folded into the convolutions,
    no dropout, the action a row lookup; equal to ``model.eval()``'s output up to rounding."""

    def __init__(self, model: RewardModel):
        super().__init__()
        self.downscale = model.downscale
        convs, bns = (
            [m for m in model.conv if isinstance(m, nn.Conv2d)],
            [m for m in model.conv if isinstance(m, nn.BatchNorm2d)],
        )
        folded = []
        for i, (conv, bn) in enumerate(zip(convs, bns, strict=True)):
            scale = bn.weight.detach() / torch.sqrt(bn.running_var.detach() + bn.eps)
            w = conv.weight.detach() * scale[:, None, None, None]
            b = (conv.bias.detach() - bn.running_mean.detach()) * scale + bn.bias.detach()
            if i == 0:
                w = w / 255.0  # takes raw 0..255 pixels
            c = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride)
            c.weight.data.copy_(w)
            c.bias.data.copy_(b)
            folded.append(c)
        self.convs = nn.ModuleList(folded)
        self.slope = float(next(m for m in model.conv if isinstance(m, nn.LeakyReLU)).negative_slope)
        lin1, lin2 = model.out[0], model.out[2]
        c, h, w = model.conv_out_shape
        n_feat = c * h * w
        # Features are read in (H, W, C) order -- the channels-last memory order -- so the
        # flatten is a free view; reorder the weight columns from the book's (C, H, W) to match.
        wf = lin1.weight.detach()[:, :n_feat].reshape(HIDDEN, c, h, w).permute(0, 2, 3, 1).reshape(HIDDEN, n_feat)
        self.feat = nn.Linear(n_feat, HIDDEN, bias=False)
        self.feat.weight.data.copy_(wf)
        # one-hot(a) @ W_a^T + b is row a of (W_a^T + b): a lookup instead of a matmul.
        self.act_rows = nn.Parameter((lin1.weight.detach()[:, n_feat:].T + lin1.bias.detach()).clone(), False)
        self.head = nn.Linear(HIDDEN, 1)
        self.head.weight.data.copy_(lin2.weight.detach())
        self.head.bias.data.copy_(lin2.bias.detach())
        self.slope2 = float(model.out[1].negative_slope)
        self.requires_grad_(False)
        self.eval()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, h, w) float 0..255 -> (B, hidden) before the action term."""
        for conv in self.convs:
            x = F.leaky_relu(conv(x), self.slope, inplace=True)
        return self.feat(x.permute(0, 2, 3, 1).reshape(len(x), -1))

    def forward(self, frames: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        h = self.features(to_input(frames, self.downscale)) + self.act_rows[actions.long()]
        return self.head(F.leaky_relu(h, self.slope2, inplace=True)).squeeze(-1)


AnyRewardModel = RewardModel | DiffRewardModel


def new_reward_model(
    arch: str,
    n_actions: int,
    frame_shape: Sequence[int] = FULL_FRAME,
    downscale: int = 1,
    mask_rows: int = 0,
    block: Sequence[int] = DIFF_BLOCK,
    flow: bool = False,
    flow_scene: bool = False,
) -> AnyRewardModel:
    """A fresh reward model of ``arch`` ("book": the book's net on the colour frame, ``downscale``
    applies; "diff": ``DiffRewardModel``, ``mask_rows``, ``block``, ``flow`` and ``flow_scene`` apply)."""
    if arch == "book":
        return RewardModel(n_actions, frame_shape, downscale)
    if arch == "diff":
        return DiffRewardModel(n_actions, frame_shape, mask_rows, block, flow, flow_scene)
    raise ValueError(f"unknown reward model arch {arch!r} (known: {', '.join(ARCHS)})")


def lean_net(model: AnyRewardModel) -> nn.Module:
    """Eval-only net of a trained model: ``LeanRewardNet`` (book) or a frozen copy (diff)."""
    if isinstance(model, DiffRewardModel):
        twin = DiffRewardModel(
            model.n_actions, model.frame_shape, block=model.block, flow=model.flow, flow_scene=model.flow_scene
        )
        twin.load_state_dict(model.state_dict())
        return twin.eval().requires_grad_(False).to(model.scale.device)
    return LeanRewardNet(model)


class RewardPredictor:
    """A loaded reward model (one net, or an ensemble predicting its members' mean) for inference,
    chunked so any batch fits. ``norm_mean`` / ``norm_std``: the per-step predictions' stats on its
    training segments (0 and 1 without them, see ``has_norm_stats``)."""

    def __init__(
        self,
        models: Sequence[RewardModel],
        ck: dict[str, Any],
        device: torch.device | str = "cpu",
        path: str | None = None,
        chunk: int = INPUT_CHUNK,
    ):
        self.device = torch.device(device)
        self.nets = [lean_net(m.cpu()).to(self.device, memory_format=torch.channels_last) for m in models]
        first = models[0]
        self.arch: str = first.arch
        self.needs_next: bool = first.needs_next
        self.path = path
        self.frame_shape: tuple[int, int, int] = first.frame_shape  # type: ignore[assignment]
        self.downscale = first.downscale
        self.n_actions = first.n_actions
        self.env_id: str | None = ck.get("env_id")
        self.game: str | None = ck.get("game")
        meanings = ck.get("action_meanings")
        self.action_meanings: tuple[str, ...] | None = tuple(meanings) if meanings else None
        self.has_norm_stats = ck.get("norm_mean") is not None and ck.get("norm_std") is not None
        self.norm_mean = float(ck["norm_mean"]) if self.has_norm_stats else 0.0
        self.norm_std = float(ck["norm_std"]) if self.has_norm_stats else 1.0
        # the true per-step score's mean and std over the same labelled clips (None: not stored, or
        # a DB without true rewards): the lab's oracle arm normalises with them under --reward-norm
        # labels (experiments.lab_a2c)
        has_score = ck.get("score_mean") is not None and ck.get("score_std") is not None
        self.score_stats: tuple[float, float] | None = (
            (float(ck["score_mean"]), float(ck["score_std"])) if has_score else None
        )
        self.metrics: dict[str, Any] = dict(ck.get("metrics") or {})
        self.chunk = chunk
        self._keys_of: tuple[nn.Module, ...] = ()  # the nets ``_keys`` was read from
        self._keys: list[Any] = []

    @property
    def ensemble(self) -> int:
        return len(self.nets)

    def feature_keys(self) -> list[Any]:
        """Each member's ``feature_key()`` (None: not a diff net; members may differ in mask_rows):
        ``_members`` makes ``features`` once per key. Read again only when ``nets`` changes, as
        ``int(mask_rows)`` is a device sync on CUDA."""
        nets = tuple(self.nets)
        if nets != self._keys_of:
            self._keys_of = nets
            self._keys = [net.feature_key() if isinstance(net, DiffRewardModel) else None for net in nets]
        return self._keys

    def same_as(self, other: RewardPredictor) -> bool:
        """Whether ``other`` predicts exactly as this one does (weights, norm stats, metrics, env):
        then ``--reward-reload`` keeps its normalisation."""
        facts = ("arch", "frame_shape", "n_actions", "env_id", "game", "has_norm_stats", "norm_mean", "norm_std")
        if any(getattr(self, k) != getattr(other, k) for k in (*facts, "ensemble", "metrics")):
            return False
        for a, b in zip(self.nets, other.nets, strict=True):
            sa, sb = a.state_dict(), b.state_dict()
            if sa.keys() != sb.keys() or not all(torch.equal(sa[k], sb[k]) for k in sa):
                return False
        return True

    def _check(self, frames: np.ndarray | torch.Tensor, actions: np.ndarray | torch.Tensor) -> None:
        if tuple(frames.shape[1:]) != self.frame_shape or len(frames.shape) != 4:
            raise ValueError(
                f"frames must have shape (B, {', '.join(map(str, self.frame_shape))}), got {tuple(frames.shape)}"
            )
        if tuple(actions.shape) != (frames.shape[0],):
            raise ValueError(f"actions must have shape ({frames.shape[0]},), got {tuple(actions.shape)}")

    def predict_members(
        self,
        frames: np.ndarray | torch.Tensor,
        actions: np.ndarray | torch.Tensor,
        next_frames: np.ndarray | torch.Tensor | None = None,
        game_over: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Every member's per-step rewards, (K, B) float32 on the device. ``next_frames`` and
        ``game_over`` as ``reward_input`` takes them; a diff model needs them (ValueError)."""
        self._check(frames, actions)
        if self.needs_next:
            if next_frames is None:
                raise ValueError("this reward model (--arch diff) needs next_frames: the frame each step led to")
            if tuple(next_frames.shape) != tuple(frames.shape):
                raise ValueError(f"next_frames {tuple(next_frames.shape)} do not match frames {tuple(frames.shape)}")
        return self._members(reward_input(self.arch, frames, next_frames, game_over), actions)

    def predict_members_grey(
        self,
        grey: np.ndarray,
        grey_next: np.ndarray,
        actions: np.ndarray | torch.Tensor,
        game_over: np.ndarray | None = None,
    ) -> torch.Tensor:
        """A diff model's ``predict_members`` from frames ``grey84`` has made grey already: ``grey``
        (B, 84, 84) uint8 those the actions were chosen on, ``grey_next`` those the env showed after
        each step (``diff_step_input``). The same (K, B) as ``predict_members`` on the RGB frames."""
        if not self.needs_next:
            raise ValueError(f"a reward model of arch {self.arch!r} takes RGB frames, not grey ones")
        shape = (len(actions), POLICY_FRAME, POLICY_FRAME)
        if tuple(grey.shape) != shape or tuple(grey_next.shape) != shape:
            raise ValueError(f"grey frames must have shape {shape}, got {tuple(grey.shape)}, {tuple(grey_next.shape)}")
        return self._members(diff_step_input(grey, grey_next, game_over), actions)

    def _members(self, x: np.ndarray | torch.Tensor, actions: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(K, B) member predictions from ``reward_input``'s ``x``, ``chunk`` steps a forward. Diff
        members that share a feature key share one ``features`` pass, each then runs its own
        ``head``: what its ``forward`` computes, op for op."""
        a = torch.as_tensor(actions)
        if a.numel() and (int(a.min()) < 0 or int(a.max()) >= self.n_actions):
            raise ValueError(f"actions must be in 0..{self.n_actions - 1}")
        out = torch.empty((len(self.nets), len(a)), dtype=torch.float32, device=self.device)
        with torch.inference_mode():
            for s in range(0, len(a), self.chunk):
                e = s + self.chunk
                fc = torch.as_tensor(x[s:e]).to(self.device, non_blocking=True)
                ac = a[s:e].to(self.device, non_blocking=True)
                feats: dict[Any, torch.Tensor] = {}
                for k, (net, key) in enumerate(zip(self.nets, self.feature_keys(), strict=True)):
                    if key is None:
                        out[k, s : s + len(fc)] = net(fc, ac)
                        continue
                    if key not in feats:
                        feats[key] = net.features(fc)  # type: ignore[operator]
                    out[k, s : s + len(fc)] = net.head(feats[key], ac)  # type: ignore[operator]
        return out

    def predict(
        self,
        frames: np.ndarray | torch.Tensor,
        actions: np.ndarray | torch.Tensor,
        next_frames: np.ndarray | torch.Tensor | None = None,
        game_over: np.ndarray | None = None,
    ) -> np.ndarray:
        """Raw per-step rewards (B,) float32 (the ensemble mean); see ``predict_members``."""
        return _ensemble_mean(self.predict_members(frames, actions, next_frames, game_over))

    def predict_clip(self, segment: Any, members: bool = False) -> np.ndarray | torch.Tensor:
        """Per-step rewards of a recorded clip (a ``lib.store.segments.Segment``): (T,) float32 numpy, or
        with ``members`` every member's (K, T) tensor. Each step's next frame is the clip's own."""
        self._check(segment.frames, segment.actions)
        out = self._members(reward_input(self.arch, segment.frames, None, segment.game_over), segment.actions)
        return out if members else _ensemble_mean(out)


def _ensemble_mean(members: torch.Tensor) -> np.ndarray:
    """(K, B) member predictions -> (B,) float32 numpy: their mean."""
    return members.mean(0).cpu().numpy().astype(np.float32)


# --- checkpoints -----------------------------------------------------------------------------


def reward_checkpoint(
    models: Sequence[AnyRewardModel],
    env_id: str | None,
    game: str | None,
    action_meanings: Sequence[str] | None,
    norm_mean: float | None = None,
    norm_std: float | None = None,
    metrics: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The checkpoint dict of a reward model (its members): plain values that
    ``torch.load(weights_only=True)`` reads, fields as ``REWARD_FIELDS`` checks them."""
    first = models[0]
    ck = {
        "format": REWARD_FORMAT,
        "version": REWARD_VERSION,
        "arch": first.arch,
        "needs_next_frames": first.needs_next,
        **(
            {"diff_block": list(first.block), "diff_flow": first.flow, "diff_flow_scene": first.flow_scene}
            if isinstance(first, DiffRewardModel)
            else {}
        ),
        "state_dicts": [{k: v.detach().cpu().clone() for k, v in m.state_dict().items()} for m in models],
        "frame_shape": list(first.frame_shape),
        "downscale": first.downscale,
        "input_shape": list(first.input_shape),
        "n_actions": first.n_actions,
        "env_id": env_id,
        "game": game,
        "action_meanings": list(action_meanings) if action_meanings else None,
        "norm_mean": None if norm_mean is None else float(norm_mean),
        "norm_std": None if norm_std is None else float(norm_std),
        "metrics": {k: _plain(v) for k, v in (metrics or {}).items()},
    }
    ck.update(extra)
    return ck


def _plain(v: Any) -> Any:
    """A metric value that weights_only loading accepts: float/int/str/None."""
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _check_block_field(v: Any) -> None:
    check_block(v)


REWARD_FIELDS: dict[str, tuple[Any, bool]] = {
    "version": (int_in(0, 1000), False),
    "needs_next_frames": (is_bool, False),
    "diff_block": (_check_block_field, False),
    "diff_signed": (is_bool, False),  # retired: true is refused (``_refuse_retired``), false loads
    "diff_flow": (is_bool, False),
    "diff_flow_scene": (is_bool, False),
    "state_dicts": (list_of(is_dict, 1, MAX_ENSEMBLE), True),
    "frame_shape": (list_of(int_in(1, MAX_FRAME_SIDE), 3, 3), True),
    "downscale": (int_in(1, MAX_DOWNSCALE), False),
    "input_shape": (optional(list_of(int_in(1, MAX_FRAME_SIDE), 3, 3)), False),
    "n_actions": (int_in(1, MAX_ACTIONS), True),
    "env_id": (optional(text(200)), False),
    "game": (optional(text(200)), False),
    "action_meanings": (optional(list_of(text(64), 1, MAX_ACTIONS)), False),
    "norm_mean": (optional(float_in(-1e30, 1e30)), False),
    "norm_std": (optional(float_in(0.0, 1e30)), False),
    "score_mean": (optional(float_in(-1e30, 1e30)), False),
    "score_std": (optional(float_in(0.0, 1e30)), False),
    "metrics": (optional(plain_values), False),
    "epoch": (optional(int_in(0, 10**9)), False),
    "finished": (is_bool, False),
    "stopped": (text(200), False),
}


def check_reward_checkpoint(ck: dict[str, Any], where: str) -> None:
    """Every field a reward checkpoint of our format carries, in type and range (``REWARD_FIELDS``),
    and every member's weights finite, each member on storages of its own. UserError otherwise."""
    check_ck_fields(ck, REWARD_FIELDS, where)
    if ck["frame_shape"][2] != 3:
        raise UserError(f"{where}: field 'frame_shape' must be (height, width, 3), got {ck['frame_shape']}")
    owner: dict[int, int] = {}
    for k, sd in enumerate(ck["state_dicts"]):
        check_state_dict(sd, f"{where} (member {k})")
        for v in sd.values():
            ptr = v.untyped_storage().data_ptr()
            if v.untyped_storage().nbytes() and owner.setdefault(ptr, k) != k:
                raise UserError(f"{where}: members {owner[ptr]} and {k} share their weights: not a trained ensemble")


def save_reward_checkpoint(ck: dict[str, Any], path: str | os.PathLike) -> None:
    """Write a reward checkpoint; UserError (nothing written) if anything in it is not finite."""
    check_reward_checkpoint(ck, f"refusing to write reward model {path}")
    atomic_torch_save(ck, path, "reward model")


def reward_training_finished(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a reward model whose training ended by itself, so a stage may reuse
    it: False if missing, unreadable or stopped by Ctrl-C (older checkpoints count as finished)."""
    try:
        ck = read_checkpoint(Path(path), "reward model")
    except UserError:
        return False
    return ck.get("finished") is not False


def load_reward_models(
    path: str | os.PathLike, game: str | None = None, n_actions: int | None = None
) -> tuple[list[AnyRewardModel], dict[str, Any]]:
    """Read a reward model checkpoint into trainable models (eval mode) and its dict. UserError with
    one line for any problem, and when it does not fit ``game`` (a ROM name) or ``n_actions``, if
    given. A bare state dict of the book's loads as a full-resolution single model (game unchecked)."""
    path = Path(path)
    ck = read_checkpoint(path, "reward model")
    if (err := wrong_kind(path, ck, "reward")) is not None:
        raise err
    if ck.get("format") == REWARD_FORMAT:
        check_reward_checkpoint(ck, f"reward model {path}")
        states = ck.get("state_dicts")
        try:
            frame_shape = tuple(int(x) for x in ck["frame_shape"])
            downscale = int(ck.get("downscale", 1))
            ck_actions = int(ck["n_actions"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"reward model {path} is incomplete (no frame shape / action count): retrain it") from None
        if not isinstance(states, list) or not states:
            raise UserError(f"reward model {path} holds no weights: retrain it")
        arch = ck.get("arch", "book")  # checkpoints made before the diff net are the book's
        if arch not in ARCHS:
            raise UserError(f"reward model {path} has an unknown network {str(arch)[:40]!r}: made by a newer version?")
        block = ck.get("diff_block", OLD_DIFF_BLOCK)  # diff checkpoints made before the field: 12x12
        flow = ck.get("diff_flow", False)  # made before the field: no scene flow
        scene = ck.get("diff_flow_scene", False)
        _refuse_retired(ck, path)
    elif checkpoint_kind(ck) == "bare reward":
        check_state_dict(ck, f"reward model {path}")
        w = ck["out.0.weight"]
        frame_shape, downscale = FULL_FRAME, 1
        ck_actions = int(w.shape[1]) - math.prod(conv_out_shape(input_shape_of(FULL_FRAME))) if w.ndim == 2 else 0
        if not 1 <= ck_actions <= MAX_ACTIONS:
            raise UserError(f"reward model {path} is a bare state dict that does not fit a full-resolution frame")
        states = [ck]
        ck = {"state_dict_only": True}
        arch, block, flow, scene = "book", DIFF_BLOCK, False, False
    else:
        raise UserError(f"{path} is not a reward model checkpoint (made by 03_reward_train.py)")
    other = trained_elsewhere(ck, game)
    if other is not None:
        raise UserError(
            f"reward model {path} was trained on {other}, not on {game}: use a reward model trained on this game's DB"
        )
    if n_actions is not None and ck_actions != n_actions:
        raise UserError(f"reward model {path} has {ck_actions} actions, the env has {n_actions}: wrong game or model")
    models = []
    for sd in states:
        try:
            m = new_reward_model(arch, ck_actions, frame_shape, downscale, block=block, flow=flow, flow_scene=scene)
        except ValueError as e:
            raise UserError(f"reward model {path}: {e}") from None
        try:
            m.load_state_dict(sd)
        except (RuntimeError, TypeError, AttributeError) as e:
            msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
            raise UserError(f"reward model {path} does not fit the reward network ({msg})") from None
        m.eval()
        models.append(m)
    return models, ck


def _refuse_retired(ck: dict[str, Any], path: Path) -> None:
    """UserError for a diff checkpoint made with a retired lever: ``--encoder`` (``encoder.*``
    weights or its "encoder" field) or ``--diff-signed`` (its "diff_signed" field is true)."""
    keys = (str(k) for sd in ck["state_dicts"] for k in sd)
    if ck.get("encoder") is True or any(k.startswith("encoder.") for k in keys):
        raise UserError(
            f"reward model {path} was trained with --encoder (a policy's conv features), which is retired: "
            f"retrain it without --encoder"
        )
    if ck.get("diff_signed") is True:
        raise UserError(
            f"reward model {path} was trained with --diff-signed (the signed change per block), which is "
            f"retired: retrain it without --diff-signed"
        )


def load_reward_model(
    path: str | os.PathLike,
    game: str | None = None,
    n_actions: int | None = None,
    device: torch.device | str = "cpu",
) -> RewardPredictor:
    """Load a reward model for inference (``RewardPredictor``); UserError as ``load_reward_models``."""
    models, ck = load_reward_models(path, game=game, n_actions=n_actions)
    return RewardPredictor(models, ck, device=resolve_device(device), path=str(path))
