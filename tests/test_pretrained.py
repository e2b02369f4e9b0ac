"""The policy shipped under saves/pretrained/: a v0 a user can fine-tune or probe from at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lib.atari.envs import DEFAULT_ENV
from lib.atari.saved_states import SingleGame
from lib.models.policy import load_policy

ROOT = Path(__file__).resolve().parents[1]
V0 = ROOT / "saves" / "pretrained" / "seaquest-v0-2.25M.pt"


def test_the_shipped_v0_loads_as_a_seaquest_policy_and_acts_on_a_real_frame() -> None:
    game = SingleGame(0)
    net, ck = load_policy(V0, DEFAULT_ENV, "seaquest", (4, 84, 84), len(game.meanings))
    assert tuple(ck["action_meanings"]) == game.meanings
    assert ck["step"] == 2_250_000 and ck["metrics"]["score_mean"] == 716.0
    assert V0.stat().st_size < 8 << 20  # weights in half precision: a few MB in git
    game.reset()
    with torch.no_grad():
        logits, value = net(torch.from_numpy(game.stack[None].copy()))
    assert logits.shape == (1, len(game.meanings)) and torch.isfinite(logits).all() and torch.isfinite(value).all()
    assert float(logits.std()) > 0  # trained weights, not a blank net
    assert next(net.parameters()).dtype == torch.float32  # loaded into the float32 network
    assert np.isfinite(value.numpy()).all()
