"""experiments/probe.py: states with a low gauge replayed by a policy, and what each replay came to
(the real ALE; states made by setting the emulator's RAM: divers collected at 62, oxygen at 102)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import probe
from experiments.branch import ENV_ID
from lib.checkpoints import atomic_torch_save
from lib.model import AtariA2C, policy_checkpoint
from lib.saved_states import SAMPLE_ENV, SavedState, SingleGame, load_states
from lib.seaquest import BOTTOM_ROW, divers_aboard, oxygen_levels, sub_rows
from lib.segments import list_segments, read_segment

ROOT = Path(__file__).resolve().parents[1]
MEANINGS = SingleGame(0).meanings


def one_action_net(action: str) -> AtariA2C:
    """A real policy network that (all but) always picks ``action``."""
    net = AtariA2C((4, 84, 84), len(MEANINGS))
    with torch.no_grad():
        net.policy[-1].weight.zero_()
        net.policy[-1].bias.fill_(-50.0)
        net.policy[-1].bias[MEANINGS.index(action)] = 50.0
    return net.eval()


def saved(path: Path, net: AtariA2C) -> Path:
    atomic_torch_save(policy_checkpoint(net, ENV_ID, "seaquest", MEANINGS), path)
    return path


def state_at_bottom(divers: int, oxygen: int, seed: int = 3) -> SavedState:
    """The sub taken to the sea bed, then the emulator's RAM given ``divers`` aboard and ``oxygen``
    left; the state after 4 more steps (the policy input's frames)."""
    game = SingleGame(seed)
    game.reset()
    for _ in range(70):  # the new sub waits at the surface until its gauge is full, then dives
        game.step(MEANINGS.index("DOWN"))
    game.ale.setRAM(62, divers)
    game.ale.setRAM(102, oxygen)
    frames = []
    for _ in range(4):
        game.step(MEANINGS.index("NOOP"))
        frames.append(game.frame.copy())
    last = frames[-1]
    facts = int(oxygen_levels(last)), int(divers_aboard(last)), int(sub_rows(last))
    return SavedState("00/00000000.dat", np.stack(frames), game.ale.cloneState().serialize(), *facts, 0)


def test_the_made_states_show_what_the_ram_was_given() -> None:
    s = state_at_bottom(1, 12)
    assert (s.divers, s.row) == (1, BOTTOM_ROW)
    assert 0 < s.level <= 16
    assert state_at_bottom(0, 4).divers == 0


@pytest.mark.parametrize(
    ("divers", "oxygen", "action", "outcome"),
    [
        (1, 12, "UP", "refill"),  # a diver aboard: the surface refills the gauge
        (0, 12, "UP", "surfaced_empty"),  # none aboard: the surfacing rule takes the life
        (0, 4, "DOWN", "drowned"),  # stays down with 4 left: runs out
        (1, 12, "DOWN", "died_otherwise"),  # stays down with air: an enemy gets it first (this seed)
    ],
)
def test_each_replay_ends_in_what_the_sub_did(divers: int, oxygen: int, action: str, outcome: str) -> None:
    rolls = probe.replay(one_action_net(action), [state_at_bottom(divers, oxygen)], tries=2, steps=200, seed=0)
    assert [r.outcome for r in rolls] == [outcome, outcome]
    if action == "UP":
        assert rolls[0].climbed >= BOTTOM_ROW - 57  # from the sea bed to (about) the surface
    else:
        assert rolls[0].climbed == 0
    if outcome == "refill":
        assert 0 < rolls[0].refill_level <= 16  # the gauge when the refill began: low, as given
    else:
        assert rolls[0].refill_level == -1


def test_a_replay_that_settles_nothing_in_its_steps_is_none() -> None:
    rolls = probe.replay(one_action_net("UP"), [state_at_bottom(1, 12)], tries=1, steps=5, seed=0)
    assert rolls[0].outcome == "none" and rolls[0].steps == 5 and 0 < rolls[0].climbed <= 5 * 4


def test_summarise_gives_the_shares_of_each_outcome() -> None:
    rolls = [probe.Rollout("refill", 20, 90, 9), probe.Rollout("refill", 30, 80, 11), probe.Rollout("drowned", 40, 0)]
    rolls.append(probe.Rollout("none", 200, 10))
    s = probe.summarise(rolls)
    assert s["refill"] == 0.5 and s["drowned"] == 0.25 and s["none"] == 0.25 and s["surfaced_empty"] == 0.0
    assert s["climbed"] == 45.0 and s["refill_level"] == 10.0


def test_found_states_and_samples_round_trip_through_the_db(tmp_path: Path) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "states"
    n, m = probe.find_states(pol, db, 2, sample_every=10, max_games=3, at=lambda f: sub_rows(f) > 100)
    states, samples = load_states(db), load_states(db, SAMPLE_ENV)
    assert n == len(states) == 2 and m == len(samples) > 0
    assert len({(s.game, s.life) for s in states}) == 2  # at most one state a life
    for s in states:
        assert s.row > 100 and s.ale and s.frames.shape == (4, 210, 160, 3)
    # a replay from a loaded state starts where the finder was: the first frame it steps from is the state's
    roll = probe.replay(one_action_net("UP"), states[:1], tries=1, steps=3, seed=0)[0]
    assert roll.climbed > 0


def test_a_tampered_state_file_is_skipped_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "states"
    probe.find_states(pol, db, 2, sample_every=1000, max_games=3, at=lambda f: sub_rows(f) > 100)
    rel = [r for r in list_segments(db) if r.startswith("00/")][0]
    seg = read_segment(db, rel)
    (db / rel).unlink()
    bad = {**seg.meta, "ale_state": "zz" + seg.meta["ale_state"][2:]}
    probe._save(db, 0, seg.step, seg.frames, bad, MEANINGS)
    states = load_states(db)
    assert len(states) == 1 and "not hex" in capsys.readouterr().err


def test_the_linear_probe_reads_a_linear_signal_and_not_noise() -> None:
    rng = np.random.default_rng(0)
    games = np.repeat(np.arange(10), 40)
    target = rng.integers(0, 4, len(games))
    seen = np.hstack(
        [target[:, None] + 0.01 * rng.standard_normal((len(games), 1)), rng.standard_normal((len(games), 30))]
    )
    blind = rng.standard_normal((len(games), 31))
    good, bad = probe.linear_probe(seen, target, games), probe.linear_probe(blind, target, games)
    assert good["r2"] > 0.99 and good["exact"] == 1.0
    assert bad["r2"] < 0.1 and bad["exact"] < 0.5


def test_the_command_finds_states_probes_and_refuses_bad_values(tmp_path: Path) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "states"
    probe.find_states(pol, db, 2, sample_every=5, max_games=3, at=lambda f: sub_rows(f) > 100)
    up = saved(tmp_path / "up.pt", one_action_net("UP"))
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "experiments.probe", "--states", str(db), "--policy", str(pol), "--policy", str(up)]
    res = subprocess.run(
        [*cmd, "--tries", "1", "--steps", "60", "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert "| refill | surfaced empty | drowned |" in res.stdout
    import json

    rows = json.loads(out.read_text())
    assert [r["rollouts"] for r in rows] == [2, 2]
    assert rows[0]["climbed"] == 0 and rows[1]["climbed"] > 0  # DOWN stays, UP climbs
    for flag, value in (("--tries", "0"), ("--steps", "-1"), ("--states", str(pol))):
        bad = subprocess.run([*cmd, flag, value], cwd=ROOT, capture_output=True, text=True)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
