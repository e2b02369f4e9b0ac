"""A fine-tune's frozen trunk runs once per state: the learner takes the acting forward's features
and runs the heads alone. The update must be the one the full forward gives, and a run's own
features must be those of the state whose action is learned (not the step before or after)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from test_a2c_loop import PRECISION, FakeVec, config

import lib.a2c.train as a2c
from lib.a2c.experience import BOOT_FINAL, BOOT_NEXT, BOOT_NONE, NStepCollector, Transitions
from lib.a2c.run import resolve_precision
from lib.models.policy import AtariA2C, StartPolicy

CPU = torch.device("cpu")
ENVS = 16  # the acting forward's batch, as stage 1 runs it
# Kept features are computed at the acting forward's batch size, the learner's at 128. On a CPU with
# native bf16 (2026-12) both paths agreed bit for bit in fp32 and bf16; the tolerance is for a kernel
# that picks another algorithm per batch size: fp32 sums in another order (1e-6), bf16 rounds each
# feature to 8 bits of mantissa, one unit in the last place 4e-3 of it.
TOL = {"fp32": dict(rtol=1e-5, atol=1e-6), "bf16": dict(rtol=5e-3, atol=1e-3)}


def frozen_net(obs_shape: tuple[int, ...], n_actions: int, seed: int = 0) -> AtariA2C:
    torch.manual_seed(seed)
    net = AtariA2C(obs_shape, n_actions)
    net.freeze_conv()
    net.conv.to(memory_format=torch.channels_last)  # as stage 1 runs it on a CPU
    return net


def a_batch(net: AtariA2C, n: int, bf16: bool, rng: np.random.Generator) -> Transitions:
    """``n`` transitions whose features come from ``act`` in batches of ENVS, as the loop keeps them."""
    obs = rng.integers(0, 255, (n, *net.obs_shape), dtype=np.uint8)
    kept = [
        a2c.act(net, obs[i : i + ENVS], CPU, bf16, rng.random(ENVS), keep_features=True)[2] for i in range(0, n, ENVS)
    ]
    return Transitions(
        obs=obs,
        actions=rng.integers(0, net.n_actions, n).astype(np.int64),
        returns=rng.normal(size=n).astype(np.float32),
        discount=np.full(n, 0.99**5, np.float32),
        steps=np.full(n, 5, np.int64),
        boot_mode=np.full(n, BOOT_NEXT, np.int8),
        boot_obs=obs.copy(),
        env=np.arange(n) % ENVS,
        marked=rng.random(n) < 0.3,
        features=torch.cat(kept),
    )


def heads_of(net: AtariA2C) -> list[torch.nn.Parameter]:
    return [p for p in net.parameters() if p.requires_grad]


def loss_and_grads(net: AtariA2C, batch: Transitions, boot: np.ndarray, bf16: bool, **kw) -> tuple:
    loss, m = a2c.a2c_loss(net, batch, boot, CPU, 0.01, bf16, **kw)
    return loss, m, torch.autograd.grad(loss, heads_of(net), retain_graph=True)


def assert_same_update(got: tuple, want: tuple, precision: str) -> None:
    """(loss, metrics, head gradients) of the kept-features path against the full forward's."""
    tol = TOL[precision]
    torch.testing.assert_close(got[0], want[0], **tol)
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        assert got[1][k] == pytest.approx(want[1][k], rel=tol["rtol"], abs=tol["atol"]), k
    for g, w in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(g, w, rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(w.abs().max())))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_kept_features_give_the_full_forwards_loss_and_head_gradients(precision: str) -> None:
    """One batch of 128 at the real input size, with the start policy's KL in the loss: the heads
    on the acting forward's features give the loss, the metrics (KL, KL on low-gauge steps) and the
    head gradients of the learner's own trunk forward."""
    bf16 = precision == "bf16"
    net = frozen_net((4, 84, 84), 18)
    start_net = copy.deepcopy(net)
    with torch.no_grad():
        for p in start_net.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a start policy the trained one has moved away from
    start = StartPolicy(start_net)
    assert start.shared  # the frozen trunk is the start policy's too: one set of features serves both
    rng = np.random.default_rng(0)
    batch = a_batch(net, 128, bf16, rng)
    assert batch.features.dtype == (torch.bfloat16 if bf16 else torch.float32)
    boot = rng.normal(size=128).astype(np.float32)
    trunk_runs: list[int] = []
    net.conv.register_forward_hook(lambda *_: trunk_runs.append(1))
    want = loss_and_grads(net, dataclasses.replace(batch, features=None), boot, bf16, start=start, kl_beta=0.5)
    assert len(trunk_runs) == 1
    got = loss_and_grads(net, batch, boot, bf16, start=start, kl_beta=0.5)
    assert len(trunk_runs) == 1  # the kept features' path runs the heads alone
    assert "finetune/kl_marked" in got[1] and got[1]["finetune/kl_to_start"] > 1e-4
    assert_same_update(got, want, precision)
    # the comparison sees a mistake of the kind the loop could make: another state's features
    shifted = dataclasses.replace(batch, features=batch.features.roll(1, dims=0))
    with pytest.raises(AssertionError):
        assert_same_update(loss_and_grads(net, shifted, boot, bf16, start=start, kl_beta=0.5), want, precision)


def test_kept_features_are_refused_where_the_trunk_trains() -> None:
    """Features kept from a trunk that learns would leave it without gradient: refused."""
    net = frozen_net((4, 84, 84), 6)
    batch = a_batch(net, 16, False, np.random.default_rng(0))
    for p in net.conv.parameters():
        p.requires_grad_(True)
    with pytest.raises(ValueError, match="conv layers train"):
        a2c.a2c_loss(net, batch, np.zeros(16, np.float32), CPU, 0.01)


def test_the_collector_gives_each_transition_its_first_states_features() -> None:
    """n-step transitions are emitted late (n steps on, or at an episode's end): each carries the
    features kept for the state it started in, the one whose action it learns."""
    n, envs = 3, 2
    col = NStepCollector(envs, (1,), n, 0.5)
    out = []
    for t in range(10):
        obs = np.full((envs, 1), t, dtype=np.uint8)
        fx = torch.tensor([[t, e] for e in range(envs)], dtype=torch.float32)  # names its step and env
        ends = np.array([t == 4, False])  # env 0's episode ends at step 4: its last transitions come early
        cut = np.array([False, t == 6])  # env 1's is truncated at step 6: they bootstrap from its final obs
        out.append(col.add(obs, np.zeros(envs, np.int64), np.ones(envs), ends, cut, obs, obs + 100, None, fx))
    tr = Transitions.concat(out)
    assert len(tr) > 10 and {BOOT_NONE, BOOT_NEXT, BOOT_FINAL} <= set(tr.boot_mode)
    np.testing.assert_array_equal(tr.features[:, 0].numpy(), tr.obs[:, 0])
    np.testing.assert_array_equal(tr.features[:, 1].numpy(), tr.env)


# --- in the loop --------------------------------------------------------------------------------


def v0(tmp_path: Path) -> str:
    """A policy to fine-tune: the best checkpoint of a short run on the fake game."""
    assert a2c.train(config(tmp_path / "v0", max_steps=280, test_every=280, test_episodes=2), make_env=FakeVec) == 0
    (best,) = (tmp_path / "v0" / "saves").glob("best_*.pt")
    return str(best)


def spy_checking_the_kept_features(monkeypatch: pytest.MonkeyPatch, precision: str) -> list[Transitions]:
    """Every update's loss and head gradients are also computed with the trunk run again on the
    batch's frames, and must agree; returns the batches seen."""
    seen: list[Transitions] = []
    real_loss = a2c.a2c_loss

    def spy(net, batch, boot_values, device, beta, bf16=False, weight=1.0, start=None, kl_beta=0.0, **kw):
        seen.append(batch)
        args = (boot_values, device, beta, bf16, weight, start, kl_beta)
        if batch.features is not None:
            full = real_loss(net, dataclasses.replace(batch, features=None), *args)
            want = (*full, torch.autograd.grad(full[0], heads_of(net)))
            loss, m = real_loss(net, batch, *args)
            assert_same_update((loss, m, torch.autograd.grad(loss, heads_of(net), retain_graph=True)), want, precision)
            return loss, m
        return real_loss(net, batch, *args)

    monkeypatch.setattr(a2c, "a2c_loss", spy)
    return seen


def todays_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The acting forward keeps no features: the learner runs the frozen trunk again."""
    real_act = a2c.act

    def act(net, obs, device, bf16, uniforms, keep_features=False):
        return real_act(net, obs, device, bf16, uniforms)

    monkeypatch.setattr(a2c, "act", act)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_fine_tune_learns_from_the_acting_forwards_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """--finetune: every batch carries the kept features of its first states, and each update is the
    full forward's (the fake game's states all differ, so features of another step would show); the
    KL to the start policy comes from the same features. The run ends where today's path ends."""
    model = v0(tmp_path)
    kw = dict(model=model, finetune=True, lr=3e-3, max_steps=400, kl=1.0, precision=precision)
    seen = spy_checking_the_kept_features(monkeypatch, precision)
    assert a2c.train(config(tmp_path / "new", **kw), make_env=FakeVec) == 0
    assert len(seen) >= 3 and all(b.features is not None for b in seen)
    todays_path(monkeypatch)
    seen.clear()
    assert a2c.train(config(tmp_path / "today", **kw), make_env=FakeVec) == 0
    assert len(seen) >= 3 and all(b.features is None for b in seen)
    new, today = (torch.load(tmp_path / d / "saves" / "last.pt", weights_only=True) for d in ("new", "today"))
    tol = TOL[precision]
    for k, v in today["state_dict"].items():
        torch.testing.assert_close(new["state_dict"][k], v, rtol=tol["rtol"], atol=tol["atol"] * 10)


def test_without_finetune_the_learner_runs_the_trunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run from -m whose conv layers train (no --finetune) keeps no features."""
    model = v0(tmp_path)
    seen = spy_checking_the_kept_features(monkeypatch, "fp32")
    assert a2c.train(config(tmp_path / "ft", model=model, lr=3e-3, max_steps=300), make_env=FakeVec) == 0
    assert seen and all(b.features is None for b in seen)


def test_a_last_pt_from_todays_path_resumes_into_kept_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fine-tune's last.pt written while the learner ran the trunk again (no kept features: the
    file holds none either way) resumes frozen, with kept features, from the start policy it kept."""
    model = v0(tmp_path)
    todays_path(monkeypatch)
    cfg = config(tmp_path, model=model, finetune=True, lr=3e-3, max_steps=400, kl=1.0)
    assert a2c.train(cfg, make_env=FakeVec) == 0
    monkeypatch.undo()
    seen = spy_checking_the_kept_features(monkeypatch, resolve_precision(PRECISION, CPU))
    more = config(tmp_path, max_steps=800, kl=1.0, resume=True)
    assert a2c.train(more, make_env=FakeVec) == 0
    assert len(seen) >= 2 and all(b.features is not None for b in seen)
    last = torch.load(tmp_path / "saves" / "last.pt", weights_only=True)
    assert last["progress"]["step"] == 800 and last["finetune"] is True
