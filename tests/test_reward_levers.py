"""The reward model's optional levers: SURF's temporal cropping and pseudo-labels, weight decay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.dbs import make_square_db
from lib.errors import UserError
from lib.oracle import oracle_label_db
from lib.reward_model import load_reward_model
from lib.reward_train import (
    TrainConfig,
    _build_fit,
    _returns_of,
    crop_weights,
    load_preferences,
    model_inputs,
    pseudo_step,
)

ROOT = Path(__file__).resolve().parents[1]


def _quiet(_: str) -> None:
    pass


@pytest.fixture
def square_db(tmp_path: Path) -> tuple[Path, list[str]]:
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=40, steps=10, seed=0)
    return db, rels


@pytest.mark.parametrize("seed", range(5))
def test_crop_weights_are_one_window_of_one_length_per_segment(seed):
    lengths = np.array([10, 12, 8])
    w = crop_weights(lengths, 3, np.random.default_rng(seed))
    assert w.shape == (30,) and set(np.unique(w)) <= {0.0, 1.0}
    parts = np.split(w, np.cumsum(lengths)[:-1])
    sizes = {int(p.sum()) for p in parts}
    assert len(sizes) == 1 and 5 <= sizes.pop() <= 8  # the shortest segment's 8 steps, up to 3 fewer
    for p in parts:
        ones = np.flatnonzero(p)
        assert (np.diff(ones) == 1).all()  # contiguous


def test_crop_windows_move_and_shrink():
    rng = np.random.default_rng(0)
    starts, sizes = set(), set()
    for _ in range(50):
        w = crop_weights(np.array([10]), 4, rng)
        starts.add(int(np.flatnonzero(w)[0]))
        sizes.add(int(w.sum()))
    assert sizes == {6, 7, 8, 9, 10} and len(starts) > 2


def test_cropped_return_sums_a_window_of_the_per_step_predictions(square_db):
    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet)
    fit = _build_fit(data, TrainConfig(arch="diff", seed=0))
    model = fit.models[0].eval()
    a, b = data.first[:4], data.second[:4]
    dev = torch.device("cpu")
    segs, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    # a seed whose window is shorter than the segments, so that cropping shows
    seed = next(
        s
        for s in range(100)
        if crop_weights(data.lengths[segs], 4, np.random.default_rng(s)).sum() < data.lengths[segs].sum()
    )
    w = crop_weights(data.lengths[segs], 4, np.random.default_rng(seed))
    with torch.no_grad():
        full1, full2 = _returns_of(model, data, a, b, dev)
        crop1, crop2 = _returns_of(model, data, a, b, dev, rng=np.random.default_rng(seed), crop=4)
        x, acts, owner = model_inputs(data, segs, "diff")
        per_step = model(torch.from_numpy(x), torch.from_numpy(acts)).numpy()
    want = np.bincount(owner, weights=per_step * w, minlength=len(segs))
    full = np.bincount(owner, weights=per_step, minlength=len(segs))
    np.testing.assert_allclose(crop1.numpy(), want[inv[:4]], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(crop2.numpy(), want[inv[4:]], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(full1.numpy(), full[inv[:4]], rtol=1e-4, atol=1e-5)
    assert not np.allclose(want, full)


def test_unlabeled_segments_are_read_only_when_asked(square_db):
    db, rels = square_db
    oracle_label_db(db, 6, seed=0)
    labeled = load_preferences([db], log=_quiet)
    assert labeled.unlabeled == 0 and labeled.n_segments <= 12
    both = load_preferences([db], log=_quiet, unlabeled=True)
    assert both.n_segments == len(rels) == 40
    assert both.unlabeled == 40 - labeled.n_segments
    # the labeled pairs point at the same segments either way
    assert [both.names[i] for i in both.first] == [labeled.names[i] for i in labeled.first]


def test_pseudo_labels_train_only_on_confident_pairs(square_db):
    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet, unlabeled=True)
    fit = _build_fit(data, TrainConfig(arch="diff", seed=0, pseudo_tau=0.999999))
    model = fit.models[0]
    used, loss = pseudo_step(fit, model, 16)  # a fresh model is sure of nothing
    assert used == 0 and loss == 0.0
    assert all(p.grad is None for p in model.parameters())

    fit = _build_fit(data, TrainConfig(arch="diff", seed=0, pseudo_tau=0.5))
    model = fit.models[0]
    used, loss = pseudo_step(fit, model, 16)  # every pair is at least 50% sure of its answer
    assert used == 16 and loss > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_pseudo_labels_sharpen_the_models_own_answers(square_db):
    """Trained on its own confident answers only, a model grows surer of them (the sign of the term)."""
    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet, unlabeled=True)
    fit = _build_fit(data, TrainConfig(arch="diff", seed=0, pseudo_tau=0.5, lr=1e-2))
    model, opt = fit.models[0], fit.opts[0]
    a, b = np.arange(0, 20), np.arange(20, 40)
    dev = torch.device("cpu")
    with torch.no_grad():
        before = (_returns_of(model, data, a, b, dev)[0] - _returns_of(model, data, a, b, dev)[1]).abs().mean()
    for _ in range(20):
        opt.zero_grad()
        pseudo_step(fit, model, 32)
        opt.step()
    with torch.no_grad():
        r1, r2 = _returns_of(model, data, a, b, dev)
    assert (r1 - r2).abs().mean() > 2 * before


def test_weight_decay_picks_adamw(square_db):
    db, _ = square_db
    oracle_label_db(db, 10, seed=0)
    data = load_preferences([db], log=_quiet)
    fit = _build_fit(data, TrainConfig(arch="diff", seed=0, weight_decay=0.01, ensemble=2))
    assert all(isinstance(o, torch.optim.AdamW) and o.param_groups[0]["weight_decay"] == 0.01 for o in fit.opts)
    fit = _build_fit(data, TrainConfig(arch="diff", seed=0))
    assert type(fit.opts[0]) is torch.optim.Adam and fit.opts[0].param_groups[0]["weight_decay"] == 0


@pytest.mark.parametrize(
    "cfg, msg",
    [
        (TrainConfig(weight_decay=-1), "--weight-decay"),
        (TrainConfig(pseudo_tau=0.3), "--pseudo-labels"),
        (TrainConfig(pseudo_tau=1.0), "--pseudo-labels"),
        (TrainConfig(pseudo_weight=-1), "--pseudo-weight"),
        (TrainConfig(crop=-2), "--crop"),
    ],
)
def test_bad_lever_settings_are_one_line(square_db, cfg, msg):
    db, _ = square_db
    oracle_label_db(db, 10, seed=0)
    data = load_preferences([db], log=_quiet)
    with pytest.raises(UserError, match=msg):
        _build_fit(data, cfg)


@pytest.mark.slow
def test_cli_trains_with_every_lever_and_keeps_them_in_the_checkpoint(square_db, tmp_path):
    db, _ = square_db
    oracle_label_db(db, 30, seed=0)
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", "levers", "-o", str(tmp_path / "out"), str(db)]
    cmd += ["--pseudo-labels", "0.9", "--crop", "3", "--weight-decay", "1e-3", "--epochs", "3", "--no-progress"]
    cmd += ["--runs-dir", str(tmp_path / "runs")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "segments in no label, for pseudo-labels" in r.stdout
    ck = torch.load(tmp_path / "out" / "reward-levers.pt", weights_only=True)
    c = ck["config"]
    assert (c["pseudo_tau"], c["crop"], c["weight_decay"]) == (0.9, 3, 1e-3)
    assert load_reward_model(tmp_path / "out" / "reward-levers.pt").arch == "diff"
    bad = subprocess.run(cmd[:6] + ["--pseudo-labels", "0.2"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--pseudo-labels" in bad.stderr and "Traceback" not in bad.stderr
