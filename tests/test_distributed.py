"""torchrun: synchronous data-parallel A2C on torch.distributed (gloo on CPU), run as a user runs it.

Two ranks of 8 envs must take the same first update as one process of the 16 envs with the same
seeds: rank r plays global envs 8r..8r+7 with their seeds and their per-env action streams, the
ranks' gradients are summed, weighted so the sum is the mean over all 16 envs' transitions.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lib.a2c import BATCH_SIZE, REWARD_STEPS
from lib.distributed import env_uniforms, init_dist
from lib.errors import UserError
from lib.model import AtariA2C
from lib.segments import list_segments, load_segment

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "01_a2c.py")
ENVS = 16
# The first transitions are complete after REWARD_STEPS vector steps, 16 a step: the batch of 128
# is full after 12 steps, and the update runs while the 13th step is in flight.
STEPS = ENVS * (REWARD_STEPS + BATCH_SIZE // ENVS)


def run(tmp_path: Path, name: str, launcher: list[str], envs: int, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        *launcher,
        SCRIPT,
        "-n",
        name,
        "--save",
        str(tmp_path / name),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--envs",
        str(envs),
        "--max-steps",
        str(STEPS),
        "--test-every",
        "0",
        "--seed",
        "3",
        "--threads",
        "1",
        "--env-threads",
        "1",
        *extra,
    ]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.slow
def test_two_ranks_take_the_first_update_of_one_process_and_share_one_db(tmp_path):
    one = run(tmp_path, "one", [sys.executable], ENVS)
    assert one.returncode == 0, one.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    db = tmp_path / "db"
    two = run(tmp_path, "two", torchrun, ENVS // 2, "--db-path", str(db), "--record-prob", "1", "--segment-steps", "4")
    assert two.returncode == 0, two.stderr + two.stdout

    last_one = torch.load(tmp_path / "one" / "last.pt", weights_only=True)
    last_two = torch.load(tmp_path / "two" / "last.pt", weights_only=True)
    assert last_one["progress"]["train_steps"] == last_two["progress"]["train_steps"] == 1
    assert last_one["progress"]["step"] == last_two["progress"]["step"] == STEPS  # steps count over all ranks
    torch.manual_seed(3)
    init = AtariA2C((4, 84, 84), 18).state_dict()
    moved = 0
    for k, w in last_one["state_dict"].items():
        np.testing.assert_allclose(last_two["state_dict"][k].numpy(), w.numpy(), atol=2e-6, err_msg=k)
        moved += int((w - init[k]).abs().max() > 1e-5)
    assert moved == len(init)  # the update moved every tensor: the comparison is not of two inits

    # Both ranks recorded into the one DB, each into its own env directories, under one db.json.
    segs = list_segments(db)
    envs = sorted({int(s.split("/")[0]) for s in segs})
    assert envs == list(range(ENVS))
    assert sorted(p.name for p in db.iterdir() if p.is_file() and not p.name.startswith(".")) == ["db.json"]
    seg = load_segment(db / segs[-1])
    assert seg.env_index == int(segs[-1].split("/")[0]) and len(seg.actions) == 4
    assert "finished at step" in two.stdout and two.stdout.count("finished at step") == 1  # rank 0 reports


def test_env_uniforms_are_per_env_streams():
    ids = np.arange(16)
    u = env_uniforms(3, ids, 7)
    assert u.shape == (16,) and ((u >= 0) & (u < 1)).all()
    # the same env at the same step draws the same number, whichever others share its process
    np.testing.assert_array_equal(env_uniforms(3, ids[8:], 7), u[8:])
    assert len(set(u.tolist())) == 16
    assert not np.array_equal(env_uniforms(3, ids, 8), u)
    assert not np.array_equal(env_uniforms(4, ids, 7), u)
    many = np.concatenate([env_uniforms(0, ids, t) for t in range(2000)])
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.std() - 12**-0.5) < 0.01
    hist, _ = np.histogram(many, bins=10, range=(0, 1))
    assert hist.min() > 0.9 * len(many) / 10


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("dev", ["cuda", "cuda:1"])
def test_rank_on_cuda_without_a_gpu_is_the_one_device_line(monkeypatch: pytest.MonkeyPatch, dev: str) -> None:
    # A torchrun rank asks the one --dev resolver (lib.model.resolve_device): the same line as every stage.
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=f"--dev {dev} given but no CUDA GPU is available here: use --dev cpu"):
        init_dist(dev)
