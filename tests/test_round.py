"""``experiments/round.py`` at a tiny budget: every stage runs for real (A2C, teacher labels, reward
model, both fine-tune arms, evaluation games), and a second run with the same --out reuses them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lib.core.settings import MAX_SEED
from lib.store.labels import EQUAL, FIRST_BETTER, SECOND_BETTER, Label, append_labels, read_label_log
from lib.store.segments import list_segments

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--v0-steps", "2000", "--ft-steps", "2000", "--labels", "15", "--eval-games", "1", "--record-prob", "0.1"]
TINY += ["--evals", "1", "--test-episodes", "1", "--teacher", "oxygen", "--rounds", "2"]


def run_round(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.round", "--out", str(out), *TINY, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)


@pytest.mark.slow
def test_round_runs_every_stage_and_continues(tmp_path: Path) -> None:
    """Two rounds: round 2 labels what round 1's rlhf fine-tune recorded, its reward model learns
    from both rounds' labels, its fine-tunes start from round 1's best policies."""
    out = tmp_path / "round"
    p = run_round(out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for line in ("| 0 | v0 | ", "| 1 | control | ", "| 1 | rlhf | ", "| 2 | control | ", "| 2 | rlhf | "):
        assert f"\n{line}" in p.stdout, line
    assert "agreement with the teacher" in p.stdout and "target: rlhf refills at least once per game" in p.stdout
    assert p.stdout.count("reward-hacking watch") == 2
    base = out / "seed0"
    tdir = base / "oxygen-15"
    png = (tdir / "round.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    report = json.loads((tdir / "round.json").read_text())
    assert len(report["rounds"]) == 2 and set(report["rounds"][1]["rows"]) == {"v0", "control", "rlhf"}
    assert "refills" in report["rounds"][1]["rows"]["rlhf"] and "climbs" in report["rounds"][1]["rows"]["rlhf"]
    # Round 1: the teacher labeled only v0's segments that are not held out.
    split = json.loads((base / "split.json").read_text())
    labels = read_label_log(tdir / "r1" / "label-db")
    assert len(labels) == 15 and all(lab.extra["teacher"] == "oxygen" for lab in labels)
    seen = {s for lab in labels for s in (lab.sample1, lab.sample2)}
    assert seen <= set(split["train"]) and not seen & set(split["holdout"])
    # Round 2: labels of what round 1's rlhf arm recorded, a model of both rounds' labels.
    split2 = json.loads((tdir / "r2" / "split.json").read_text())
    assert set(list_segments(tdir / "r2" / "label-db")) == set(split2["train"])
    assert set(split2["train"]) | set(split2["holdout"]) == set(list_segments(tdir / "r1" / "rlhf-db"))
    assert len(read_label_log(tdir / "r2" / "label-db")) == 15
    reward2 = next(line for line in p.stdout.splitlines() if "[round" in line and "reward: $" in line and "r2" in line)
    assert str(tdir / "r1" / "label-db") in reward2 and str(tdir / "r2" / "label-db") in reward2
    rlhf2 = next(line for line in p.stdout.splitlines() if "round-rlhf-oxygen-15-r2: $" in line)
    assert f"--reward {tdir / 'r2' / 'reward-round.pt'}" in rlhf2
    assert f"--model {tdir / 'r1' / 'rlhf' / 'best_'}" in rlhf2
    control2 = next(line for line in p.stdout.splitlines() if "round-control-r2: $" in line)
    assert f"--model {base / 'control' / 'r1' / 'best_'}" in control2
    # Started again with the same --out: every stage is reused, nothing trains twice.
    again = run_round(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reused") == 9 and "$ " not in again.stdout
    assert json.loads((tdir / "round.json").read_text())["rounds"] == report["rounds"]


@pytest.mark.slow
def test_a_stopped_arm_continues_from_its_last_pt(tmp_path: Path, capsys) -> None:
    """An arm is stage 1 called with settings (A2CConfig through 01_a2c.py's own flags): a run
    stopped short of its steps continues with --resume from its last.pt, not from the policy the
    arm started from (01_a2c.py refuses both)."""
    from dataclasses import replace

    from experiments.round import build_parser, seed_args
    from experiments.stages import a2c_progress, train_a2c
    from lib.a2c.config import A2CConfig

    argv = ["--out", str(tmp_path / "out"), "--teacher", "score", "--test-episodes", "1"]
    args = seed_args(build_parser().parse_args(argv), 0)
    start = A2CConfig(name="start", save=str(tmp_path / "start"), max_steps=64, envs=2)
    train_a2c(start, 1, args)
    policy = str(tmp_path / "start" / "last.pt")
    arm = replace(start, name="arm", save=str(tmp_path / "arm"), model=policy, finetune=True)
    # stands for a 128-step arm stopped at step 64: its schedule (last.pt's lr_decay_steps) is 128's
    train_a2c(replace(arm, max_steps=64, lr_decay_steps=128), 1, args)
    capsys.readouterr()
    train_a2c(replace(arm, max_steps=128), 1, args)
    (cmd,) = [line for line in capsys.readouterr().out.splitlines() if "arm: $" in line]
    assert "--resume" in cmd and "--model" not in cmd and "--force" not in cmd, cmd
    assert a2c_progress(tmp_path / "arm") >= 128


def test_teacher_evidence_counts_by_the_teachers_own_rule(tmp_path: Path) -> None:
    """A pair that differs in oxygen deaths and in score was decided by the oxygen death for the
    oxygen teacher, by the score for the score teacher."""
    from experiments.stages import teacher_evidence

    def lab(i: int, label: int, deaths: list[int], refills: list[int], returns: list[float]) -> Label:
        extra = {"oxygen_deaths": deaths, "refills": refills, "returns": returns}
        return Label(f"00/{i:08d}.dat", f"00/{i + 100:08d}.dat", label, source="oracle", extra=extra)

    append_labels(
        tmp_path,
        [
            lab(0, FIRST_BETTER, [0, 1], [0, 0], [0.0, 20.0]),  # oxygen: death; score: the score
            lab(1, SECOND_BETTER, [0, 0], [0, 1], [20.0, 0.0]),  # oxygen: refill; score: the score
            lab(2, FIRST_BETTER, [0, 0], [0, 0], [40.0, 20.0]),  # both: the score
            lab(3, EQUAL, [0, 0], [0, 0], [20.0, 20.0]),
        ],
    )
    oxygen = teacher_evidence(tmp_path, tmp_path, [], "oxygen")
    assert (oxygen["by_oxygen_death"], oxygen["by_refill"], oxygen["by_score"], oxygen["ties"]) == (1, 1, 1, 1)
    score = teacher_evidence(tmp_path, tmp_path, [], "score")
    assert (score["by_oxygen_death"], score["by_refill"], score["by_score"], score["ties"]) == (0, 0, 3, 1)
    assert score["labels"] == oxygen["labels"] == 4


def test_life_loss_rewards_are_in_the_learners_units():
    from experiments.readouts import LIFE_LOSS_LEAD, life_loss_rewards

    pred = np.zeros(100)
    pred[::10] = 1.0  # a regular reward: median 0, std 0.3
    lost = np.zeros(100, dtype=bool)
    lost[[40, 95]] = True
    pred[40], pred[95] = 3.0, -1.0
    pred[95 - LIFE_LOSS_LEAD : 95] = 0.5
    std = pred.std()
    f = life_loss_rewards(pred, lost)
    assert f["life_losses"] == 2
    assert f["life_loss_z"] == pytest.approx((3.0 - 1.0) / 2 / std)
    lead = np.r_[pred[40 - LIFE_LOSS_LEAD : 40], pred[95 - LIFE_LOSS_LEAD : 95]]
    assert f["pre_loss_z"] == pytest.approx(lead.mean() / std)
    assert f["mean_z"] == pytest.approx((pred.mean() - np.median(pred)) / std)  # the median step is 0
    none = life_loss_rewards(pred, np.zeros(100, dtype=bool))
    assert none["life_losses"] == 0 and np.isnan(none["life_loss_z"]) and np.isnan(none["pre_loss_z"])
    with pytest.raises(ValueError):
        life_loss_rewards(pred, lost[:50])


def _round_args(out: Path, *extra: str):
    from experiments.round import build_parser

    return build_parser().parse_args(["--out", str(out), "--teacher", "score", "--labels", "15", *extra])


def _readable(name: str) -> str:
    """A round's directory name without the hash of its settings (pass-through flags: 8 hex digits)."""
    readable, sep, digest = name.rpartition("-")
    assert sep and len(digest) == 8 and all(c in "0123456789abcdef" for c in digest), name
    return readable


def test_round_directories_name_what_makes_their_labels_differ(tmp_path: Path) -> None:
    from experiments.round import ensemble_of, round_name
    from experiments.stages import label_steps

    assert round_name(_round_args(tmp_path)) == "score-15"  # rare, the default, adds nothing
    assert round_name(_round_args(tmp_path, "--sampling", "random")) == "score-15-random"
    assert round_name(_round_args(tmp_path, "--sampling", "uncertain")) == "score-15-uncertain"
    # a lone flag as the value (argparse would take it for one of its own)
    lone = _round_args(tmp_path, "--reward-args", "--diff-flow", "--ft-args", "--kl", "--seeds", "1")
    assert (lone.reward_args, lone.ft_args, lone.seeds) == ("--diff-flow", "--kl", [1])
    assert _readable(round_name(_round_args(tmp_path, "--reward-args", "--diff-flow"))) == "score-15-diffflow"
    assert round_name(_round_args(tmp_path, "--from", "v0")) == "score-15-fromv0"
    args = _round_args(tmp_path, "--sampling", "disagree", "--reward-args", "--ensemble 3 --diff-block 6x12")
    assert _readable(round_name(args)) == "score-15-disagree-ensemble3diffblock6x12"
    assert ensemble_of(args) == 3 and ensemble_of(_round_args(tmp_path)) == 1
    assert ensemble_of(_round_args(tmp_path, "--reward-args=--ensemble=4")) == 4
    assert label_steps(300, "random") == [300] and label_steps(300, "uncertain") == [100, 200, 300]
    assert label_steps(300, "rare") == [300]  # no model picks: all at once
    assert round_name(_round_args(tmp_path, "--ft-layers", "full")) == "score-15-full"
    assert round_name(_round_args(tmp_path, "--ft-layers", "frozen")) == "score-15"
    branch = _round_args(tmp_path, "--teacher", "surface", "--branch-pairs", "150", "--reward-args", "--diff-flow")
    assert _readable(round_name(branch)) == "surface-15-branch150-diffflow"
    assert round_name(_round_args(tmp_path, "--branch-pairs", "9", "--branch-steps", "50")) == "score-15-branch9x50"


def test_ft_layers_are_both_arms_fine_tune_settings() -> None:
    """--ft-layers full trains every layer at the fine-tune's learning rate; frozen is --finetune."""
    from experiments.flags import a2c_argv
    from experiments.stages import ft_settings
    from lib.a2c.config import FINETUNE_LEARNING_RATE, A2CConfig

    frozen = A2CConfig(name="x", model="p.pt", **ft_settings("frozen"))
    full = A2CConfig(name="x", model="p.pt", **ft_settings("full"))
    assert "--finetune" in a2c_argv(frozen) and "--lr" not in a2c_argv(frozen)
    assert "--finetune" not in a2c_argv(full) and a2c_argv(full)[a2c_argv(full).index("--lr") + 1] == str(
        FINETUNE_LEARNING_RATE
    )


@pytest.mark.parametrize(
    "extra, msg",
    [
        (("--sampling", "disagree"), "--ensemble"),
        (("--sampling", "uncertain", "--labels", "2"), "--labels 3"),
    ],
)
def test_round_sampling_mistakes_are_one_line(tmp_path: Path, extra, msg) -> None:
    from experiments.round import check
    from lib.core.errors import UserError

    with pytest.raises(UserError, match=msg):
        check(_round_args(tmp_path, *extra))


@pytest.mark.slow
def test_round_labels_in_thirds_picked_by_the_models_so_far(tmp_path: Path) -> None:
    """--sampling uncertain: 5 random labels, a model, 5 it is least sure of, a model, 5 more; the
    last model is the round's. Run again, everything is reused."""
    from bench.dbs import make_square_db
    from experiments.round import check, round_name, seed_args
    from experiments.stages import label_and_train

    db = tmp_path / "db"
    make_square_db(db, n_segments=30, steps=10, seed=0)
    given = _round_args(tmp_path / "out", "--sampling", "uncertain", "--reward-args", "--epochs 2")
    check(given)  # as the round does: the teacher's --death-penalty default resolved
    args = seed_args(given, 0)
    tdir = args.out / round_name(args)
    tdir.mkdir(parents=True)
    model = label_and_train(db, tdir, args)
    assert model == tdir / "reward-round.pt" and model.is_file()
    assert (tdir / "reward-round-5.pt").is_file() and (tdir / "reward-round-10.pt").is_file()
    labels = read_label_log(db)
    assert len(labels) == 15
    assert [lab.extra.get("sampling", "random") for lab in labels] == ["random"] * 5 + ["uncertain"] * 10
    stamp = model.stat().st_mtime_ns
    assert label_and_train(db, tdir, args) == model and model.stat().st_mtime_ns == stamp
    assert len(read_label_log(db)) == 15


def _round_cli(tmp_path: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    """``python -m experiments.round --teacher score EXTRA``: its exit code and stderr lines. Its --out
    lies under a file, so that a round the checks let through stops at once ("cannot create --out")
    instead of training a v0."""
    from experiments.round import cli

    (tmp_path / "a-file").write_text("")
    old = sys.argv
    sys.argv = ["experiments/round.py", "--out", str(tmp_path / "a-file" / "out"), "--teacher", "score", *extra]
    try:
        with pytest.raises(SystemExit) as e:
            cli()
    finally:
        sys.argv = old
    return e.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "extra, msg",
    [
        (("--scale", "inf"), "--scale must be a number in (0, 1000]"),
        (("--scale", "nan"), "--scale must be a number"),
        (("--scale", "1e-9"), "leaves less than one agent step"),
        (("--seeds", "-1"), "--seeds must be distinct numbers in 0.."),
        (("--seeds", str(2**70)), "--seeds must be distinct numbers in 0.."),
        # one bound for every stage: a seed stage 1 would refuse is refused before any stage runs
        (("--seeds", f"0,{MAX_SEED + 1}"), f"--seeds must be distinct numbers in 0..{MAX_SEED}"),
        (("--seeds", "1,1"), "--seeds must be distinct"),
        (("--rounds", "0"), "--rounds must be in 1.."),
        (("--reward-args", "--lr '3e-4"), "--reward-args cannot be split"),
        (("--teacher-noise", "nan"), "--teacher-noise"),
        (("--out", "/proc/x"), "cannot create --out /proc/x"),
    ],
)
def test_round_bad_values_are_one_line_exit_2(tmp_path: Path, capsys, extra, msg) -> None:
    """Issue 24 (Low 4): every bad value ends in one line and exit 2 before any stage runs."""
    code, err = _round_cli(tmp_path, capsys, *extra)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err


def _rows(score: float, refills: float, climbs: float) -> dict[str, dict[str, float]]:
    row = {"score": score, "score_ci": 10.0, "length": 900.0, "refills": refills, "deaths": 4.0}
    row |= {"oxygen_deaths": 2.0, "oxygen_share": 0.5, "climbs": climbs, "surface_share": 0.1}
    return {"v0": dict(row), "control": dict(row), "rlhf": dict(row, score=score + 50, refills=refills * 4)}


def test_mean_ci95() -> None:
    import math

    from experiments.round_report import mean_ci95

    m, h = mean_ci95([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and h == pytest.approx(1.96 * np.std([1, 2, 3, 4], ddof=1) / 2)
    assert math.isnan(mean_ci95([5.0])[1]) and mean_ci95([5.0])[0] == 5.0


def test_seeds_are_averaged_with_an_interval_across_them_and_targets_read_the_mean() -> None:
    from experiments.round_report import across_seeds, mean_ci95, table, targets

    seeds = [[_rows(400, 0.5, 1.0), _rows(420, 1.0, 2.0)], [_rows(500, 0.25, 3.0), _rows(460, 0.5, 0.0)]]
    rows = across_seeds(seeds)
    assert len(rows) == 2
    assert rows[1]["rlhf"]["score"] == pytest.approx(490.0)
    assert rows[1]["rlhf"]["score_ci"] == pytest.approx(mean_ci95([470, 510])[1])  # across seeds, not games
    assert rows[0]["rlhf"]["refills"] == pytest.approx(1.5) and rows[1]["control"]["climbs"] == pytest.approx(1.0)
    text = table(rows)
    assert text.count("\n| 0 | v0 |") == 1 and "\n| 2 | rlhf | 490 ± " in text and "low-gauge climbs/game" in text
    score = dict(targets("score", rows))
    assert score == {
        "round 1: rlhf scores at least 0.9x control": True,
        "round 2: rlhf scores at least 0.9x control": True,
    }
    surface = dict(targets("surface", rows))  # after the last round: rlhf refills 3.0, scores 490 vs 440
    assert surface["rlhf refills at least once per game"] and surface["rlhf scores no less than control"]
    assert not surface["rlhf loses at most half the control's share of lives to oxygen"]
    assert not surface["stretch: rlhf scores at least 1.5x control"]
    assert across_seeds(seeds[:1]) == seeds[0]  # one seed: its own rows and intervals


def test_an_arms_row_has_the_share_of_lives_lost_surfacing_empty_only_where_its_games_counted_it() -> None:
    from experiments.round_report import arm_row, table

    games = {"scores": [100.0, 300.0], "lengths": [800, 1200], "refills": [0, 1], "deaths": [4, 4]}
    games |= {"oxygen_deaths": [1, 0], "climbs": [0, 2], "surface_steps": [80, 120], "rescues": [1, 2]}
    games |= {"diver_steps": [100, 300], "surfacing_deaths": [3, 1]}
    row = arm_row(games)
    assert row["surfacing_share"] == 0.5 and row["oxygen_share"] == 0.125
    assert "| lost surfacing empty |" in table([{"v0": row}]) and "| 50% |" in table([{"v0": row}])
    older = arm_row({k: v for k, v in games.items() if k != "surfacing_deaths"})  # an eval.json made before
    assert "surfacing_share" not in older and "| n/a |" in table([{"v0": older}])


def test_an_arms_row_has_the_best_life_and_the_best_checkpoint_beside_the_mean(tmp_path: Path) -> None:
    """evaluate_arm's record (a cache of real files, read back without playing): the best single
    life over the games and the run's best checkpoint; an older cache without lives reads n/a."""
    from experiments.round_report import across_seeds, arm_row, table
    from experiments.stages import EVAL_RECORD, EVAL_SEED, evaluate_arm, file_digest
    from lib.models.policy import best_checkpoint_name

    run = tmp_path / "rlhf"
    run.mkdir()
    policy = run / "last.pt"
    policy.write_bytes(b"policy at step 500000")
    for step, score in ((100_000, 300.0), (480_000, 412.3)):
        (run / best_checkpoint_name(step, score, 1530)).write_bytes(b"")
    games = {"scores": [100.0, 300.0], "lengths": [800, 1200], "refills": [None, None]}
    games |= {"deaths": [None, None], "oxygen_deaths": [None, None]}
    lives = [[[40.0, 300], [60.0, 500]], [[60.0, 600], [240.0, 400], [0.0, 200]]]
    args = argparse.Namespace(eval_games=2)
    key = {"policy": file_digest(policy), "games": 2, "seed": EVAL_SEED, "record": EVAL_RECORD}
    cache = tmp_path / "eval.json"
    cache.write_text(json.dumps({"made_from": key, "value": {**games, "lives": lives}}))
    row = arm_row(evaluate_arm(policy, cache, args))
    assert (row["best_life"], row["best_life_steps"]) == (240.0, 400.0)
    assert (row["best_ckpt"], row["best_ckpt_kstep"]) == (412.3, 480.0)  # the last best_*.pt written
    text = table([{"rlhf": row}])
    assert "| best life | best checkpoint |" in text and "| 240 in 400 steps | 412 at 480k |" in text
    other = dict(row, best_life=200.0, best_life_steps=600.0)
    seeds = table(across_seeds([[{"rlhf": row}], [{"rlhf": other}]]))
    assert re.search(r"\| 220 ± \d+ in 500 steps \|", seeds)  # the seeds' mean, its interval across them
    cache.write_text(json.dumps({"made_from": key, "value": games}))  # cached before lives were kept
    older = arm_row(evaluate_arm(policy, cache, args))
    assert "best_life" not in older and "| n/a | 412 at 480k |" in table([{"rlhf": older}])


def test_teacher_evidence_counts_the_recorded_rule_of_a_surface_teacher(tmp_path: Path) -> None:
    from experiments.stages import teacher_evidence

    def lab(i: int, label: int, rule: str) -> Label:
        extra = {"rule": rule, "oxygen_deaths": [0, 0], "refills": [0, 0], "returns": [20.0, 0.0]}
        return Label(f"00/{i:08d}.dat", f"00/{i + 100:08d}.dat", label, source="oracle", extra=extra)

    rules = ["climb", "climb", "idle", "refill", "score"]
    append_labels(tmp_path, [lab(i, FIRST_BETTER, r) for i, r in enumerate(rules)] + [lab(9, EQUAL, "tie")])
    ev = teacher_evidence(tmp_path, tmp_path, [], "surface")
    assert ev["rules"] == {"climb": 2, "idle": 1, "refill": 1, "score": 1, "tie": 1}
    assert (ev["by_refill"], ev["by_score"], ev["by_oxygen_death"], ev["ties"], ev["labels"]) == (1, 1, 0, 1, 6)


def test_agreement_per_deciding_rule(tmp_path: Path) -> None:
    """Each rule's pairs scored on their own (lib.reward.eval.teacher_agreement), in the round's
    figures: a model that gets the score right and the cost of a death wrong shows it. Three clips
    scored 20 (with a lost life), 10 and 0, a model that pays them 30, 20 and 10: the score teacher
    at penalty 100 prefers both others to the one that died."""
    from bench.dbs import action_model, write_action_db
    from experiments.readouts import held_out_figures
    from lib.store.segments import list_segments

    db = tmp_path / "db"
    write_action_db(db, [(0, 2.0), (1, 1.0), (2, 0.0)], t=10, size=64, lose_life=(0,))
    model = action_model(64, tmp_path / "model.pt", [{0: 3.0, 1: 2.0, 2: 1.0}])
    figs = held_out_figures(db, list_segments(db), model, "score", "cpu", death_penalty=100.0)
    assert figs["teacher_pairs"] == 3 and figs["teacher_agreement"] == pytest.approx(1 / 3)
    assert figs["by_rule"] == {"death": {"agreement": 0.0, "pairs": 2}, "score": {"agreement": 1.0, "pairs": 1}}
    assert figs["score_agreement"] == 1.0  # the bare score orders them as the model does


def test_diver_step_rewards_split_low_gauge_diver_steps_by_climbing() -> None:
    """On real frames (CLIMB: a diver aboard from step 182, the gauge low from step 416, UP pressed
    from step 486, the sub's row 134 there and 131 in the frame after): a model that pays the steps
    whose action climbs pays more there than on the rest; the first of them, whose own frame still
    shows the sub at row 134, is a climbing step (its action moved the sub)."""
    from test_seaquest import CLIMB_PLAN, CLIMB_START, CLIMB_TOP

    from bench.dbs import play_plan
    from experiments.readouts import diver_step_rewards

    seg = play_plan(CLIMB_PLAN)
    frames = seg.frames
    assert seg.actions[CLIMB_START - 1] != 2 and (seg.actions[CLIMB_START : CLIMB_TOP + 1] == 2).all()  # 2: UP
    pred = np.zeros(len(frames))
    pred[CLIMB_START : CLIMB_TOP + 1] = 1.0  # the steps whose action is UP
    figs = diver_step_rewards(pred, [frames[:300], frames[300:]])  # two segments
    # Low gauge with a diver: steps 416-508 (from 509 the gauge fills: not low); the sub climbs in
    # the 23 from 486 (508's step reaches row 46, the surface).
    assert figs["diver_climb_steps"] + figs["diver_still_steps"] == CLIMB_TOP + 1 - 416
    assert figs["diver_climb_steps"] == 23
    assert figs["diver_climb_z"] > figs["diver_still_z"] + 1
    first = np.zeros(len(frames))
    first[CLIMB_START] = 1.0  # only the step that starts the climb is paid
    once = diver_step_rewards(first, [frames[:300], frames[300:]])
    assert once["diver_climb_z"] > once["diver_still_z"]
    with pytest.raises(ValueError):
        diver_step_rewards(pred[:-1], [frames])


def test_cached_figures_are_keyed_on_what_made_them(tmp_path: Path) -> None:
    """A round reuses an evaluation only of the same policy bytes (a resumed run writes a new
    last.pt at the same path) and settings; an unreadable cache is made again."""
    from experiments.stages import cached_json, file_digest

    policy = tmp_path / "last.pt"
    policy.write_bytes(b"policy at step 1000")
    made = []

    def make() -> list[int]:
        made.append(1)
        return [len(made)]

    cache = tmp_path / "eval.json"
    assert cached_json(cache, make, {"policy": file_digest(policy), "games": 30}) == [1]
    assert cached_json(cache, make, {"policy": file_digest(policy), "games": 30}) == [1]  # reused
    policy.write_bytes(b"policy at step 2000")  # resumed to more steps: same path, new content
    assert cached_json(cache, make, {"policy": file_digest(policy), "games": 30}) == [2]
    assert cached_json(cache, make, {"policy": file_digest(policy), "games": 10}) == [3]
    cache.write_text("{not json")
    assert cached_json(cache, make, {"policy": file_digest(policy), "games": 10}) == [4]


def test_held_out_figures_cached_by_an_older_measure_are_made_again(tmp_path: Path) -> None:
    """reward_heldout.json made before the climbing step was aligned (its key has no "figures")
    is not reused; one made with the current key is; the key follows the model's bytes and the
    death penalty."""
    from experiments.stages import HELD_OUT_FIGURES, cached_json, file_digest, held_out_key

    reward = tmp_path / "reward-round.pt"
    reward.write_bytes(b"a reward model")
    args = argparse.Namespace(teacher="surface", death_penalty=0.0)
    cache, made = tmp_path / "reward_heldout.json", []
    old_key = {"reward": file_digest(reward), "teacher": "surface", "holdout": 3}
    cache.write_text(json.dumps({"made_from": old_key, "value": {"diver_climb_z": 9.0}}))
    key = held_out_key(reward, args, ["a", "b", "c"])
    assert key == old_key | {"figures": HELD_OUT_FIGURES} and HELD_OUT_FIGURES >= 2
    assert cached_json(cache, lambda: made.append(1) or {"diver_climb_z": 0.5}, key) == {"diver_climb_z": 0.5}
    assert cached_json(cache, lambda: made.append(1) or {}, key) == {"diver_climb_z": 0.5} and made == [1]
    charged = held_out_key(reward, argparse.Namespace(teacher="score", death_penalty=100.0), ["a"])
    assert charged["death_penalty"] == 100.0 and charged["teacher"] == "score"
    reward.write_bytes(b"another reward model")
    assert held_out_key(reward, args, ["a", "b", "c"])["reward"] != key["reward"]


def test_labels_decided_by_a_rule_the_score_does_not_pay_for() -> None:
    from experiments.round_report import behaviour_share, model_targets

    rules = {"death": 3, "diver_climb": 2, "rescue": 1, "idle": 1, "refill": 1, "score": 40, "tie": 50}
    ev = {"labels": 100, "rules": {**rules, "noise": 1, "cant_tell": 1}}
    assert behaviour_share(ev) == 0.08 and behaviour_share({}) == 0.0
    r1 = {"evidence": {"labels": 4, "rules": {"death": 1, "score": 3}}, "reward_model": {}}
    r2 = {"evidence": ev, "reward_model": {"by_rule": {"diver_climb": {"agreement": 0.85, "pairs": 40}}}}
    assert model_targets("surface", [r1, r2]) == [
        ("round 1: at least 25% of labels decided by a rule the score does not pay for", True),
        ("round 2: at least 25% of labels decided by a rule the score does not pay for", False),
        ("round 2: held-out agreement at least 80% on diver_climb pairs", True),
        ("round 2: held-out agreement at least 80% on refill pairs", None),  # no refill pair held out
    ]
    assert model_targets("score", [r1, r2]) == []


@pytest.mark.slow
def test_reward_only_is_the_inner_loop(tmp_path: Path) -> None:
    """--reward-only: v0, round 1's labels and reward model with its per-rule agreement; no
    fine-tune, no evaluation games."""
    out = tmp_path / "round"
    cmd = [sys.executable, "-m", "experiments.round", "--out", str(out), *TINY, "--reward-only"]
    cmd[cmd.index("oxygen")] = "surface"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "held-out agreement per deciding rule" in p.stdout and "decided by a rule the score does not pay" in p.stdout
    assert "round-rlhf" not in p.stdout and "round-control" not in p.stdout and "evaluating" not in p.stdout
    tdir = out / "seed0" / "surface-15"
    assert (tdir / "r1" / "reward-round.pt").is_file() and not (tdir / "r1" / "rlhf").exists()
    held = json.loads((tdir / "r1" / "reward_heldout.json").read_text())["value"]
    assert "by_rule" in held and "diver_climb_z" in held
    # A reward model stopped by hand (Ctrl-C in stage 3) is not reused: it is trained again.
    import torch

    reward = tdir / "r1" / "reward-round.pt"
    ck = torch.load(reward, weights_only=True)
    torch.save({**ck, "finished": False, "stopped": "stopped early by hand (Ctrl-C)"}, reward)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped early by hand" in again.stdout and "reward: $" in again.stdout
    assert torch.load(reward, weights_only=True)["finished"] is True
    third = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert f"reward model: {reward}, reused" in third.stdout and "$ " not in third.stdout


def test_ft_args_and_the_death_penalty_name_the_round_and_reach_the_rlhf_arm(tmp_path: Path) -> None:
    """--ft-args are 01_a2c.py's flags for the rlhf (and oracle) arm, checked by its parser; they
    and --death-penalty name the round's directory, so that no two settings share labels or arms."""
    from experiments.round import round_name
    from experiments.stages import ft_config
    from lib.a2c.config import A2CConfig

    papers = "--terminal none --reward-scale 0.05 --reward-norm labels --kl 0.1"
    args = _round_args(tmp_path, "--death-penalty", "100", "--ft-args", papers)
    assert _readable(round_name(args)) == "score-15-death100-ftterminalnonerewardscale0.05rewardnormlabelskl0.1"
    cfg = ft_config(args, name="arm", model="p.pt", reward="r.pt", finetune=True)
    assert (cfg.terminal, cfg.reward_scale, cfg.reward_norm, cfg.kl) == ("none", 0.05, "labels", 0.1)
    assert cfg.finetune and cfg.reward == "r.pt" and cfg.name == "arm"
    plain = ft_config(_round_args(tmp_path), name="arm", model="p.pt", reward="r.pt")
    assert plain == A2CConfig(name="arm", model="p.pt", reward="r.pt")


def test_the_score_teacher_counts_deaths_by_default_and_its_directory_says_so(tmp_path: Path) -> None:
    """--death-penalty unset: the teacher's default (DEFAULT_DEATH_PENALTY for score, 0 for the
    others), resolved by check() before anything names a directory; --death-penalty 0 is today's."""
    from experiments.round import check, round_name
    from lib.models.teachers import DEFAULT_DEATH_PENALTY

    cases = [((), f"score-15-death{DEFAULT_DEATH_PENALTY:g}"), (("--death-penalty", "0"), "score-15")]
    cases += [(("--teacher", "surface"), "surface-15"), (("--teacher", "oxygen", "--death-penalty", "0"), "oxygen-15")]
    for extra, name in cases:
        args = _round_args(tmp_path, *extra)
        check(args)
        assert round_name(args) == name, extra


def _reused_or_refused(cases: list, save: Path, args, needle: str) -> None:
    """Each (what the arm's last.pt in ``save`` records, the arm, reused?): a reused arm is done
    (nothing runs); a refused one is one line that names ``needle`` and the way out."""
    from experiments.stages import train_a2c
    from lib.core.errors import UserError
    from lib.store.checkpoints import atomic_torch_save

    for recorded, arm, reused in cases:
        atomic_torch_save({"progress": {"step": 100}, **recorded}, save / "last.pt")
        if reused:
            train_a2c(arm, 1, args)  # done: nothing runs
        else:
            with pytest.raises(UserError, match="remove the directory") as e:
                train_a2c(arm, 1, args)
            assert "\n" not in str(e.value) and needle in str(e.value), recorded


def test_an_arm_is_reused_only_with_the_kl_it_asks_for(tmp_path: Path) -> None:
    """A finished arm's last.pt records its --kl; a round that asks for another B (the default for
    a learned reward, 1, against a run from before it, which records none) says so in one line
    instead of reusing it."""
    from lib.a2c.config import KL_LEARNED_REWARD, A2CConfig

    args = _round_args(tmp_path)
    save = tmp_path / "arm"
    save.mkdir()
    rlhf = A2CConfig(name="arm", save=str(save), max_steps=100, model="v0.pt", reward="r.pt")
    control = A2CConfig(name="arm", save=str(save), max_steps=100, model="v0.pt")
    cases = [
        ({"kl": KL_LEARNED_REWARD}, rlhf, True),
        ({"kl": 0.0}, rlhf, False),  # run with --kl 0: not the default arm
        ({}, rlhf, False),  # from before the default: it ran without the pull
        ({}, dataclasses.replace(rlhf, kl=KL_LEARNED_REWARD), True),  # --ft-args "--kl 1" named its directory
        ({}, control, True),
        ({"kl": 0.0}, dataclasses.replace(rlhf, kl=0.0), True),
    ]
    _reused_or_refused(cases, save, args, "--kl")


def test_an_arm_is_reused_only_for_the_steps_it_was_made_for(tmp_path: Path) -> None:
    """A run's last.pt records the length of its schedule; a round that asks for other steps (a
    --v0-steps or --ft-steps left at its default after a run with another) says so in one line
    instead of extending the run or passing a longer one off as done."""
    from lib.a2c.config import A2CConfig

    args = _round_args(tmp_path)
    save = tmp_path / "v0"
    save.mkdir()
    cfg = A2CConfig(name="v0", save=str(save), max_steps=100)
    cases = [
        ({"lr_decay_steps": 100}, cfg, True),
        ({}, cfg, True),  # from before the record: the directory's steps are not known
        ({"lr_decay_steps": 50}, cfg, False),  # made for 50: not extended to 100
        ({"lr_decay_steps": 200}, cfg, False),  # made for 200, stopped at 100: not reused as done
        ({"lr_decay_steps": 200}, dataclasses.replace(cfg, lr_decay_steps=200), True),
    ]
    _reused_or_refused(cases, save, args, "--v0-steps")


@pytest.mark.parametrize(
    "extra, msg",
    [
        (("--ft-args", "--terminal sometimes"), "not flags 01_a2c.py takes"),
        (("--ft-args", "--max-steps 5"), "--ft-args may not set --max-steps"),
        (("--ft-args", "-r other.pt"), "--ft-args may not set -r"),
        (("--death-penalty", "-1"), "--death-penalty must be"),
        (("--death-penalty", "50", "--teacher", "surface"), "--death-penalty is the score teacher's"),
        (("--oracle-arm", "--reward-only"), "--oracle-arm is an arm of the staged rounds"),
        (("--branch-pairs", "10"), "--branch-pairs are labelled by the round's teacher, which must pay the climb"),
        (("--branch-pairs", "-1", "--teacher", "surface"), "--branch-pairs must be in 0..100000"),
        (("--branch-pairs", "5", "--teacher", "surface", "--branch-steps", "1"), "--branch-steps must be in 2..1000"),
        (("--branch-pairs", "5", "--teacher", "surface", "--live", "--rounds", "2"), "not of --live"),
    ],
)
def test_ft_args_mistakes_are_one_line(tmp_path: Path, extra, msg) -> None:
    from experiments.round import check
    from lib.core.errors import UserError

    with pytest.raises(UserError, match=msg) as e:
        check(_round_args(tmp_path, *extra))
    assert "\n" not in str(e.value)


def test_previous_model_agreement_with_the_new_labels(tmp_path: Path) -> None:
    """label_agreement: the share of a DB's 1/2 labels whose order the model's predicted returns
    agree with (ties and can't-tell left out), worked out here from the model's own predictions."""
    import torch

    from bench.dbs import make_square_db
    from experiments.readouts import label_agreement
    from lib.models.reward import RewardModel, load_reward_model, reward_checkpoint, save_reward_checkpoint
    from lib.store.segments import read_segment

    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=8, steps=5, seed=0)
    torch.manual_seed(0)
    path = tmp_path / "r.pt"
    ck = reward_checkpoint([RewardModel(18, (48, 48, 3)).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    save_reward_checkpoint(ck, path)
    rm = load_reward_model(path)
    ret = {r: float(rm.predict_clip(read_segment(db, r)).sum()) for r in rels}
    pairs = [(rels[i], rels[i + 1]) for i in range(0, 8, 2)] + [(rels[0], rels[3])]
    # labels that agree with the model on the first three pairs, disagree on the last two, plus a tie
    labels = []
    for n, (a, b) in enumerate(pairs):
        right = FIRST_BETTER if ret[a] > ret[b] else SECOND_BETTER
        labels.append(Label(a, b, right if n < 3 else 3 - right))
    labels.append(Label(rels[1], rels[2], EQUAL))
    append_labels(db, labels)
    got = label_agreement(path, db, "cpu")
    assert got == {"agreement": pytest.approx(3 / 5), "pairs": 5}


@pytest.mark.parametrize(
    "extra, msg",
    [
        # argparse's prefixes and attached short options name the flags the round sets per arm
        (("--ft-args", "--sav /tmp/elsewhere"), "--ft-args may not set --save"),
        (("--ft-args", "--max-s 10"), "--ft-args may not set --max-steps"),
        (("--ft-args", "--db-p x"), "--ft-args may not set --db-path"),
        (("--ft-args", "--reward-oracle"), "--reward-oracle moved to the lab: python -m experiments.lab_a2c"),
        (("--ft-args", "-m/x.pt"), "--ft-args may not set -m / --model"),
        (("--ft-args", "-r/x.pt"), "--ft-args may not set -r / --reward"),
        (("--ft-args", "--see=3"), "--ft-args may not set --seed"),
        # 01_a2c.py's own checks, on the arms the round will run
        (("--ft-args", "--kl -1"), "--kl must be in [0, 1,000,000), got -1"),
        (("--ft-args", "--lr 5"), "--lr must be a number in (0, 1), got 5"),
        (("--ft-args", "--reward-penalty 1"), "--reward-penalty was retired after commit"),
        (("--ft-args", "--terminal game"), "--terminal game was retired after commit"),
        # the same for --reward-args with 03_reward_train.py's parser and checks
        (("--reward-args", "--se 3"), "--reward-args may not set --seed"),
        (("--reward-args", "-o/elsewhere"), "--reward-args may not set -o / --out"),
        (("--reward-args", "--ev m.pt"), "--reward-args may not set --evaluate"),
        (("--reward-args", "--fol"), "--reward-args may not set --follow"),
        (("--reward-args", "--lr 1e3"), "--lr must be positive and at most"),
        (("--reward-args", "--ensemble 0"), "--ensemble must be at least 1"),
        (("--reward-args", "--arch book --diff-flow"), "--diff-flow applies to --arch diff only"),
        (("--reward-args", "--diff-signed"), "--diff-signed was retired after commit"),
        (("--reward-args", "--arch book --input half"), "--input half was retired after commit"),
        (("--reward-args", "--epochs x"), "not flags 03_reward_train.py takes"),
        (("--reward-args", "other/db"), "--reward-args may not name DBs (other/db)"),
    ],
)
def test_pass_through_flags_are_parsed_and_checked_by_their_stage_before_anything_runs(
    tmp_path: Path, capsys, extra, msg
) -> None:
    """--ft-args and --reward-args are parsed by 01_a2c.py's and 03_reward_train.py's own parsers (was:
    matched as whole words, so --sav, --max-s or -m/x passed) and checked by their own checks: one
    line, exit 2, before any stage runs (was: an arm that failed after v0, labels and a reward model)."""
    code, err = _round_cli(tmp_path, capsys, *extra)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err


def test_pass_through_prefixes_the_stage_takes_are_taken(tmp_path: Path) -> None:
    """A prefix the stage's parser reads as one of its flags is that flag: --ens 3 is an ensemble
    (disagree needs one); --reco 0.5 is --record-prob."""
    from experiments.round import check, ensemble_of
    from experiments.stages import ft_config

    args = _round_args(tmp_path, "--sampling", "disagree", "--reward-args", "--ens 3", "--ft-args", "--reco 0.5")
    check(args)
    assert ensemble_of(args) == 3
    assert ft_config(args, name="arm", model="p.pt", reward="r.pt", record_prob=0.001).record_prob == 0.5


def test_a_flag_given_in_ft_args_is_used_even_at_01_a2cs_default(tmp_path: Path) -> None:
    """--ft-args "--record-prob 0.00025" (01_a2c.py's default) records at 0.00025, not at the round's
    0.001 (was: a value equal to the stage's default was dropped, and the round's own stood)."""
    from experiments.flags import a2c_argv
    from experiments.stages import ft_config
    from lib.a2c.cli import parse_config
    from lib.a2c.config import A2CConfig

    default = A2CConfig.__dataclass_fields__["record_prob"].default
    args = _round_args(tmp_path, "--ft-args", f"--record-prob {default}")
    cfg = ft_config(args, name="arm", model="p.pt", reward="r.pt", db_path="db", record_prob=args.record_prob)
    assert args.record_prob != default and cfg.record_prob == default
    assert parse_config(a2c_argv(cfg)).record_prob == default  # what the arm's process is told


def test_different_pass_through_settings_never_share_a_round_directory(tmp_path: Path) -> None:
    """The readable part of a round's name leaves out "-" (1e-3 and 1e3 read alike) and rounds
    floats; a short hash of the parsed settings is added whenever it could be shared, so two
    different settings never share a directory (was: the second round reused the first's arms)."""
    from experiments.round import round_name

    def name(*extra: str) -> str:
        return round_name(_round_args(tmp_path, *extra))

    pairs = [
        (("--ft-args", "--clip-grad 1e-3"), ("--ft-args", "--clip-grad 1e3")),
        (("--ft-args", "--reward-scale 1e-1"), ("--ft-args", "--reward-scale 1e1")),
        (("--reward-args", "--lr 1e-3"), ("--reward-args", "--lr 1e3")),
        (("--ft-args", "--kl -1"), ("--ft-args", "--kl 1")),
        (("--teacher-noise", "0.1000001"), ("--teacher-noise", "0.1")),
    ]
    for one, other in pairs:
        assert name(*one) != name(*other), (one, other)
    # the readable part stays first; the same settings spelled otherwise hash alike
    assert name("--ft-args", "--kl 1").startswith("score-15-ftkl1-")
    assert name("--ft-args", "--kl 1").split("-")[-1] == name("--ft-args", "--kl=1.0").split("-")[-1]
    assert name() == "score-15" and name("--sampling", "random") == "score-15-random"  # nothing left out


def test_an_old_round_directory_is_still_found(tmp_path: Path) -> None:
    """A round made before the hash (its directory named by the readable part alone) is still the
    round's directory when it records the same settings or none; from then on it records them, so
    a round with other settings that read alike gets its own directory."""
    from experiments.round import round_dir, round_name, seed_args

    kl1 = seed_args(_round_args(tmp_path, "--ft-args", "--kl 1"), 0)
    old = kl1.out / "score-15-ftkl1"
    old.mkdir(parents=True)
    assert round_dir(kl1) == old  # found, and claimed for these settings
    assert round_dir(kl1) == old
    other = seed_args(_round_args(tmp_path, "--ft-args", "--kl=1.0 --clip-grad 0.5"), 0)
    assert round_name(other) != round_name(kl1)
    renamed = seed_args(_round_args(tmp_path, "--ft-args", "--kl -1"), 0)  # reads as "ftkl1" too
    assert round_dir(renamed) == renamed.out / round_name(renamed) != old
    fresh = seed_args(_round_args(tmp_path / "b", "--ft-args", "--kl 1"), 0)
    assert round_dir(fresh) == fresh.out / round_name(fresh)  # no old directory: the new name


@pytest.mark.parametrize(
    "recorded, needle",
    [
        ({"kl": 10**400}, "field 'kl' must be a finite number"),
        ({"kl": "1"}, "field 'kl' must be a finite number"),
        ({"kl": float("nan")}, "field 'kl' must be a finite number"),
        ({"lr_decay_steps": -5}, "field 'lr_decay_steps' must be an integer"),
        ({"lr_decay_steps": "100"}, "field 'lr_decay_steps' must be an integer"),
        ({"lr_decay_steps": 10**400}, "field 'lr_decay_steps' must be an integer"),
        ({"progress": {"step": "x"}}, "field 'progress.step' must be an integer"),
        ({"progress": {"step": float("inf")}}, "field 'progress.step' must be an integer"),
        ({"progress": {"step": [1, 2]}}, "field 'progress.step' must be an integer"),
        ({"progress": {"step": True}}, "field 'progress.step' must be an integer"),
        ({"progress": {"step": -3}}, "field 'progress.step' must be an integer"),
        ({"progress": "x"}, "field 'progress' is not a dict"),
    ],
)
def test_odd_last_pt_values_are_one_line_naming_the_file(tmp_path: Path, recorded, needle) -> None:
    """What a round reads of an arm's last.pt (its --kl, its schedule's length, its steps done) is
    refused in one line naming the file when it is not a number it can use (was: OverflowError,
    ValueError or AttributeError tracebacks, "made for -5 agent steps", "--kl nan")."""
    from experiments.stages import a2c_progress, checked_progress
    from lib.a2c.config import KL_LEARNED_REWARD, A2CConfig
    from lib.core.errors import UserError
    from lib.store.checkpoints import atomic_torch_save

    save = tmp_path / "arm"
    save.mkdir()
    ck = {"progress": {"step": 100}, "kl": KL_LEARNED_REWARD, "lr_decay_steps": 100, **recorded}
    atomic_torch_save(ck, save / "last.pt")
    arm = A2CConfig(name="arm", save=str(save), max_steps=100, model="v0.pt", reward="r.pt")
    reads = [checked_progress] if "progress" not in recorded else [checked_progress, lambda _: a2c_progress(save)]
    for read in reads:
        with pytest.raises(UserError) as e:
            read(arm)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{save / 'last.pt'}: ") and needle in msg, msg
        assert "remove the directory" in msg and "--kl nan" not in msg and "-5 agent" not in msg and len(msg) < 400, msg


def test_every_teacher_has_its_round_report_targets() -> None:
    """The round report knows each teacher's targets (lib.models.teachers knows nothing of the report): a
    teacher added without them would report no target at all."""
    from experiments.round_report import REPORTS, targets
    from lib.models.teachers import TEACHERS

    assert set(REPORTS) == set(TEACHERS)
    rows = {
        "rlhf": {"score": 90.0, "refills": 1.5, "oxygen_share": 0.1},
        "control": {"score": 100.0, "oxygen_share": 0.4},
    }
    assert [ok for _, ok in targets("score", [rows])] == [True]
    assert [name for name, _ in targets("surface", [rows])][0] == "rlhf refills at least once per game"
