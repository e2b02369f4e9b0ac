"""Checkpoints, policy and reward model alike: no NaN model is written or loaded, every checkpoint is
read in one place that bounds and checks it, a crafted file ends in one line, saves are atomic."""

from __future__ import annotations

import errno
import io
import os
import runpy
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import lib.models.policy
from lib.core.errors import UserError
from lib.models.policy import AtariA2C, load_policy, policy_checkpoint
from lib.models.reward import RewardModel, load_reward_model, reward_checkpoint, save_reward_checkpoint
from lib.store.checkpoints import atomic_torch_save, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SMALL = (48, 48, 3)
SEAQUEST = "SeaquestNoFrameskip-v4"


def _reward_ck(k: int = 1, **over) -> dict:
    torch.manual_seed(0)
    ck = reward_checkpoint(
        [RewardModel(18, SMALL).eval() for _ in range(k)], SEAQUEST, "seaquest", None, norm_mean=0.1, norm_std=1.0
    )
    ck.update(over)
    return ck


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# --- High: finite or nothing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [("norm_mean", float("nan")), ("norm_std", float("inf")), ("metrics", {"test_loss": float("inf")})],
)
def test_a_reward_model_with_non_finite_statistics_is_never_written(tmp_path, field, value):
    path = tmp_path / "r.pt"
    with pytest.raises(UserError, match=field) as e:
        save_reward_checkpoint(_reward_ck(**{field: value}), path)
    _one_line(e)
    assert not path.exists()


def test_a_reward_model_with_nan_weights_is_never_written_nor_loaded(tmp_path):
    ck = _reward_ck()
    ck["state_dicts"][0]["out.0.weight"][0, 0] = float("nan")
    with pytest.raises(UserError, match="NaN or infinite"):
        save_reward_checkpoint(ck, tmp_path / "r.pt")
    assert not (tmp_path / "r.pt").exists()
    torch.save(ck, tmp_path / "crafted.pt")  # as a crafted file would hold it
    with pytest.raises(UserError, match="NaN or infinite") as e:
        load_reward_model(tmp_path / "crafted.pt")
    assert "crafted.pt" in _one_line(e)
    torch.save(ck["state_dicts"][0], tmp_path / "bare.pt")  # the book's bare format too
    with pytest.raises(UserError, match="NaN or infinite"):
        load_reward_model(tmp_path / "bare.pt")


def _policy_ck(**over) -> dict:
    torch.manual_seed(0)
    ck = policy_checkpoint(AtariA2C((4, 84, 84), 18), SEAQUEST, "seaquest", ("NOOP",) * 18, step=0)
    ck.update(over)
    return ck


def test_a_policy_with_nan_weights_is_refused_with_one_line(tmp_path):
    ck = _policy_ck()
    ck["state_dict"]["policy.2.bias"][3] = float("inf")
    torch.save(ck, tmp_path / "p.pt")
    with pytest.raises(UserError, match="NaN or infinite") as e:
        load_policy(tmp_path / "p.pt")
    assert "p.pt" in _one_line(e)
    torch.save(ck["state_dict"], tmp_path / "bare.pt")
    with pytest.raises(UserError, match="NaN or infinite"):
        load_policy(tmp_path / "bare.pt", obs_shape=(4, 84, 84), n_actions=18)


# --- Medium 4: crafted checkpoints end in one line ---------------------------------------------


REWARD_VARIANTS = {
    "norm_mean text": {"norm_mean": "abc"},
    "norm_std negative": {"norm_std": -1.0},
    "metrics a list": {"metrics": [1, 2]},
    "frame_shape short": {"frame_shape": [1, 2]},
    "frame_shape huge": {"frame_shape": [100000, 160, 3]},
    "frame_shape 4 channels": {"frame_shape": [48, 48, 4]},
    "n_actions float 3e7": {"n_actions": 3e7},
    "n_actions 3e7": {"n_actions": 30_000_000},
    "n_actions 1e10": {"n_actions": 10**10},
    "n_actions bool": {"n_actions": True},
    "downscale 0": {"downscale": 0},
    "state_dicts text": {"state_dicts": "abc"},
    "state_dicts empty": {"state_dicts": []},
    "state_dicts of lists": {"state_dicts": [[1, 2]]},
    "env_id a number": {"env_id": 5},
    "action_meanings of numbers": {"action_meanings": [1, 2]},
    "diff_block text": {"arch": "diff", "diff_block": "abc"},
    "epoch text": {"epoch": "x"},
    # integers too large for a float (math.isfinite raises OverflowError on them: audit 5 item 1)
    "norm_mean 10**400": {"norm_mean": 10**400},
    "norm_std 10**400": {"norm_std": 10**400},
    "a metric 10**400": {"metrics": {"test_loss": 10**400}},
    "a nested metric -10**400": {"metrics": {"per_rule": {"x": -(10**400)}}},
}


@pytest.mark.parametrize("case", list(REWARD_VARIANTS))
def test_crafted_reward_checkpoints_are_one_line(tmp_path, case):
    path = tmp_path / "r.pt"
    torch.save(_reward_ck(**REWARD_VARIANTS[case]), path)
    with pytest.raises(UserError) as e:
        load_reward_model(path)
    assert str(path) in _one_line(e)


def test_ensemble_members_sharing_one_storage_or_too_many_are_refused(tmp_path):
    ck = _reward_ck()
    ck["state_dicts"] = ck["state_dicts"] * 3  # one storage, three members
    torch.save(ck, tmp_path / "shared.pt")
    assert (tmp_path / "shared.pt").stat().st_size < 200_000
    with pytest.raises(UserError, match="share their weights"):
        load_reward_model(tmp_path / "shared.pt")
    ck = _reward_ck()
    sd = ck["state_dicts"][0]
    ck["state_dicts"] = [{k: v.clone() for k, v in sd.items()} for _ in range(65)]
    torch.save(ck, tmp_path / "many.pt")
    with pytest.raises(UserError, match="state_dicts"):
        load_reward_model(tmp_path / "many.pt")


POLICY_VARIANTS = {
    "obs_shape text": {"obs_shape": "abc"},
    "obs_shape huge": {"obs_shape": [4, 10000, 10000]},
    "obs_shape tiny": {"obs_shape": [4, 8, 8]},
    "n_actions text": {"n_actions": "x"},
    "n_actions 1e10": {"n_actions": 10**10},
    "state_dict a list": {"state_dict": [1, 2]},
    "state_dict of texts": {"state_dict": {"a": "b"}},
    "game a number": {"game": 3},
    "metrics a list": {"metrics": [1]},
}


@pytest.mark.parametrize("case", list(POLICY_VARIANTS))
def test_crafted_policy_checkpoints_are_one_line(tmp_path, case):
    path = tmp_path / "p.pt"
    torch.save(_policy_ck(**POLICY_VARIANTS[case]), path)
    with pytest.raises(UserError) as e:
        load_policy(path, game="seaquest", obs_shape=(4, 84, 84), n_actions=18)
    assert str(path) in _one_line(e)


def test_missing_field_is_one_line(tmp_path):
    ck = _policy_ck()
    del ck["n_actions"]
    torch.save(ck, tmp_path / "p.pt")
    with pytest.raises(UserError, match="no 'n_actions' field"):
        load_policy(tmp_path / "p.pt")


def test_fifo_and_device_as_checkpoint_never_hang(tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(UserError, match="not a regular file") as e:
            read_checkpoint(path)
        _one_line(e)
        with pytest.raises(UserError, match="not a regular file"):
            load_reward_model(path)
    (tmp_path / "link.pt").symlink_to(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        load_policy(tmp_path / "link.pt")


def test_file_size_is_bounded_before_loading(tmp_path, monkeypatch):
    path = tmp_path / "r.pt"
    save_reward_checkpoint(_reward_ck(), path)
    monkeypatch.setattr(lib.store.checkpoints, "MAX_CHECKPOINT_BYTES", path.stat().st_size - 1)
    with pytest.raises(UserError, match="more than the"):
        load_reward_model(path)


def _deflate(src: Path, dst: Path) -> None:
    """The same checkpoint with every zip entry deflated (torch stores them uncompressed)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))


def test_a_deflated_giant_tensor_is_refused_before_loading(tmp_path, monkeypatch):
    """A small file whose zip entries inflate past the bound: refused by the entries' declared
    sizes, before torch.load inflates anything (here 8 MB of zeros against a 4 MB bound)."""
    ck = _reward_ck(extra=torch.zeros(2 << 20))  # 8 MB of float32 zeros
    torch.save(ck, tmp_path / "plain.pt")
    _deflate(tmp_path / "plain.pt", tmp_path / "deflated.pt")
    assert (tmp_path / "deflated.pt").stat().st_size < 1 << 20
    torch.load(tmp_path / "deflated.pt", weights_only=True)  # torch itself loads it
    monkeypatch.setattr(lib.store.checkpoints, "MAX_CHECKPOINT_BYTES", 4 << 20)
    with pytest.raises(UserError, match="unpacks to") as e:
        load_reward_model(tmp_path / "deflated.pt")
    _one_line(e)


def test_check_fields_for_other_callers():
    from lib.store.checkpoints import check_ck_fields, float_in, int_in

    spec = {"lr": (float_in(0, 1, lo_open=True), True), "step": (int_in(0, 10), False)}
    check_ck_fields({"lr": 0.1}, spec, "checkpoint x")
    for bad in ({"lr": "x"}, {"lr": float("nan")}, {"lr": 0.0}, {}, {"lr": 0.1, "step": 1.5}):
        with pytest.raises(UserError, match="checkpoint x"):
            check_ck_fields(bad, spec, "checkpoint x")


# --- Low 1 and 6: disk full, stale temp files --------------------------------------------------


def test_disk_full_checkpoint_save_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    atomic_torch_save({"a": 1}, path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UserError, match="No space left on device") as e:
        atomic_torch_save({"a": 2}, path)
    msg = _one_line(e)
    assert str(path) in msg and "previous file is kept" in msg
    assert torch.load(path, weights_only=True) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_stale_checkpoint_temps_are_removed(tmp_path):
    from lib.store.checkpoints import remove_stale_checkpoint_temps

    path = tmp_path / "last.pt"
    stale = tmp_path / ".last.pt.abc123.tmp"
    stale.write_bytes(b"x" * 100)
    os.utime(stale, (1, 1))
    fresh = tmp_path / ".last.pt.new1.tmp"
    fresh.write_bytes(b"x")  # another run's save in progress: newer than our start
    os.utime(fresh, (2e9, 2e9))
    other = tmp_path / ".other.pt.abc.tmp"
    other.write_bytes(b"x")
    os.utime(other, (1, 1))
    target = tmp_path / "keep.bin"
    target.write_bytes(b"k")
    link = tmp_path / ".last.pt.lnk.tmp"
    link.symlink_to(target)
    os.utime(link, (1, 1), follow_symlinks=False)
    assert remove_stale_checkpoint_temps(path) == 1
    assert not stale.exists() and fresh.exists() and other.exists() and link.is_symlink() and target.exists()


# --- stage 4's CLI ---------------------------------------------------------------------------


def _play(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", [str(ROOT / "04_play.py"), *args])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "04_play.py"), run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("case", ["fifo", "n_actions 1e10", "obs_shape text", "env_id number", "nan weight"])
def test_play_refuses_crafted_policies_with_one_line(tmp_path, monkeypatch, capsys, case):
    path = tmp_path / "p.pt"
    if case == "fifo":
        os.mkfifo(path)
    elif case == "nan weight":
        ck = _policy_ck()
        ck["state_dict"]["value.2.bias"][0] = float("nan")
        torch.save(ck, path)
    else:
        over = {"n_actions 1e10": {"n_actions": 10**10}, "obs_shape text": {"obs_shape": "abc"}}
        torch.save(_policy_ck(**over.get(case, {"env_id": 7})), path)
    assert str(path) in _play(monkeypatch, capsys, "-m", str(path), "--max-steps", "2")


@pytest.mark.parametrize("seed", ["-1", str(2**70)])
def test_play_refuses_bad_seeds(tmp_path, monkeypatch, capsys, seed):
    path = tmp_path / "p.pt"
    torch.save(_policy_ck(), path)
    assert "--seed" in _play(monkeypatch, capsys, "-m", str(path), "--seed", seed, "--max-steps", "2")


def test_in_memory_bytes_never_reach_torch_load(tmp_path):
    """read_checkpoint loads from the very file it checked (no second open by name)."""
    path = tmp_path / "r.pt"
    buf = io.BytesIO()
    torch.save({"a": torch.ones(2)}, buf)
    path.write_bytes(buf.getvalue())
    assert read_checkpoint(path)["a"].tolist() == [1.0, 1.0]


def test_the_first_save_of_a_run_removes_what_a_killed_save_left(tmp_path):
    """kill -9 during a save leaves .last.pt.*.tmp (18 MB); the next run's first save removes it."""
    stale = tmp_path / ".last.pt.k1ll3d.tmp"
    stale.write_bytes(b"x" * 1000)
    os.utime(stale, (1, 1))
    atomic_torch_save({"a": 1}, tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
