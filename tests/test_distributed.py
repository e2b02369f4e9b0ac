"""torchrun: synchronous data-parallel A2C on torch.distributed (gloo on CPU), run as a user runs it.

Two ranks of 8 envs must take the same first update as one process of the 16 envs with the same
seeds: rank r plays global envs 8r..8r+7 with their seeds and their per-env action streams, the
ranks' gradients are summed, weighted so the sum is the mean over all 16 envs' transitions.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lib.a2c.config import BATCH_SIZE, REWARD_STEPS
from lib.a2c.distributed import env_uniforms, init_dist
from lib.core.errors import UserError
from lib.models.policy import AtariA2C
from lib.store.segments import list_segments, load_segment

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_set(rank: int, port: int, **more: str) -> dict[str, str]:
    """The environment of one rank of a world of 2 set by hand (no torchrun)."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank)}
    return {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1", **more}


A2C_TINY = [
    sys.executable,
    SCRIPT,
    "-n",
    "x",
    "--envs",
    "1",
    "--max-steps",
    "64",
    "--test-every",
    "0",
    "--threads",
    "1",
]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK and LOCAL_RANK are not"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2 is set but LOCAL_RANK is not"),
        ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"}, "RANK=2 is not in 0..1"),
        ({"WORLD_SIZE": "2", "RANK": "-1", "LOCAL_RANK": "0"}, "RANK=-1 is not in 0..1"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is not in 0..1"),
        ({"WORLD_SIZE": "-3"}, "WORLD_SIZE=-3 must be at least 1"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, "MASTER_ADDR and MASTER_PORT are not set"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"},
         "MASTER_PORT=70000 is not a port (1..65535)"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
          "RLHF_DIST_WAIT": "0"}, "RLHF_DIST_WAIT=0 must be a number of seconds > 0"),
    ],
)  # fmt: skip
def test_a_hand_set_world_that_cannot_work_is_one_line(monkeypatch, env, message):
    from lib.a2c.distributed import init_dist
    from lib.core.errors import UserError

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=re.escape(message)) as e:
        init_dist("cpu")
    assert "\n" not in str(e.value)


def listening(port: int) -> set[str]:
    """The local addresses that listen on ``port`` (from /proc/net/tcp and tcp6, as hex)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(addr)
    return found


@pytest.mark.slow
def test_a_lone_rank_says_it_waits_listens_on_master_addr_and_ctrl_c_ends_it(tmp_path):
    """RANK=0 without the other rank: one line that it waits and for how long, a listening socket on
    MASTER_ADDR only (127.0.0.1, hex 0100007F; not every interface), and Ctrl-C ends the wait."""
    port = free_port()
    env = hand_set(0, port, RLHF_DIST_WAIT="600")
    proc = subprocess.Popen(A2C_TINY, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)  # a guard: before the fix no line ever came
    first = proc.stdout.readline() if ready else ""
    try:
        assert first.startswith(f"rank 0 of 2: waiting up to 600 s for the other ranks at 127.0.0.1:{port}"), first
        assert listening(port) == {"0100007F"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize(
    "rank, message",
    [
        (0, "rank 0 of 2: only 1 of 2 ranks joined at 127.0.0.1:{port} within 1 s"),
        (1, "rank 1 of 2: nothing answered at 127.0.0.1:{port} within 1 s"),
    ],
)
def test_a_lone_rank_ends_with_one_line_at_its_timeout(tmp_path, rank, message):
    port = free_port()
    r = subprocess.run(A2C_TINY, cwd=tmp_path, env=hand_set(rank, port, RLHF_DIST_WAIT="1"), capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message.format(port=port)}"), lines
    assert "waiting up to 1 s for the other ranks" in r.stdout


def child_with_rank(parent: int, rank: int) -> int | None:
    """The process id of ``rank`` among ``parent``'s children (the RANK in its environment)."""
    for d in Path("/proc").iterdir():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (d / "environ").read_bytes().split(b"\0") if ppid == parent else []
        except (OSError, IndexError, ValueError):
            continue
        if f"RANK={rank}".encode() in env:
            return int(d.name)
    return None


def poll(what, guard_s: float = 300.0):
    """``what()`` once it is truthy; None after ``guard_s`` (a guard against a hang, not a measure)."""
    end = time.monotonic() + guard_s
    while time.monotonic() < end:
        if found := what():
            return found
        time.sleep(0.2)
    return None


@pytest.mark.slow
def test_a_rank_killed_under_torchrun_ends_rank_0_with_one_line(tmp_path):
    """kill -9 of rank 1 mid-run: rank 0 saves last.pt and ends with one line that names rank 1, the
    step of last.pt and how to go on; no gloo traceback (torchrun's own report is torchrun's)."""
    logs, save = tmp_path / "logs", tmp_path / "k"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    launcher += ["--log-dir", str(logs), "--redirects", "3"]  # each rank's output in its own files
    cmd = [*launcher, SCRIPT, "-n", "k", "--save", str(save), "--runs-dir", str(tmp_path / "runs"), "--envs", "2"]
    cmd += ["--max-steps", "0", "--test-every", "0", "--threads", "1", "--env-threads", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out0 = poll(lambda: next(logs.rglob("attempt_0/0/stdout.log"), None))
        in_loop = poll(lambda: "\nstep " in out0.read_text()) if out0 else None  # a progress line: mid-run
        assert in_loop, "rank 0 never reached its training loop"
        rank1 = child_with_rank(proc.pid, 1)
        assert rank1 is not None
        os.kill(rank1, signal.SIGKILL)
        _, torchrun_err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err0 = (out0.parent / "stderr.log").read_text()
    assert proc.returncode != 0 and "Traceback" not in err0, err0[-3000:]
    step = torch.load(save / "last.pt", weights_only=True)["progress"]["step"]
    assert err0.strip().splitlines() == [
        f"error: rank 1 is gone (killed or crashed): {save / 'last.pt'} saved at step {step:,}; "
        f"continue with the same command plus --resume"
    ], err0[-3000:]


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
    # A torchrun rank asks the one --dev resolver (lib.models.policy.resolve_device): the same line as every stage.
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=f"--dev {dev} given but no CUDA GPU is available here: use --dev cpu"):
        init_dist(dev)
