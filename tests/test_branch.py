"""experiments/branch.py: pairs of clips played from one saved emulator state, one that may only
climb and one that may not, labelled by the surface teacher (the real ALE, a real policy file)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.branch import (
    ENV_ID,
    BranchSettings,
    make_pairs,
    play_clip,
    policy_picker,
    up_actions,
)
from lib.atari.saved_states import SingleGame
from lib.models.policy import AtariA2C, policy_checkpoint
from lib.store.checkpoints import atomic_torch_save
from lib.store.segments import list_segments, read_db_info, read_segment

ROOT = Path(__file__).resolve().parents[1]


def policy(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "policy.pt"
    meanings = SingleGame(0).meanings
    atomic_torch_save(policy_checkpoint(AtariA2C((4, 84, 84), 18), ENV_ID, "seaquest", meanings), path)
    return path


def test_a_restored_state_plays_the_same_steps_again() -> None:
    game = SingleGame(3)
    game.reset()
    for a in np.random.default_rng(0).integers(0, 18, 40):
        game.step(int(a))
    state = game.save()
    moves = np.random.default_rng(1).integers(0, 18, 25)
    runs = []
    for _ in range(2):
        game.load(state)
        runs.append([(game.step(int(a)), game.frame.copy(), game.stack.copy()) for a in moves])
    for (r1, f1, s1), (r2, f2, s2) in zip(*runs, strict=True):
        assert r1 == r2
        assert np.array_equal(f1, f2) and np.array_equal(s1, s2)
    # and the moves changed the picture: the comparison above is not of frames that never move
    assert not np.array_equal(runs[0][0][1], runs[0][-1][1])


def test_the_climb_clip_takes_only_up_actions_and_the_stay_clip_none(tmp_path: Path) -> None:
    game = SingleGame(0)
    up = up_actions(game.meanings)
    assert {m for m, u in zip(game.meanings, up, strict=True) if u} == {
        "UP", "UPRIGHT", "UPLEFT", "UPFIRE", "UPRIGHTFIRE", "UPLEFTFIRE"
    }  # fmt: skip
    from lib.models.policy import load_policy

    net, _ = load_policy(policy(tmp_path), ENV_ID, "seaquest", (4, 84, 84), 18)
    pick = policy_picker(net.eval(), np.random.default_rng(0))
    game.reset()
    climb = play_clip(game, pick, up, 30)
    stay = play_clip(game, pick, ~up, 30)
    assert len(climb.actions) == len(stay.actions) == 30
    assert all(up[a] for a in climb.actions)
    assert not any(up[a] for a in stay.actions)


@pytest.mark.parametrize("teacher", ["surface", "refill"])
def test_pairs_go_into_the_db_with_the_teachers_labels(tmp_path: Path, teacher: str) -> None:
    db = tmp_path / "db"
    s = BranchSettings(pairs=3, steps=6, every=2, seed=0, teacher=teacher)
    rules = make_pairs(policy(tmp_path), db, s, at=lambda f: True, log=lambda m: None)
    assert sum(rules.values()) == 3
    assert read_db_info(db).env_id == ENV_ID  # type: ignore[union-attr]
    segs = list_segments(db, warn=None)
    assert len(segs) == 6 and {s.split("/")[0] for s in segs} == {"90", "91"}
    labels = [json.loads(line) for line in (db / "labels.jsonl").read_text().splitlines()]
    assert len(labels) == 3
    for lab in labels:
        a, b = read_segment(db, lab["sample1"]), read_segment(db, lab["sample2"])
        assert {a.meta["branch"], b.meta["branch"]} == {"climb", "stay"}
        assert len(a) == len(b) == 6
        # both clips start from the one saved state: the same first frame
        assert np.array_equal(a.frames[0], b.frames[0])
        assert lab["teacher"] == teacher and lab["sampling"] == "branch" and lab["label"] in (0, 1, 2)
    with pytest.raises(ValueError, match="climb pairs are labelled by a teacher of the climb"):
        make_pairs(policy(tmp_path), tmp_path / "db2", replace(s, teacher="score"), at=lambda f: True)


def test_a_db_with_segments_and_a_missing_policy_are_one_line_and_exit_2(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "experiments.branch", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)

    gone = run("--policy", str(tmp_path / "nope.pt"), "--db", str(tmp_path / "db"))
    assert gone.returncode == 2 and gone.stderr.startswith("error:") and len(gone.stderr.strip().splitlines()) == 1
    db = tmp_path / "full"
    make_pairs(policy(tmp_path), db, BranchSettings(pairs=1, steps=3), at=lambda f: True, log=lambda m: None)
    full = run("--policy", str(tmp_path / "policy.pt"), "--db", str(db))
    assert full.returncode == 2 and "holds segments already" in full.stderr
    bad = run("--policy", str(tmp_path / "policy.pt"), "--db", str(tmp_path / "x"), "--steps", "1")
    assert bad.returncode == 2 and "--steps" in bad.stderr


def test_a_policy_that_never_gets_there_stops_after_max_games(tmp_path: Path) -> None:
    said: list[str] = []
    s = BranchSettings(pairs=5, steps=3, seed=0, max_games=2)
    rules = make_pairs(policy(tmp_path), tmp_path / "db", s, at=lambda f: False, log=said.append)
    assert rules == {} and said and "0 of 5 pairs after 2 games" in said[-1]


def _seed_run(tmp_path: Path, pairs: int = 3, start: str = "best"):
    from experiments.stages import SeedRun

    args = argparse.Namespace(branch_pairs=pairs, branch_steps=4, seed=0, start=start, teacher="surface")
    tdir = tmp_path / "surface-100-branch3"
    v0 = policy(tmp_path)
    return SeedRun(args, tdir, tmp_path / "db", {"train": [], "holdout": []}, v0)


def _trained_on(sr, k: int, monkeypatch) -> list[Path]:
    """The DBs round ``k``'s reward model would be trained on beside its own label DB (its training
    stopped as it starts; no labels asked)."""
    from experiments import stages

    sr.args.labels, sr.args.sampling, sr.args.holdout = 10, "rare", 0.2
    seen: dict[str, list[Path]] = {}

    class Trained(Exception):
        pass

    def train(ldb: Path, rdir: Path, args, older: list[Path]) -> Path:
        seen["older"] = older
        raise Trained

    monkeypatch.setattr(stages, "label", lambda *a, **k: None)
    monkeypatch.setattr(stages, "label_and_train", train)
    monkeypatch.setattr(stages, "round_source", lambda sr, k: (sr.db, sr.split))
    with pytest.raises(Trained):
        stages.reward_round(sr, k)
    return seen["older"]


def test_a_rounds_branch_db_is_played_by_the_rlhf_arms_start_and_made_once(tmp_path: Path, monkeypatch) -> None:
    """--branch-pairs of experiments/round.py: round 1's pairs from v0's policy, round 2's from
    round 1's best rlhf policy; a finished DB is reused, a stopped one (.partial) made again."""
    from experiments import branch
    from experiments.stages import BRANCH_DONE, branch_round
    from lib.core.errors import UserError

    real = branch.make_pairs
    played: list[Path] = []

    def anywhere(policy_path: Path, db: Path, s: BranchSettings, log) -> dict[str, int]:
        played.append(policy_path)
        return real(policy_path, db, s, at=lambda f: True, log=log)

    monkeypatch.setattr(branch, "make_pairs", anywhere)
    sr = _seed_run(tmp_path)
    assert branch_round(_seed_run(tmp_path, pairs=0), 1) is None
    bdb, made = branch_round(sr, 1)
    assert bdb == sr.tdir / "r1" / "branch-db" and played == [sr.v0_policy]
    assert made["pairs"] == 3 and made["policy"] == str(sr.v0_policy) and (bdb / BRANCH_DONE).is_file()
    assert (
        len((bdb / "labels.jsonl").read_text().splitlines()) == 3
        and not (sr.tdir / "r1" / "branch-db.partial").exists()
    )
    assert branch_round(sr, 1) == (bdb, made) and len(played) == 1  # reused, not played again
    rl = sr.tdir / "r1" / "rlhf"
    rl.mkdir(parents=True)
    best = rl / "best_000001000_score10_len100.pt"
    best.write_bytes(sr.v0_policy.read_bytes())
    stale = sr.tdir / "r2" / "branch-db.partial"
    stale.mkdir(parents=True)
    (stale / "90").mkdir()
    (stale / "90" / "junk.npz").write_bytes(b"x")
    bdb2, made2 = branch_round(sr, 2)
    assert played[-1] == best and made2["policy"] == str(best) and made2["seed"] != made["seed"]
    assert not stale.exists() and not (bdb2 / "90" / "junk.npz").exists()
    assert branch_round(_seed_run(tmp_path, start="v0"), 3)[1]["policy"] == str(sr.v0_policy)  # --from v0
    (bdb2 / BRANCH_DONE).unlink()
    with pytest.raises(UserError, match="no readable branch.json"):
        branch_round(sr, 2)


def test_every_rounds_branch_db_is_trained_on_beside_the_labels(tmp_path: Path, monkeypatch) -> None:
    from experiments import branch

    real = branch.make_pairs
    monkeypatch.setattr(branch, "make_pairs", lambda p, d, s, log: real(p, d, s, at=lambda f: True, log=log))
    sr = _seed_run(tmp_path, start="v0")
    t = sr.tdir
    assert _trained_on(sr, 2, monkeypatch) == [t / "r1" / "label-db", t / "r1" / "branch-db", t / "r2" / "branch-db"]


def test_climb_gap_is_in_the_units_of_the_reference_steps(tmp_path: Path, monkeypatch) -> None:
    """--measure: a climbing and a still low-gauge diver step of the branch clips, each step's pay
    (median of the reference steps 0, their std 1); worked out here from the model's own steps."""
    from experiments import readouts
    from experiments.branch import climb_gap
    from lib.models.reward import load_reward_model, new_reward_model, reward_checkpoint, save_reward_checkpoint
    from lib.reward.eval import predict_segments

    db, ref = tmp_path / "db", tmp_path / "ref"
    pol = policy(tmp_path)
    make_pairs(pol, db, BranchSettings(pairs=2, steps=6, seed=0), at=lambda f: True, log=lambda m: None)
    make_pairs(pol, ref, BranchSettings(pairs=2, steps=8, seed=5), at=lambda f: True, log=lambda m: None)
    torch.manual_seed(3)
    net = new_reward_model("diff", 18, flow=True)
    reward = tmp_path / "reward.pt"
    save_reward_checkpoint(reward_checkpoint([net], ENV_ID, "seaquest", SingleGame(0).meanings), reward)

    def flags(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # low: the first 4 steps; up: the even ones
        n = len(frames)
        return np.arange(n) < 4, np.arange(n) % 2 == 0

    monkeypatch.setattr(readouts, "diver_step_flags", flags)
    ref_names = list_segments(ref, warn=None)
    g = climb_gap(reward, db, ref, ref_names)
    rm = load_reward_model(reward)
    r = predict_segments(rm, ref, ref_names).pred_steps.astype(np.float64)
    p = predict_segments(rm, db, list_segments(db, warn=None))
    z = (p.pred_steps.astype(np.float64) - np.median(r)) / r.std()
    per = z.reshape(-1, 6)  # every clip 6 steps
    assert g["climb_steps"] == 2 * len(per) and g["still_steps"] == 2 * len(per)
    assert np.isclose(g["climb_z"], per[:, [0, 2]].mean()) and np.isclose(g["still_z"], per[:, [1, 3]].mean())
    assert np.isclose(g["gap"], g["climb_z"] - g["still_z"]) and not np.isclose(g["gap"], 0.0)


def test_death_pairs_are_one_replay_that_loses_the_life_and_one_that_keeps_it(tmp_path: Path) -> None:
    """--kind death: the state --steps before a lost life, played again; the pair's 'dies' clip
    loses a life within its steps, the 'lives' clip does not, both start from the same frame, and
    the teacher's death rule prefers the one that lives."""
    from experiments.branch import make_death_pairs

    db = tmp_path / "db"
    s = BranchSettings(pairs=2, steps=40, seed=0, max_games=20, teacher="surface")
    rules = make_death_pairs(policy(tmp_path), db, s, log=lambda m: None)
    assert rules == {"death": 2}
    labels = [json.loads(line) for line in (db / "labels.jsonl").read_text().splitlines()]
    for lab in labels:
        a, b = read_segment(db, lab["sample1"]), read_segment(db, lab["sample2"])
        dies, lives = (a, b) if a.meta["branch"] == "dies" else (b, a)
        assert {a.meta["branch"], b.meta["branch"]} == {"dies", "lives"}
        assert dies.dones.any() and not lives.dones.any() and len(lives) == 40
        assert np.array_equal(dies.frames[0], lives.frames[0])
        assert lab["label"] == (2 if a is dies else 1) and lab["rule"] == "death" and lab["sampling"] == "death-branch"


def test_a_rounds_death_pairs_go_into_their_own_db_and_are_trained_on(tmp_path: Path, monkeypatch) -> None:
    from experiments import branch, stages

    made: list[tuple[str, Path]] = []

    def fake(kind: str):
        def make(policy_path: Path, db: Path, s: BranchSettings, log) -> dict[str, int]:
            made.append((kind, db))
            return {"death" if kind == "death" else "diver_climb": s.pairs}

        return make

    monkeypatch.setattr(branch, "make_pairs", fake("climb"))
    monkeypatch.setattr(branch, "make_death_pairs", fake("death"))
    sr = _seed_run(tmp_path, start="v0")
    sr.args.death_pairs, sr.args.death_steps, sr.args.teacher = 4, 40, "score"
    ddb, info = stages.branch_round(sr, 1, "death")
    assert ddb == sr.tdir / "r1" / "death-db" and info["kind"] == "death" and info["steps"] == 40
    assert made == [("death", sr.tdir / "r1" / "death-db.partial")]
    t = sr.tdir
    assert _trained_on(sr, 2, monkeypatch) == [
        t / "r1" / "label-db",
        t / "r1" / "branch-db",
        t / "r2" / "branch-db",
        t / "r1" / "death-db",
        t / "r2" / "death-db",
    ]


def _branch_cli(capsys, *args: str) -> tuple[int, list[str]]:
    """``python -m experiments.branch ARGS`` in this process: its exit code and stderr lines."""
    from experiments.branch import main
    from lib.core.errors import run_cli

    with pytest.raises(SystemExit) as e:
        run_cli(lambda: main(list(args)))
    return e.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "extra, msg",
    [
        (("--seed", "-1"), "--seed must be in 0.."),
        (("--seed", "99999999999"), "--seed must be in 0.."),
        (("--teacher", "score", "--kind", "death", "--policy", "{tmp}/nope.pt"), "nope.pt"),
        (("--kind", "death", "--gauge", "high"), "--gauge is for climb pairs"),
    ],
)
def test_branch_mistakes_are_one_line_exit_2_and_leave_no_directory(tmp_path: Path, capsys, extra, msg) -> None:
    """A bad --seed is refused before anything is made (was: ValueError / ALE TypeError tracebacks);
    a run that fails before its first pair leaves no empty --db behind (was: the new directories)."""
    extra = tuple(x.format(tmp=tmp_path) for x in extra)
    code, err = _branch_cli(capsys, "--policy", str(policy(tmp_path)), "--db", str(tmp_path / "new" / "db"), *extra)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err
    assert not (tmp_path / "new").exists()


def test_branch_db_that_is_a_file_or_measured_empty_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    """--db naming a file (was: FileExistsError), --measure on a --db without segments (was: numpy's
    "need at least one array"): one line, exit 2."""
    from lib.models.reward import new_reward_model, reward_checkpoint, save_reward_checkpoint

    pol = policy(tmp_path)
    (tmp_path / "a-file").write_text("x")
    code, err = _branch_cli(capsys, "--policy", str(pol), "--db", str(tmp_path / "a-file"))
    assert code == 2 and len(err) == 1 and "--db" in err[0] and "not a directory" in err[0], err
    ref, empty = tmp_path / "ref", tmp_path / "empty"
    make_pairs(pol, ref, BranchSettings(pairs=1, steps=4, seed=5), at=lambda f: True, log=lambda m: None)
    empty.mkdir()
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"holdout": list_segments(ref, warn=None), "train": []}))
    reward = tmp_path / "reward.pt"
    net = new_reward_model("diff", 18, flow=True)
    save_reward_checkpoint(reward_checkpoint([net], ENV_ID, "seaquest", SingleGame(0).meanings), reward)
    measure = ("--measure", str(reward), "--ref-db", str(ref), "--ref-split", str(split))
    code, err = _branch_cli(capsys, "--db", str(empty), *measure)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "no segments" in err[0], err
    code, err = _branch_cli(capsys, "--db", str(tmp_path / "a-file"), *measure)
    assert code == 2 and len(err) == 1 and "not a directory" in err[0], err


def test_a_high_gauge_branch_point_and_step_is_where_the_low_one_is_not() -> None:
    """On real frames (CLIMB: a diver aboard from step 182, the sub at row 134, the gauge low from
    step 416): ``--gauge high`` branches and ``diver_step_flags(.., "high")`` flags the diver steps
    whose gauge is at least HIGH_OXYGEN, never a low-gauge one; the low branch point stays where it was."""
    from test_seaquest import CLIMB_PLAN

    from bench.dbs import play_plan
    from experiments.branch import at_branch_point
    from experiments.readouts import diver_step_flags
    from lib.atari.seaquest import HIGH_OXYGEN, divers_aboard, oxygen_levels

    frames = play_plan(CLIMB_PLAN).frames
    levels, divers = oxygen_levels(frames), divers_aboard(frames)
    low, _ = diver_step_flags(frames)
    high, up = diver_step_flags(frames, "high")
    assert high.sum() >= 5 and low.sum() >= 5 and not (low & high).any()
    assert (levels[high] >= HIGH_OXYGEN).all() and (divers[high] > 0).all()
    assert not up[high].any()  # the sub waits at row 134 there: no climb
    t_high, t_low = int(np.flatnonzero(high)[0]), int(np.flatnonzero(low)[0])
    assert at_branch_point(frames[t_high], "high") and not at_branch_point(frames[t_high])
    assert at_branch_point(frames[t_low]) and not at_branch_point(frames[t_low], "high")
