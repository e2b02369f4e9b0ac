"""experiments/probe.py: states with a low gauge replayed by a policy, and what each replay came to
(the real ALE; states made by setting the emulator's RAM: divers collected at 62, oxygen at 102)."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from experiments import probe
from experiments.branch import ENV_ID
from lib.atari.saved_states import SavedState, SingleGame
from lib.atari.seaquest import BOTTOM_ROW, divers_aboard, oxygen_levels, sub_rows
from lib.core.errors import EXIT_INTERRUPTED, UserError
from lib.models.policy import AtariA2C, policy_checkpoint
from lib.store import segment_writer
from lib.store.checkpoints import atomic_torch_save
from lib.store.segments import list_segments, read_segment
from lib.store.states import SAMPLE_ENV, load_states

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


def deep(frame: np.ndarray) -> bool:
    """A test's branch point: where a diving finder soon is."""
    return bool(sub_rows(frame) > 100)


def found_db(tmp_path: Path, pol: Path, **settings: Any) -> Path:
    """A state DB as the command finds one (record and all), with a diving finder and ``deep``."""
    db = tmp_path / "states"
    db.mkdir()  # an empty directory is found into as a missing one is
    a = probe.ProbeSettings(states=db, policy=[pol], **{"n_states": 2, "max_games": 3, **settings})
    probe.find_db(pol, db, a, at=deep)
    return db


def run_probe(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "experiments.probe", "--states", str(db), "--n-states", "2", "--max-games", "3"]
    return subprocess.run([*cmd, "--tries", "1", "--steps", "60", *args], cwd=ROOT, capture_output=True, text=True)


def tree(d: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``d`` with its size and mtime: what "untouched" is checked against."""
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def test_the_command_finds_states_probes_and_refuses_bad_values(tmp_path: Path) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = found_db(tmp_path, pol)
    # a state whose meta holds a huge integer is skipped with one warning (it crashed the mean before)
    seg = read_segment(db, [r for r in list_segments(db) if r.startswith("00/")][0])
    probe._save(db, 0, 99_999, seg.frames, {**seg.meta, "row": 10**400}, MEANINGS)
    up = saved(tmp_path / "up.pt", one_action_net("UP"))
    out = tmp_path / "rows.json"
    res = run_probe(db, "--policy", str(pol), "--policy", str(up), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "| refill | surfaced empty | drowned |" in res.stdout
    assert "found by" in res.stdout and "--find-seed 10000 --n-states 2 --max-games 3" in res.stdout
    assert res.stderr.count("warning:") == 1 and "meta 'row' is not in" in res.stderr
    rows = json.loads(out.read_text())
    assert [r["rollouts"] for r in rows] == [2, 2]
    assert rows[0]["climbed"] == 0 and rows[1]["climbed"] > 0  # DOWN stays, UP climbs
    for flag, value in (("--tries", "0"), ("--steps", "-1"), ("--states", str(pol))):
        bad = run_probe(db, "--policy", str(pol), flag, value)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_finders_last_line_counts_the_games_it_played(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    n, _ = probe.find_states(pol, tmp_path / "states", 1, max_games=5, at=deep)
    assert n == 1 and "1 states in 1 games" in capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", ["a recording DB", "a file of the user's"])
def test_a_states_directory_holding_anything_else_is_refused_untouched(tmp_path: Path, kind: str) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "db"
    if kind == "a recording DB":
        segment_writer.claim_db(db, ENV_ID, MEANINGS)
        frames = state_at_bottom(1, 12).frames
        probe._save(db, 0, 0, frames, {}, MEANINGS)
    else:
        db.mkdir()
        (db / "notes.txt").write_text("mine")
    before = tree(db)
    res = run_probe(db, "--policy", str(pol))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--states {db} is not a state DB this probe found" in lines[0]
    assert tree(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["db", "p.pt"]


def test_a_db_found_with_other_settings_is_refused_untouched(tmp_path: Path) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    other = saved(tmp_path / "other.pt", one_action_net("UP"))
    db = found_db(tmp_path, pol)
    before = tree(db)
    for args, said in (
        (["--find-seed", "20000"], "--find-seed 10000 (this run: 20000)"),
        (["--n-states", "5"], "--n-states 2 (this run: 5)"),
        (["--find-with", str(other)], f"--find-with {pol} (this run: {other})"),
    ):
        res = run_probe(db, "--policy", str(pol), *args)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"--states {db} holds states found with {said}" in lines[0]
    assert tree(db) == before
    # Given no finder setting, the DB is probed as it was found (the settings it records).
    res = run_probe(db, "--policy", str(pol))
    assert res.returncode == 0 and "found by" in res.stdout and "--n-states 2" in res.stdout, res.stderr
    assert tree(db) == before
    record = json.loads((db / probe.FOUND_FILE).read_text())
    assert (record["find_seed"], record["n_states"], record["max_games"], record["states"]) == (10_000, 2, 3, 2)


def in_process(monkeypatch: pytest.MonkeyPatch, db: Path, pol: Path) -> list[str]:
    """``probe.main``'s arguments for a run in this process whose finder stops at ``deep``."""
    monkeypatch.setattr(probe, "at_branch_point", deep)
    return ["--states", str(db), "--policy", str(pol), "--n-states", "2", "--max-games", "3", "--steps", "5"]


def failing_after(monkeypatch: pytest.MonkeyPatch, k: int, error: BaseException) -> None:
    """The finder's k-th segment write raises ``error`` (a sample or a state, as they come)."""
    real, calls = probe.save_segment, [0]

    def save(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == k:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(probe, "save_segment", save)


@pytest.mark.parametrize("k", [1, 10])  # before the first state; after the first (of 2, 23 writes in all)
def test_a_find_cut_by_ctrl_c_leaves_nothing_and_a_rerun_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, k: int
) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "states"
    argv = in_process(monkeypatch, db, pol)
    failing_after(monkeypatch, k, KeyboardInterrupt())
    assert probe.cli(argv) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip().splitlines() == [f"interrupted (SIGINT): no state was kept in --states {db}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.pt"]  # neither the DB nor the finder's directory
    monkeypatch.setattr(probe, "save_segment", segment_writer.save_segment)
    assert probe.cli(argv) == 0
    assert len(load_states(db)) == 2 and json.loads((db / probe.FOUND_FILE).read_text())["states"] == 2


def test_a_full_disk_while_finding_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "states"
    argv = in_process(monkeypatch, db, pol)
    failing_after(monkeypatch, 5, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(UserError, match=rf"No space left on device; --states {db} is as it was$"):
        probe.main(argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.pt"]


def test_ctrl_c_while_the_command_finds_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = tmp_path / "states"
    cmd = [sys.executable, "-m", "experiments.probe", "--states", str(db), "--policy", str(pol)]
    proc = subprocess.Popen([*cmd, "--max-games", "1000"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".states.finding-*/00")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # the finder is at work once its directory holds a segment
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == EXIT_INTERRUPTED and "Traceback" not in err.decode(), err.decode()
    assert lines == [f"interrupted (SIGINT): no state was kept in --states {db}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.pt"]


def test_a_bad_out_is_refused_in_one_line_before_the_work(tmp_path: Path) -> None:
    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = found_db(tmp_path, pol)
    (tmp_path / "a file").write_text("")
    for out, message in ((tmp_path, "is a directory"), (tmp_path / "a file" / "o.json", "not a writable directory")):
        res = run_probe(db, "--policy", str(pol), "--out", str(out))
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
        assert "| refill |" not in res.stdout  # refused before a replay


def test_a_write_of_out_that_fails_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    pol = saved(tmp_path / "p.pt", one_action_net("DOWN"))
    db = found_db(tmp_path, pol)
    monkeypatch.setattr(probe, "atomic_write", full)
    argv = [*in_process(monkeypatch, db, pol), "--out", str(tmp_path / "o.json")]
    with pytest.raises(UserError, match=r"^cannot write --out .*o\.json: No space left on device"):
        probe.main(argv)
