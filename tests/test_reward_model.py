"""The reward model: Bradley-Terry loss, the book's architecture, lean inference, checkpoints."""

from __future__ import annotations

import math
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lib.core.errors import UserError
from lib.models.policy import AtariA2C, policy_checkpoint, policy_conv
from lib.models.reward import (
    FLOW_FEATURES,
    FULL_FRAME,
    DiffRewardModel,
    LeanRewardNet,
    RewardModel,
    load_reward_model,
    load_reward_models,
    preference_loss,
    reward_checkpoint,
    reward_input,
    save_reward_checkpoint,
    segment_next_frames,
    step_next_frames,
)
from lib.store.checkpoints import atomic_torch_save

ROOT = Path(__file__).resolve().parents[1]
SMALL = (48, 48, 3)


def _grads(r1: float, r2: float, mu: float, noise: float = 0.0) -> tuple[float, float]:
    a = torch.tensor([r1], requires_grad=True)
    b = torch.tensor([r2], requires_grad=True)
    loss, _ = preference_loss(a, b, torch.tensor([mu]), noise)
    loss.backward()
    return float(a.grad), float(b.grad)


def _randomise_bn(model: RewardModel, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(16, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(16, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(16, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(16, generator=g) - 0.5)


# --- loss ------------------------------------------------------------------------------------


def test_tie_pulls_returns_together():
    # R1 > R2 with a tie: gradient descent lowers R1 and raises R2 -- towards each other,
    # not both towards 0 as the book's separate BCE on each return does.
    g1, g2 = _grads(3.0, 1.0, 0.5)
    assert g1 > 0 > g2
    assert g1 == pytest.approx(-g2)
    # both returns positive and equal: a tie is already satisfied (zero gradient)
    g1, g2 = _grads(2.0, 2.0, 0.5)
    assert g1 == pytest.approx(0.0) and g2 == pytest.approx(0.0)
    # the book's loss on the same tie pushes both returns down (not what the paper means)
    r = torch.tensor([2.0, 2.0], requires_grad=True)
    F.binary_cross_entropy_with_logits(r, torch.tensor([0.5, 0.5])).backward()
    assert (r.grad > 0).all()


@pytest.mark.parametrize("noise", [0.0, 0.1])
@pytest.mark.parametrize("mu", [1.0, 0.0, 0.5])
def test_swapping_the_pair_flips_the_answer(mu: float, noise: float):
    r1, r2 = torch.tensor([1.5, -0.3]), torch.tensor([0.2, 0.7])
    mus = torch.tensor([mu, mu])
    a, _ = preference_loss(r1, r2, mus, noise)
    b, _ = preference_loss(r2, r1, 1.0 - mus, noise)
    assert float(a) == pytest.approx(float(b))


def test_loss_is_bradley_terry():
    r1, r2, mu = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 0.5, 0.0])
    loss, m = preference_loss(r1, r2, mu)
    p = torch.sigmoid(r1 - r2)
    expected = -(mu * torch.log(p) + (1 - mu) * torch.log(1 - p)).mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert m["accuracy"] == 1.0 and m["decided"] == 2.0  # the tie is not counted


def test_noise_changes_the_gradient_and_bounds_the_loss():
    # the model is very sure the labelled-better segment is worse
    g_plain, _ = _grads(-10.0, 0.0, 1.0)
    g_noise, _ = _grads(-10.0, 0.0, 1.0, noise=0.1)
    assert g_plain < 0 and g_noise < 0
    assert abs(g_noise) < 0.01 * abs(g_plain)  # p' >= 0.05: a confident mistake stops pulling hard
    loss, _ = preference_loss(torch.tensor([-50.0]), torch.tensor([0.0]), torch.tensor([1.0]), 0.1)
    assert float(loss) == pytest.approx(-math.log(0.05), rel=1e-4)
    # p' = 0.9 p + 0.05 exactly
    d = torch.tensor([0.7])
    loss, _ = preference_loss(d, torch.tensor([0.0]), torch.tensor([1.0]), 0.1)
    assert float(loss) == pytest.approx(-math.log(0.9 * float(torch.sigmoid(d)) + 0.05), rel=1e-5)


def test_loss_rejects_wrong_shapes():
    with pytest.raises(ValueError, match=r"shape \(P,\)"):
        preference_loss(torch.zeros(3), torch.zeros(2), torch.zeros(3))


# --- architecture and lean inference ---------------------------------------------------------


def test_architecture_is_the_books():
    m = RewardModel(18)
    assert m.input_shape == (3, 210, 160)
    assert m.conv_out_shape == (16, 28, 20)
    keys = list(m.state_dict())
    assert keys[:2] == ["conv.0.weight", "conv.0.bias"] and "conv.13.running_var" in keys
    assert m.state_dict()["out.0.weight"].shape == (64, 16 * 28 * 20 + 18)
    drops = [x for x in m.conv if isinstance(x, torch.nn.Dropout)]
    assert len(drops) == 4 and all(d.p == 0.5 for d in drops)


@pytest.mark.parametrize("frame_shape,downscale", [(FULL_FRAME, 1), (FULL_FRAME, 2), (SMALL, 1)])
def test_lean_net_equals_eval_model(frame_shape: tuple[int, int, int], downscale: int):
    torch.manual_seed(0)
    m = RewardModel(18, frame_shape, downscale)
    _randomise_bn(m)
    m.eval()
    frames = torch.randint(0, 256, (5, *frame_shape), dtype=torch.uint8)
    actions = torch.randint(0, 18, (5,))
    with torch.no_grad():
        ref = m(frames, actions)
    lean = LeanRewardNet(m).to(memory_format=torch.channels_last)
    with torch.inference_mode():
        out = lean(frames, actions)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_too_small_frames_are_refused():
    with pytest.raises(ValueError, match="too small"):
        RewardModel(18, (30, 30, 3))


# --- checkpoints -----------------------------------------------------------------------------


def _save(tmp_path, models, name="r.pt", **kw):
    ck = reward_checkpoint(
        models,
        "SeaquestNoFrameskip-v4",
        "seaquest",
        ["NOOP"] * models[0].n_actions,
        norm_mean=0.25,
        norm_std=2.0,
        metrics={"test_loss": 0.5, "x": float("nan")},
        **kw,
    )
    path = tmp_path / name
    save_reward_checkpoint(ck, path)
    return path


@pytest.mark.parametrize("k", [1, 3])
def test_checkpoint_round_trip(tmp_path, k: int):
    torch.manual_seed(1)
    models = [RewardModel(18, SMALL) for _ in range(k)]
    for i, m in enumerate(models):
        _randomise_bn(m, i)
        m.eval()
    path = _save(tmp_path, models)
    ck = torch.load(path, weights_only=True)  # plain dict, safe to load
    assert ck["env_id"] == "SeaquestNoFrameskip-v4" and ck["n_actions"] == 18 and ck["input_shape"] == [3, 48, 48]
    assert ck["metrics"]["x"] is None
    rm = load_reward_model(path, game="seaquest", n_actions=18)
    assert (rm.env_id, rm.game, rm.n_actions, rm.ensemble) == ("SeaquestNoFrameskip-v4", "seaquest", 18, k)
    assert (rm.norm_mean, rm.norm_std, rm.has_norm_stats) == (0.25, 2.0, True)
    frames = np.random.default_rng(0).integers(0, 256, (600, *SMALL), dtype=np.uint8)
    actions = np.random.default_rng(1).integers(0, 18, 600)
    with torch.no_grad():
        ref = torch.stack([m(torch.from_numpy(frames), torch.from_numpy(actions)) for m in models]).mean(0)
    out = rm.predict(frames, actions)  # 600 > chunk: chunked internally
    assert out.shape == (600,) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="frames must have shape"):
        rm.predict(frames[:, :40], actions)


def test_books_bare_state_dict_loads(tmp_path):
    torch.manual_seed(2)
    m = RewardModel(18)
    _randomise_bn(m)
    m.eval()
    path = tmp_path / "reward-book.dat"
    torch.save(m.state_dict(), path)  # what the book's 03_reward_train.py writes
    rm = load_reward_model(path, game="seaquest", n_actions=18)
    assert rm.n_actions == 18 and rm.frame_shape == FULL_FRAME and not rm.has_norm_stats
    assert (rm.norm_mean, rm.norm_std) == (0.0, 1.0)
    frames = np.random.default_rng(0).integers(0, 256, (3, *FULL_FRAME), dtype=np.uint8)
    actions = np.array([0, 5, 17])
    with torch.no_grad():
        ref = m(torch.from_numpy(frames), torch.from_numpy(actions)).numpy()
    np.testing.assert_allclose(rm.predict(frames, actions), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(UserError, match="has 18 actions, the env has 6"):
        load_reward_model(path, n_actions=6)


def test_load_errors_are_one_line(tmp_path):
    models = [RewardModel(18, SMALL).eval()]
    good = _save(tmp_path, models)
    cases = {}
    with pytest.raises(UserError) as e:
        load_reward_model(tmp_path / "nope.pt")
    cases["missing"] = str(e.value)
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(UserError) as e:
        load_reward_model(bad)
    cases["corrupt"] = str(e.value)
    pol = tmp_path / "policy.pt"
    atomic_torch_save(
        policy_checkpoint(AtariA2C((4, 84, 84), 18), "SeaquestNoFrameskip-v4", "seaquest", ("NOOP",) * 18), pol
    )
    with pytest.raises(UserError) as e:
        load_reward_model(pol)
    cases["policy"] = str(e.value)
    book_policy = tmp_path / "book-policy.dat"
    torch.save(AtariA2C((4, 84, 84), 18).state_dict(), book_policy)
    with pytest.raises(UserError) as e:
        load_reward_model(book_policy)
    cases["bare policy"] = str(e.value)
    with pytest.raises(UserError) as e:
        load_reward_model(good, game="breakout", n_actions=4)
    cases["game"] = str(e.value)
    with pytest.raises(UserError) as e:
        load_reward_models(good, game="seaquest", n_actions=6)
    cases["actions"] = str(e.value)
    assert "not found" in cases["missing"]
    assert "corrupt" in cases["corrupt"]
    assert "is a policy, not a reward model" in cases["policy"]
    assert "not a reward model" in cases["bare policy"]
    assert "trained on SeaquestNoFrameskip-v4, not on breakout" in cases["game"]
    assert "has 18 actions, the env has 6" in cases["actions"]
    for msg in cases.values():
        assert "\n" not in msg


def test_cuda_without_gpu_is_a_user_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from lib.models.policy import resolve_device

    with pytest.raises(UserError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_the_frame_each_step_led_to():
    frames = np.arange(5, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 2, 3), np.uint8)
    ended = np.array([False, True, False, False, False])
    # within a clip: the next frame; the last step and a game-ending step: their own frame
    assert segment_next_frames(frames, ended)[:, 0, 0, 0].tolist() == [1, 1, 3, 4, 4]
    assert segment_next_frames(frames)[:, 0, 0, 0].tolist() == [1, 2, 3, 4, 4]
    before, after = frames[:3], frames[2:]
    assert step_next_frames(before, after, np.array([False, True, False]))[:, 0, 0, 0].tolist() == [2, 1, 4]
    assert step_next_frames(before, after, np.zeros(3, bool)) is after


def _seaquest_frames(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n + 1 real SeaQuest frames of random play (a few seconds), and the actions."""
    from lib.atari.envs import AtariVec

    env = AtariVec(n_envs=1, seed=4)
    env.reset()
    rng = np.random.default_rng(0)
    frames, actions = [env.frames[0].copy()], rng.integers(0, env.n_actions, n)
    for a in actions:
        env.step(np.array([a]))
        frames.append(env.frames[0].copy())
    env.close()
    return np.stack(frames), actions, np.array(env.action_meanings)


def test_diff_checkpoint_round_trip_on_real_frames(tmp_path):
    frames, actions, _ = _seaquest_frames(40)
    torch.manual_seed(3)
    models = [DiffRewardModel(18, FULL_FRAME, mask_rows=10) for _ in range(2)]
    x = torch.from_numpy(reward_input("diff", frames[:-1], frames[1:]))
    assert x.shape == (40, 2, 84, 84) and x.dtype == torch.uint8
    for m in models:
        m.scale_to(m.features(x))
        m.eval()
    assert (models[0].scale > 0).any() and (models[0].scale == 0).any()  # the masked rows never vary
    path = _save(tmp_path, models)
    ck = torch.load(path, weights_only=True)
    assert ck["arch"] == "diff" and ck["needs_next_frames"] is True and ck["input_shape"] == [2, 84, 84]
    rm = load_reward_model(path, game="seaquest", n_actions=18)
    assert rm.arch == "diff" and rm.needs_next and rm.ensemble == 2
    with torch.no_grad():
        ref = torch.stack([m(x, torch.from_numpy(actions)) for m in models]).mean(0).numpy()
    out = rm.predict(frames[:-1], actions, frames[1:])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert np.std(out) > 0
    # the masked rows (the score) do not reach the model
    painted = frames[1:].copy()
    painted[:, :20] = 255
    np.testing.assert_allclose(rm.predict(frames[:-1], actions, painted), out, rtol=1e-5, atol=1e-6)
    painted[:, 100:120] = 255
    assert not np.allclose(rm.predict(frames[:-1], actions, painted), out)


def test_checkpoints_from_before_the_arch_field_load_as_the_books(tmp_path):
    torch.manual_seed(4)
    m = RewardModel(18, SMALL).eval()
    ck = reward_checkpoint([m], "SeaquestNoFrameskip-v4", "seaquest", None)
    del ck["arch"], ck["needs_next_frames"]
    torch.save(ck, tmp_path / "old.pt")
    rm = load_reward_model(tmp_path / "old.pt")
    assert rm.arch == "book" and not rm.needs_next
    frames = np.random.default_rng(0).integers(0, 256, (4, *SMALL), dtype=np.uint8)
    with torch.no_grad():
        ref = m(torch.from_numpy(frames), torch.zeros(4, dtype=torch.int64)).numpy()
    np.testing.assert_allclose(rm.predict(frames, np.zeros(4, dtype=np.int64)), ref, rtol=1e-4, atol=1e-5)
    ck["arch"] = "transformer"
    torch.save(ck, tmp_path / "new.pt")
    with pytest.raises(UserError, match="unknown network 'transformer'"):
        load_reward_model(tmp_path / "new.pt")
    ck["arch"] = "diff"  # book weights under the diff name: refused with one line
    torch.save(ck, tmp_path / "mixed.pt")
    with pytest.raises(UserError, match="does not fit"):
        load_reward_model(tmp_path / "mixed.pt")


def test_the_diff_block_is_kept_apart_by_rows_and_travels_in_the_checkpoint(tmp_path):
    """A 4x12 block keeps SeaQuest's score (rows 3-6 of 84) apart from the reserve subs (rows 8-11);
    12x12 averages them into one feature. The block goes into the checkpoint; diff checkpoints
    made before the field load as 12x12; a hostile field is refused with one line."""
    rng = np.random.default_rng(5)
    frame = rng.integers(0, 200, (1, 84, 84), dtype=np.uint8)
    score_change = np.stack([frame, frame.copy()], axis=1)
    score_change[:, 1, 3:7, 40:60] += 50
    lives_change = np.stack([frame, frame.copy()], axis=1)
    lives_change[:, 1, 8:12, 40:60] += 50
    fine, coarse = DiffRewardModel(18, block=(4, 12)), DiffRewardModel(18, block=(12, 12))
    assert fine.scale.numel() == 2 * 21 * 7 and coarse.scale.numel() == 2 * 7 * 7
    f_s, f_l = (fine.features(torch.from_numpy(x)) for x in (score_change, lives_change))
    c_s, c_l = (coarse.features(torch.from_numpy(x)) for x in (score_change, lives_change))
    torch.testing.assert_close(c_s, c_l)
    assert not torch.allclose(f_s, f_l)

    ck = _saved_and_reloaded(tmp_path, fine, seed=6)
    assert ck["diff_block"] == [4, 12]

    old = reward_checkpoint([coarse.eval()], "SeaquestNoFrameskip-v4", "seaquest", None)
    del old["diff_block"]
    torch.save(old, tmp_path / "old-diff.pt")
    assert load_reward_models(tmp_path / "old-diff.pt")[0][0].block == (12, 12)
    for bad in ([5, 5], "4x12", [4], [4, 12, 1], [True, 12], [4.5, 12], None, [float("inf"), 12]):
        ck["diff_block"] = bad
        torch.save(ck, tmp_path / "bad.pt")
        with pytest.raises(UserError, match="diff block must be two divisors of 84"):
            load_reward_model(tmp_path / "bad.pt")
    ck["diff_block"] = [12, 12]  # a block that divides 84 but not the one the weights were made for
    torch.save(ck, tmp_path / "mismatch.pt")
    with pytest.raises(UserError, match="does not fit"):
        load_reward_model(tmp_path / "mismatch.pt")


def _saved_and_reloaded(tmp_path: Path, model: DiffRewardModel, seed: int) -> dict:
    """Fit ``model``'s scale on real SeaQuest steps, save it, load it back: the loaded predictor
    predicts what ``model`` does. Returns the checkpoint dict as saved."""
    torch.manual_seed(seed)
    frames, actions, _ = _seaquest_frames(12)
    x = torch.from_numpy(reward_input("diff", frames[:-1], frames[1:]))
    model.scale_to(model.features(x))
    model.eval()
    path = _save(tmp_path, [model])
    with torch.no_grad():
        ref = model(x, torch.from_numpy(actions))
    pred = load_reward_model(path).predict(frames[:-1], actions, frames[1:])
    np.testing.assert_allclose(pred, ref.numpy(), rtol=1e-5, atol=1e-6)
    return torch.load(path, weights_only=True)


def test_the_scene_flow_says_the_sprite_climbed_wherever_it_is_and_is_kept_in_the_checkpoint(tmp_path):
    """A textured sprite shifted up by 2 rows, at two far apart places of the screen: the block
    means of the change sit in different blocks, the scene flow (``--diff-flow``) reads the same
    shift, -2 rows and 0 columns, at both; a dive reads +2, a sideways move shifts columns only, a
    still frame 0. The flag goes into the checkpoint and loads back; a checkpoint without the field
    loads without flow; a hostile field is refused with one line."""
    rng = np.random.default_rng(0)
    tex = (rng.random((8, 12)) * 200 + 30).astype(np.float32)
    sprite = torch.from_numpy(np.kron(tex, np.ones((2, 2), dtype=np.float32)))  # smooth 16x24 texture

    def moved(row: int, col: int, drow: int, dcol: int) -> torch.Tensor:
        x = torch.zeros(1, 2, 84, 84)
        x[0, 0, row : row + 16, col : col + 24] = sprite
        x[0, 1, row + drow : row + drow + 16, col + dcol : col + dcol + 24] = sprite
        return x.to(torch.uint8)

    flow, plain = DiffRewardModel(18, flow=True), DiffRewardModel(18)
    cells = 21 * 7
    assert flow.scale.numel() == 2 * cells + FLOW_FEATURES
    top, bottom = flow.features(moved(10, 6, -2, 0))[0], flow.features(moved(60, 54, -2, 0))[0]
    torch.testing.assert_close(top[: 2 * cells], plain.features(moved(10, 6, -2, 0))[0])  # the blocks unchanged
    assert not torch.allclose(top[:cells], bottom[:cells])  # the change lies in other blocks
    for f in (top, bottom):
        assert f[-2] == pytest.approx(-2.0, abs=0.6) and abs(float(f[-1])) < 0.3
    assert flow.features(moved(30, 30, 2, 0))[0][-2] == pytest.approx(2.0, abs=0.6)  # a dive
    side = flow.features(moved(30, 30, 0, 2))[0]
    assert side[-1] == pytest.approx(2.0, abs=0.6) and abs(float(side[-2])) < 0.3
    torch.testing.assert_close(flow.features(moved(30, 30, 0, 0))[0][-2:], torch.zeros(2))
    assert flow.feature_key() != plain.feature_key()  # a training run's feature cache keeps them apart

    ck = _saved_and_reloaded(tmp_path, flow, seed=7)
    assert ck["diff_flow"] is True
    old = reward_checkpoint([plain.eval()], "SeaquestNoFrameskip-v4", "seaquest", None)
    assert old["diff_flow"] is False
    del old["diff_flow"]
    torch.save(old, tmp_path / "old-diff.pt")
    assert load_reward_models(tmp_path / "old-diff.pt")[0][0].flow is False
    ck["diff_flow"] = "yes"
    torch.save(ck, tmp_path / "bad.pt")
    with pytest.raises(UserError, match="diff_flow"):
        load_reward_model(tmp_path / "bad.pt")
    ck["diff_flow"] = False  # the weights were made for the flow features
    torch.save(ck, tmp_path / "mismatch.pt")
    with pytest.raises(UserError, match="does not fit"):
        load_reward_model(tmp_path / "mismatch.pt")


def _retired_encoder_checkpoint(path: Path) -> None:
    """A diff checkpoint as ``03_reward_train.py --encoder POLICY`` wrote it before the lever was
    retired: the policy's conv layers (``policy_conv(4)``, frozen) as ``encoder.*`` weights, their
    3,136 features after the grid's in the scale and in the first head layer (then the one-hot
    action), and the field "encoder": True."""
    torch.manual_seed(0)
    ck = reward_checkpoint([DiffRewardModel(18).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    sd = ck["state_dicts"][0]
    encoder = policy_conv(4)
    n_enc = encoder(torch.zeros(1, 4, 84, 84)).shape[1]
    sd.update({f"encoder.{k}": v.detach().clone() for k, v in encoder.state_dict().items()})
    n_grid = sd["scale"].numel()
    sd["scale"] = torch.cat([sd["scale"], torch.ones(n_enc)])
    w = sd["out.0.weight"]
    sd["out.0.weight"] = torch.cat([w[:, :n_grid], torch.zeros(len(w), n_enc), w[:, n_grid:]], dim=1).contiguous()
    ck["encoder"] = True
    torch.save(ck, path)


def test_a_checkpoint_made_with_the_retired_encoder_is_refused_with_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "encoder.pt"
    _retired_encoder_checkpoint(path)
    with pytest.raises(UserError, match=r"trained with --encoder .*retired: retrain it without --encoder") as e:
        load_reward_model(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    ck = torch.load(path, weights_only=True)
    del ck["encoder"]  # the weights say it too
    torch.save(ck, tmp_path / "no-field.pt")
    with pytest.raises(UserError, match="retired"):
        load_reward_model(tmp_path / "no-field.pt")
    # every diff checkpoint the old code wrote says "encoder": False: those still load
    old = reward_checkpoint([DiffRewardModel(18).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    torch.save({**old, "encoder": False}, tmp_path / "plain.pt")
    assert load_reward_model(tmp_path / "plain.pt").arch == "diff"
    # the stage that reads it ends with the same line and exit 2 (01_a2c.py -r and 04_play.py load alike)
    monkeypatch.setattr(sys, "argv", ["03_reward_train.py", "--evaluate", str(path), str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "03_reward_train.py"), run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and "--encoder" in err[0], err


def _retired_signed_checkpoint(path: Path) -> dict:
    """A diff checkpoint as ``03_reward_train.py --diff-signed`` wrote it before the lever was retired:
    the signed change's 147 block means after the grid's 294 in the scale and in the first head layer
    (then the one-hot action), and the field "diff_signed": True."""
    torch.manual_seed(0)
    ck = reward_checkpoint([DiffRewardModel(18).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    sd = ck["state_dicts"][0]
    n_grid = sd["scale"].numel()
    sd["scale"] = torch.cat([sd["scale"], torch.ones(n_grid // 2)])
    w = sd["out.0.weight"]
    sd["out.0.weight"] = torch.cat([w[:, :n_grid], torch.zeros(len(w), n_grid // 2), w[:, n_grid:]], dim=1).contiguous()
    ck["diff_signed"] = True
    torch.save(ck, path)
    return ck


def test_a_checkpoint_made_with_the_retired_diff_signed_is_refused_with_one_line(tmp_path, monkeypatch, capsys):
    """A model trained with the retired ``--diff-signed`` says so in its "diff_signed" field: one line
    naming the file and the flag, before its weights are tried. A checkpoint with the field false (what
    every unsigned diff model was written with) or without it loads as before; a hostile value of the
    field is refused as before; a checkpoint written now has no such field."""
    path = tmp_path / "signed.pt"
    ck = _retired_signed_checkpoint(path)
    with pytest.raises(UserError, match=r"trained with --diff-signed .*retired: retrain it without --diff-signed") as e:
        load_reward_model(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    torch.save({**ck, "diff_signed": "yes"}, tmp_path / "bad.pt")
    with pytest.raises(UserError, match="field 'diff_signed'"):
        load_reward_model(tmp_path / "bad.pt")
    new = reward_checkpoint([DiffRewardModel(18).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    assert "diff_signed" not in new
    torch.save(new, tmp_path / "new.pt")
    torch.save({**new, "diff_signed": False}, tmp_path / "unsigned.pt")
    for name in ("new.pt", "unsigned.pt"):
        assert load_reward_model(tmp_path / name).arch == "diff"
    # the stage that reads it ends with the same line and exit 2 (01_a2c.py -r and 04_play.py load alike)
    monkeypatch.setattr(sys, "argv", ["03_reward_train.py", "--evaluate", str(path), str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "03_reward_train.py"), run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and "--diff-signed" in err[0], err


def test_the_scene_flow_times_the_frame_pays_a_move_by_what_the_screen_shows(tmp_path):
    """``--diff-flow-scene``: after the two shifts, each shift times each block mean of the frame the
    step starts on (2 x 147 more features): the same climb reads differently where another part of
    the screen (in SeaQuest: the gauge) is bright or dark, and a still frame reads 0 there. The flag
    is kept in the checkpoint; without --diff-flow it is refused."""
    rng = np.random.default_rng(1)
    sprite = torch.from_numpy(np.kron(rng.random((8, 12)) * 200 + 30, np.ones((2, 2))).astype(np.float32))

    def climb(lamp: float) -> torch.Tensor:
        x = torch.zeros(1, 2, 84, 84)
        x[0, 0, 30:46, 30:54] = sprite
        x[0, 1, 28:44, 30:54] = sprite
        x[0, :, 68:72, 12:24] = lamp  # one block, the same in both frames: lit or dark
        return x.to(torch.uint8)

    scene, flow = DiffRewardModel(18, flow=True, flow_scene=True), DiffRewardModel(18, flow=True)
    cells = 21 * 7
    assert scene.scale.numel() == 2 * cells + FLOW_FEATURES + FLOW_FEATURES * cells
    lit, dark = scene.features(climb(255.0))[0], scene.features(climb(0.0))[0]
    base = 2 * cells + FLOW_FEATURES
    torch.testing.assert_close(lit[:base], flow.features(climb(255.0))[0])  # the features before unchanged
    shift, frame = lit[2 * cells : base], lit[cells : 2 * cells]
    torch.testing.assert_close(lit[base:], (shift[:, None] * frame[None, :]).flatten())
    lamp = 17 * 7 + 1  # the lamp's block: rows 68-71, columns 12-23
    assert lit[base + lamp] < -0.3 and abs(float(dark[base + lamp])) < 1e-6  # up (-rows) times lit
    still = torch.zeros(1, 2, 84, 84, dtype=torch.uint8)
    still[0, :, 68:72, 12:24] = 255
    assert float(scene.features(still)[0][base:].abs().max()) == 0.0
    assert scene.feature_key() != flow.feature_key()
    ck = _saved_and_reloaded(tmp_path, scene, seed=3)
    assert ck["diff_flow_scene"] is True and load_reward_models(tmp_path / "r.pt")[0][0].flow_scene is True
    with pytest.raises(ValueError, match="flow_scene needs flow"):
        DiffRewardModel(18, flow_scene=True)
