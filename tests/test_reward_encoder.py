"""The policy-encoder lever (``03_reward_train.py --encoder POLICY``) and the per-segment feature
cache the diff net trains on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reward_model import _seaquest_frames

from bench.dbs import make_square_db
from lib.errors import UserError
from lib.model import AtariA2C, atomic_torch_save, policy_checkpoint
from lib.oracle import oracle_label_db
from lib.reward_model import (
    FULL_FRAME,
    DiffRewardModel,
    load_encoder,
    load_reward_model,
    reward_checkpoint,
    save_reward_checkpoint,
)
from lib.reward_train import TrainConfig, _build_fit, _returns_of, load_preferences, model_inputs

ROOT = Path(__file__).resolve().parents[1]


def _quiet(_: str) -> None:
    pass


def _policy(path: Path, seed: int = 0, env_id: str = "SeaquestNoFrameskip-v4", game: str = "seaquest") -> AtariA2C:
    torch.manual_seed(seed)
    net = AtariA2C((4, 84, 84), 18)
    atomic_torch_save(policy_checkpoint(net, env_id, game, ("NOOP",) * 18, step=7), path)
    return net


def test_encoder_features_are_the_policys_conv_on_real_frames(tmp_path):
    """On real SeaQuest frames the encoder's features are the policy's conv layers on the stack
    (frame, frame, frame, next frame); the checkpoint carries them and loads back to the same
    predictions; the frozen encoder takes no gradient."""
    frames, actions, _ = _seaquest_frames(30)
    net = _policy(tmp_path / "policy.pt")
    model = DiffRewardModel(18, FULL_FRAME, encoder=True)
    model.encoder.load_state_dict(load_encoder(tmp_path / "policy.pt", "seaquest"))
    x = torch.from_numpy(DiffRewardModel.prepare(frames[:-1], frames[1:]))
    f = model.features(x)
    assert f.shape == (30, 2 * 21 * 7 + 3136)
    stack = torch.cat([x[:, :1]] * 3 + [x[:, 1:]], dim=1)
    with torch.no_grad():
        want = net.conv(stack.float() / 255.0)
    torch.testing.assert_close(f[:, 294:], want)
    assert want.std() > 0
    torch.testing.assert_close(f[:, :294], DiffRewardModel(18, FULL_FRAME).features(x))

    model.fit_scale(x)
    out = model(x, torch.from_numpy(actions))
    out.sum().backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert model.out[0].weight.grad is not None and model.out[0].weight.grad.abs().sum() > 0

    model.eval()
    path = tmp_path / "r.pt"
    save_reward_checkpoint(reward_checkpoint([model], "SeaquestNoFrameskip-v4", "seaquest", None), path)
    assert torch.load(path, weights_only=True)["encoder"] is True
    rm = load_reward_model(path, game="seaquest", n_actions=18)
    with torch.no_grad():
        ref = model(x, torch.from_numpy(actions)).numpy()
    np.testing.assert_allclose(rm.predict(frames[:-1], actions, frames[1:]), ref, rtol=1e-4, atol=1e-5)
    # the encoder's weights are what the prediction depends on: another policy, another answer
    other = DiffRewardModel(18, FULL_FRAME, encoder=True)
    other.load_state_dict(model.state_dict())
    other.encoder.load_state_dict(load_encoder(tmp_path / "policy.pt", "seaquest") | {"0.bias": torch.ones(32)})
    assert not np.allclose(other(x, torch.from_numpy(actions)).detach().numpy(), ref)


def test_encoder_files_that_do_not_fit_are_one_line(tmp_path):
    _policy(tmp_path / "breakout.pt", env_id="BreakoutNoFrameskip-v4", game="breakout")
    with pytest.raises(UserError, match="--encoder: .*breakout"):
        load_encoder(tmp_path / "breakout.pt", "seaquest")
    model = DiffRewardModel(18)
    save_reward_checkpoint(reward_checkpoint([model], "SeaquestNoFrameskip-v4", "seaquest", None), tmp_path / "r.pt")
    with pytest.raises(UserError, match="--encoder: .*is a reward model"):
        load_encoder(tmp_path / "r.pt", "seaquest")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="corrupt"):
        load_encoder(tmp_path / "junk.pt", "seaquest")
    torch.save({"format": "rlhf-atari-policy", "state_dict": {"conv.0.weight": torch.zeros(1)}}, tmp_path / "odd.pt")
    with pytest.raises(UserError, match="--encoder"):
        load_encoder(tmp_path / "odd.pt", "seaquest")
    # the book's bare A2C state dict is a policy too
    net = _policy(tmp_path / "p.pt", seed=3)
    torch.save(net.state_dict(), tmp_path / "bare.pt")
    sd = load_encoder(tmp_path / "bare.pt", "seaquest")
    torch.testing.assert_close(sd["0.weight"], net.conv[0].weight)


@pytest.fixture
def square_db(tmp_path: Path) -> Path:
    db = tmp_path / "db"
    make_square_db(db, n_segments=30, steps=10, seed=1)
    oracle_label_db(db, 20, seed=0)
    return db


def test_cached_features_give_each_models_own_returns(square_db, tmp_path):
    """Training reads a diff net's features from a per-segment cache; a model with another mask or
    encoder gets its own features, and returns equal the model's own forward pass."""
    data = load_preferences([square_db], log=_quiet)
    _policy(tmp_path / "policy.pt")
    a, b = data.first[:5], data.second[:5]
    segs, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    dev = torch.device("cpu")
    x, acts, owner = model_inputs(data, segs, "diff")
    cfgs = [
        TrainConfig(arch="diff", seed=0),
        TrainConfig(arch="diff", seed=0, mask_rows=40),
        TrainConfig(arch="diff", seed=0, encoder=str(tmp_path / "policy.pt")),
    ]
    seen = []
    for cfg in cfgs:
        model = _build_fit(data, cfg).models[0].eval()
        with torch.no_grad():
            r1, r2 = _returns_of(model, data, a, b, dev)
            per_step = model(torch.from_numpy(x), torch.from_numpy(acts)).numpy()
        want = np.bincount(owner, weights=per_step, minlength=len(segs))
        np.testing.assert_allclose(r1.numpy(), want[inv[:5]], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(r2.numpy(), want[inv[5:]], rtol=1e-4, atol=1e-4)
        seen.append(model.feature_key())
    assert len(set(seen)) == 3
    assert len(data.feature_cache) == 3 * len(segs)


def test_encoder_needs_the_diff_net(square_db, tmp_path):
    data = load_preferences([square_db], log=_quiet)
    with pytest.raises(UserError, match="--encoder applies to --arch diff only"):
        _build_fit(data, TrainConfig(arch="book", encoder=str(tmp_path / "policy.pt")))
    with pytest.raises(UserError, match="not found"):
        _build_fit(data, TrainConfig(arch="diff", encoder=str(tmp_path / "missing.pt")))


@pytest.mark.slow
def test_cli_trains_with_a_frozen_encoder_and_evaluates_it(square_db, tmp_path):
    net = _policy(tmp_path / "policy.pt", seed=2)
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", "enc", "-o", str(out), str(square_db)]
    cmd += ["--encoder", str(tmp_path / "policy.pt"), "--epochs", "2", "--no-progress"]
    cmd += ["--runs-dir", str(tmp_path / "runs")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ck = torch.load(out / "reward-enc.pt", weights_only=True)
    assert ck["encoder"] is True
    sd = ck["state_dicts"][0]
    for k, v in net.conv.state_dict().items():
        torch.testing.assert_close(sd[f"encoder.{k}"], v)  # frozen through training
    ev = subprocess.run(
        [sys.executable, str(ROOT / "03_reward_train.py"), "--evaluate", str(out / "reward-enc.pt"), str(square_db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ev.returncode == 0, ev.stderr
    assert "oracle agreement" in ev.stdout
    bad = subprocess.run(cmd[:7] + ["--encoder", str(out / "reward-enc.pt")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "is a reward model" in bad.stderr and "Traceback" not in bad.stderr


def test_patience_defaults_to_the_archs(square_db, tmp_path):
    """No --patience: 20 for the diff net (its epochs are cheap), the book's 4 for the book's net;
    a given one wins; the checkpoint's config says which was used."""
    data = load_preferences([square_db], log=_quiet)
    assert _build_fit(data, TrainConfig(arch="diff")).cfg.patience == 20
    assert _build_fit(data, TrainConfig(arch="book")).cfg.patience == 4
    assert _build_fit(data, TrainConfig(arch="diff", patience=3)).cfg.patience == 3
    with pytest.raises(UserError, match="--patience must be at least 1"):
        _build_fit(data, TrainConfig(arch="diff", patience=0))
    from lib.reward_train import train_reward_model

    res = train_reward_model(data, TrainConfig(arch="diff", epochs=2), tmp_path / "r.pt", progress=False, log=_quiet)
    assert torch.load(res.path, weights_only=True)["config"]["patience"] == 20
