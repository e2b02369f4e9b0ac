"""lib/atari/saved_states.py and 01_a2c.py --start-states: lives that start from saved emulator states,
on the real emulator, with a state DB the real finder (experiments.probe) wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from experiments import probe
from lib.a2c.cli import parse_config
from lib.atari.envs import DEFAULT_ENV
from lib.atari.saved_states import SavedStartsVec, SavedState, SingleGame, vec_env
from lib.atari.seaquest import sub_rows
from lib.core.errors import UserError
from lib.models.policy import AtariA2C, policy_checkpoint
from lib.store.checkpoints import atomic_torch_save
from lib.store.states import load_states, start_states

ROOT = Path(__file__).resolve().parents[1]
MEANINGS = SingleGame(0).meanings


def drowning_state(seed: int = 3) -> SavedState:
    """The sub on the sea bed with 3 of 63 oxygen left and a diver aboard (the emulator's RAM set):
    it drowns within ~30 steps whatever it does down there."""
    g = SingleGame(seed)
    g.reset()
    for _ in range(70):  # the new sub waits at the surface until its gauge is full, then dives
        g.step(MEANINGS.index("DOWN"))
    g.ale.setRAM(62, 1)
    g.ale.setRAM(102, 3)
    frames = []
    for _ in range(4):
        g.step(MEANINGS.index("NOOP"))
        frames.append(g.frame.copy())
    return SavedState("00/00000000.dat", np.stack(frames), g.ale.cloneState().serialize(), 3, 1, 141, 0)


def down_policy(path: Path) -> Path:
    net = AtariA2C((4, 84, 84), len(MEANINGS))
    with torch.no_grad():
        net.policy[-1].weight.zero_()
        net.policy[-1].bias.fill_(-50.0)
        net.policy[-1].bias[MEANINGS.index("DOWN")] = 50.0
    atomic_torch_save(policy_checkpoint(net, DEFAULT_ENV, "seaquest", MEANINGS), path)
    return path


@pytest.fixture(scope="module")
def state_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state DB written by experiments.probe's finder: a diving policy, states deep down."""
    tmp = tmp_path_factory.mktemp("states")
    db = tmp / "states"
    n, _ = probe.find_states(down_policy(tmp / "p.pt"), db, 2, max_games=3, at=lambda f: sub_rows(f) > 100)
    assert n == 2
    return db


def test_every_start_and_every_life_lost_jumps_to_a_saved_state_at_share_one() -> None:
    state = drowning_state()
    env = SavedStartsVec(2, seed=5, states=[state], share=1.0)
    obs = env.reset()
    assert env.jumps == 2
    assert (env.frames == state.frames[-1]).all() and obs.shape == (2, 4, 84, 84)
    noop = np.zeros(2, dtype=np.int64)
    for _ in range(60):
        st = env.step(noop)
        if st.terminated.any():
            break
    assert st.terminated.all() and st.game_over.all() and env.jumps == 4  # both drowned, both jumped
    assert (env.frames == state.frames[-1]).all()
    assert st.true_rewards.tolist() == st.rewards.tolist()


def test_at_share_zero_the_games_are_the_games_own() -> None:
    state = drowning_state()
    env = SavedStartsVec(1, seed=5, states=[state], share=0.0)
    env.reset()
    assert env.jumps == 0 and not (env.frames == state.frames[-1]).all()
    st = env.step(np.zeros(1, dtype=np.int64))
    assert not st.game_over.any() and st.lives.tolist() == [4]  # a new game's subs


def test_no_states_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no readable saved state"):
        SavedStartsVec(1, seed=0, states=[], share=0.5)
    with pytest.raises(UserError, match="not a directory"):
        start_states(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no readable saved state"):
        start_states(tmp_path / "empty")


def test_a_damaged_state_is_skipped_and_one_ale_cannot_read_is_refused(
    state_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    db = tmp_path / "db"
    shutil.copytree(state_db, db)
    files = sorted((db / "00").iterdir())
    files[0].write_bytes(b"not a segment")
    assert len(load_states(db)) == 1  # the broken one is skipped with a warning
    assert "skipped" in capsys.readouterr().err
    with pytest.raises(UserError, match="ale-py"):  # ALE's reader takes these bytes; restoring them fails
        SingleGame(0).restore(SavedState("x", drowning_state().frames, b"\x00" * 64, 3, 1, 141, 0))


def test_vec_env_makes_the_emulators_only_for_starts_and_only_for_seaquest() -> None:
    state = drowning_state()
    env = vec_env(DEFAULT_ENV, 2, seed=1, starts=([state], 0.5), num_threads=1)
    assert isinstance(env, SavedStartsVec) and env.n_envs == 2
    plain = vec_env(DEFAULT_ENV, 2, seed=1, num_threads=1)
    assert not isinstance(plain, SavedStartsVec)
    plain.close()
    with pytest.raises(UserError, match="SeaQuest"):
        vec_env("PongNoFrameskip-v4", 2, seed=1, starts=([state], 0.5))


def test_a_training_run_starts_its_lives_from_the_saved_states(state_db: Path, tmp_path: Path) -> None:
    from lib.a2c.train import train

    made: list[Any] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(vec_env(*args, **kwargs))
        return made[-1]

    argv = ["-n", "starts", "--envs", "2", "--max-steps", "400", "--start-states", str(state_db)]
    argv += ["--start-share", "1", "--save", str(tmp_path / "s"), "--runs-dir", str(tmp_path / "r")]
    argv += ["--test-every", "0"]
    assert train(parse_config(argv), make_env=spy) == 0
    env = made[0]
    assert isinstance(env, SavedStartsVec)
    assert env.jumps >= 2  # both resets jumped; every life lost since did too
    assert (tmp_path / "s" / "last.pt").exists()


def a2c(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ROOT / "01_a2c.py"), "-n", "x", "--save", str(tmp_path / "s"), *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start-states", "nowhere"], "--start-states nowhere: not a directory"),
        (["--start-states", "."], "holds no readable saved state"),
        (["--start-states", ".", "--env", "PongNoFrameskip-v4"], "SeaQuest"),
        (["--start-share", "0.3"], "--start-share"),
        (["--start-states", ".", "--start-share", "1.5"], "--start-share"),
    ],
)
def test_01_a2c_refuses_bad_start_flags_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    p = a2c(tmp_path, "--runs-dir", str(tmp_path / "r"), *args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was written
