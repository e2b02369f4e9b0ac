"""experiments/live.py: the live round's budget and report, its process handling, and the
experiment's one-line mistakes. The whole loop with real processes is
``test_demo_live_runs_and_stops_cleanly`` (slow)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _round_args(out: Path, *extra: str):
    from experiments.round import build_parser

    return build_parser().parse_args(["--out", str(out), "--teacher", "score", "--labels", "100", *extra])


def test_live_plan_is_the_staged_budget() -> None:
    """Three rounds of 100 labels and 500k steps: one 1.5M-step fine-tune and 200 labels after
    round 1's, 0.133 per 1,000 agent steps."""
    from experiments.live import live_plan

    plan = live_plan(_round_args(Path("x"), "--rounds", "3"))
    assert plan["steps"] == 1_500_000 and plan["labels"] == 200
    assert plan["rate"] == pytest.approx(200 / 1500) and plan["retrain_every"] == 25
    assert live_plan(_round_args(Path("x"), "--rounds", "2", "--scale", "0.01"))["steps"] == 10_000


@pytest.mark.parametrize(
    "extra, msg",
    [
        (("--live",), "--rounds 2 or more"),
        (("--live", "--rounds", "3", "--reward-only"), "exclude each other"),
        (("--live", "--rounds", "3", "--sampling", "uncertain"), "--sampling random, rare"),
        (("--live", "--rounds", "3", "--from", "v0"), "--from does not apply"),
    ],
)
def test_live_round_mistakes_are_one_line(tmp_path: Path, extra, msg) -> None:
    from experiments.round import check
    from lib.core.errors import UserError

    with pytest.raises(UserError, match=msg):
        check(_round_args(tmp_path, *extra))
    check(_round_args(tmp_path, "--live", "--rounds", "3"))  # the benchmark's own setting passes


def test_versions_file_is_read_past_a_torn_line(tmp_path: Path) -> None:
    from experiments.live import read_versions, versions_table

    path = tmp_path / "reward-x-versions.jsonl"
    lines = [
        {"version": 1, "labels": 30, "heldout_pairs": 6, "heldout_accuracy": 0.5, "installed": True},
        {"version": 2, "labels": 40, "heldout_pairs": 8, "heldout_accuracy": 0.25, "installed": False, "why": "worse"}
        | {"compared_pairs": 8, "candidate_accuracy": 0.25, "installed_heldout_accuracy": 0.75}
        | {"fresh_pairs": 3, "fresh_accuracy": 2 / 3},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"version": 3, "lab')
    got = read_versions(path)
    assert [v["version"] for v in got] == [1, 2]
    text = versions_table(got)
    assert "| v1 | 30 | 6 | 50% | n/a | n/a |" in text
    assert "| v2 | 40 | 8 | 25% | 25% / 75% (8) | 67% (3) | n/a | no: worse |" in text
    assert read_versions(tmp_path / "none.jsonl") == []


def test_table_puts_the_live_row_beside_the_staged_rounds() -> None:
    from experiments.round_report import table

    row = {"score": 500.0, "score_ci": 20.0, "length": 900.0}
    staged = [{"v0": dict(row), "control": dict(row), "rlhf": dict(row)} for _ in range(3)]
    text = table([*staged, {"live": dict(row, score=640.0)}], arms=("v0", "control", "rlhf", "live"), names=None)
    assert "| 4 | live | 640 ± 20 |" in text
    text = table([*staged, {"live": dict(row, score=640.0)}], ("v0", "control", "rlhf", "live"), ["1", "2", "3", "1-3"])
    lines = text.splitlines()
    assert lines[-1].startswith("| 1-3 | live | 640 ± 20 |") and sum("| v0 |" in x for x in lines) == 1
    assert len(lines) == 2 + 1 + 3 * 2 + 1  # head, v0 once, control and rlhf per round, live


def test_score_stretches_cover_every_game_once() -> None:
    from experiments.live import score_stretches

    xs, ys = list(range(0, 1100, 100)), [float(i) for i in range(11)]
    got = score_stretches(xs, ys, n=5)
    assert sum(n for *_, n in got) == 11 and got[0][:2] == (0, 200) and got[-1][1] == 1000
    assert got[0][2] == pytest.approx(1.0)
    assert score_stretches([], []) == []


def test_stop_sends_ctrl_c_first_and_harder_only_when_ignored(tmp_path: Path) -> None:
    """A child that handles SIGINT ends on it (its exit code says so); one that ignores it is
    stopped with SIGTERM after the grace period."""
    from experiments.stages import spawn, stop

    polite = tmp_path / "polite.py"
    polite.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    for script, want in ((polite, 7), (stubborn, -signal.SIGTERM)):
        p = spawn(script.stem, [sys.executable, script], tmp_path / f"{script.stem}.log")
        deadline = time.time() + 20
        while "ready" not in p.logfile.read_text() and time.time() < deadline:
            time.sleep(0.05)
        t = time.time()
        assert stop(p, grace=1.0) == want
        assert time.time() - t < 15


def test_wait_for_names_a_process_that_died(tmp_path: Path) -> None:
    from experiments.stages import spawn, wait_for
    from lib.core.errors import UserError

    p = spawn("dies", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "dies.log")
    with pytest.raises(UserError, match=r"dies ended \(exit 3\)[\s\S]*boom"):
        wait_for("never", lambda: False, [p], timeout=30, poll=0.1)


TINY = ["--v0-steps", "2000", "--ft-steps", "2000", "--labels", "15", "--eval-games", "1", "--record-prob", "0.1"]
TINY += ["--evals", "1", "--test-episodes", "1", "--teacher", "oxygen", "--rounds", "2"]


def _no_temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith((".tmp", ".partial.pt"))]


@pytest.mark.slow
def test_live_round_runs_the_three_processes_and_continues(tmp_path: Path) -> None:
    """experiments.round --live on a tiny budget: round 1's labels and model, then the agent with
    --reward-reload, the following oracle and the following trainer side by side; the teacher
    labels the agent's own clips, the trainer makes versions, the agent logs which it used; all
    three stopped cleanly; run again, nothing trains twice."""
    import subprocess

    from experiments.stages import tb_scalars
    from lib.store.labels import read_label_log

    out = tmp_path / "round"
    cmd = [sys.executable, "-m", "experiments.round", "--out", str(out), *TINY, "--live"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "\n| 0 | v0 | " in p.stdout and "\n| 1-2 | live | " in p.stdout
    ldir = out / "seed0" / "oxygen-15" / "live"
    report = json.loads((ldir.parent / "live.json").read_text())
    assert report["plan"] == {"steps": 4000, "labels": 15, "rate": 3.75, "retrain_every": 2}
    labels = read_label_log(ldir / "rlhf-db")
    assert 0 < len(labels) <= 15 and all(lab.extra["teacher"] == "oxygen" for lab in labels)
    assert report["labels"] == len({lab.key for lab in labels})
    versions = report["versions"]
    assert versions and [v["version"] for v in versions] == list(range(1, len(versions) + 1))
    assert all((ldir / f"reward-live-v{v['version']}.pt").exists() for v in versions)
    steps, used = tb_scalars(out / "seed0" / "tb", "round-live-oxygen-15", "reward_model/version")
    assert steps and used[0] == 0  # round 1's model names no version: v0, then the trainer's v1, v2, ...
    logs = out / "seed0" / "logs"
    assert "stopped by SIGINT" in (logs / "oracle-oxygen-15-live.log").read_text()
    assert "stopped by SIGINT" in (logs / "trainer-oxygen-15-live.log").read_text()
    assert not _no_temp_files(out)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0 and "$ " not in again.stdout, again.stdout[-2000:]
    assert json.loads((ldir.parent / "live.json").read_text())["row"] == report["row"]


@pytest.mark.slow
def test_demo_live_runs_and_stops_cleanly(tmp_path: Path) -> None:
    """make demo-live for two minutes: both phases run, the reloading A2C logs the versions it
    used, both DBs get labels, the plot is written, and every process ends on its Ctrl-C path."""
    import subprocess

    cmd = [sys.executable, "-m", "experiments.live", "--minutes", "2", "--dir", str(tmp_path), "--envs", "2"]
    cmd += ["--label-rate", "20", "--retrain-every", "3"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "phase 2 after" in p.stdout and "versions made: " in p.stdout
    made = int(p.stdout.split("versions made: ")[1].split()[0])
    assert made >= 1 and (tmp_path / "saves/demo-live-reward/reward-demo-live-v1.pt").exists()
    stopped = p.stdout.split("stopped: ")[1].splitlines()[0]
    assert stopped.count("exit") == 6 and all(c in ("0", "130") for c in re.findall(r"exit (-?\d+)", stopped))
    assert "reloading A2C, learned reward: steps" in p.stdout
    png = (tmp_path / "saves/demo-live-rl/score_over_time.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    for db in ("db/demo-live", "db/demo-live-rl"):
        assert (tmp_path / db / "labels.jsonl").read_text().count("\n") >= 1, db
    assert not _no_temp_files(tmp_path)


# --- audit 5 item 2: SIGTERM and SIGHUP take the Ctrl-C path -------------------------------------


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (children in their own sessions too), from /proc."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_text(path: Path, text: str, proc, timeout: float) -> None:
    end = time.time() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert proc.poll() is None and time.time() < end, f"no {text!r} in {path}"
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_to_demo_live_stops_every_child_on_its_ctrl_c_path(tmp_path: Path) -> None:
    """SIGTERM to ``python -m experiments.live`` once the recording A2C, the following oracle and the
    following trainer all run: each is stopped on its own Ctrl-C path (exit 0 or 130), none is left
    running, and the module exits 130 with one line saying how it was stopped."""
    import subprocess

    cmd = [sys.executable, "-m", "experiments.live", "--minutes", "5", "--dir", str(tmp_path), "--envs", "1"]
    cmd += ["--label-rate", "20", "--retrain-every", "3"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = tmp_path / "saves" / "demo-live-logs"
    try:
        _wait_text(logs / "trainer.log", "following 1 DB(s)", p, 300)
        _wait_text(logs / "oracle.log", "following ", p, 120)
        kids = _descendants(p.pid)
        assert len(kids) >= 3, kids
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = [k for k in kids if _alive(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert not left, f"still running after SIGTERM: {left}"
    assert p.returncode == 130, (out[-2000:], err[-2000:])
    codes = re.findall(r"(a2c-record|oracle|trainer): stopped \(exit (-?\d+)\)", out)
    assert sorted(n for n, _ in codes) == ["a2c-record", "oracle", "trainer"], out[-2000:]
    assert all(c in ("0", "130") for _, c in codes), codes
    assert err.strip().splitlines()[-1] == "interrupted (SIGTERM): every process was stopped with Ctrl-C"
    assert "Traceback" not in err


@pytest.mark.slow
def test_sighup_to_a_round_stops_its_running_stage_on_its_ctrl_c_path(tmp_path: Path) -> None:
    """SIGHUP (a closed terminal) to ``python -m experiments.round`` while its v0 A2C trains: the A2C
    is stopped on its Ctrl-C path (its checkpoint written), none is left running, exit 130."""
    import subprocess

    out = tmp_path / "round"
    # v0 long enough that it is still training when the signal comes (TINY's 2,000 steps can end
    # between its first progress line and the signal on a free machine)
    cmd = [sys.executable, "-m", "experiments.round", "--out", str(out), *TINY, "--v0-steps", "10000000"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_text(out / "seed0" / "logs" / "round-v0.log", " steps/s", p, 300)  # its loop runs
        kids = _descendants(p.pid)
        assert kids
        p.send_signal(signal.SIGHUP)
        stdout, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = [k for k in kids if _alive(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert not left, f"still running after SIGHUP: {left}"
    assert p.returncode == 130, (stdout[-2000:], err[-2000:])
    assert "interrupted at step" in (out / "seed0" / "logs" / "round-v0.log").read_text()
    assert "Traceback" not in err and "every finished stage is kept" in err


def test_a_live_arm_made_for_other_steps_is_refused_as_the_staged_arms_are(tmp_path: Path) -> None:
    """--live goes through the staged arms' check of last.pt (``stages.checked_progress``) before
    anything runs: a 600-step live arm is not resumed to 2,000 steps on its 600-step schedule (lr 0
    from step 600 on), a 4,000-step one not reused as a 2,000-step one (was: no check on this path)."""
    from experiments.live import run_live
    from experiments.round import check, round_name, seed_args
    from experiments.stages import SeedRun
    from lib.a2c.config import KL_LEARNED_REWARD
    from lib.core.errors import UserError
    from lib.store.checkpoints import atomic_torch_save

    given = _round_args(tmp_path, "--live", "--rounds", "2", "--ft-steps", "1000", "--labels", "10")
    check(given)
    args = seed_args(given, 0)
    tdir = args.out / round_name(args)
    save = tdir / "live" / "rlhf"
    save.mkdir(parents=True)
    sr = SeedRun(args, tdir, args.out / "db", {"train": [], "holdout": []}, tmp_path / "v0.pt")
    for made_for, done in ((600, 600), (4000, 4000), (4000, 2000)):
        ck = {"progress": {"step": done}, "lr_decay_steps": made_for, "kl": KL_LEARNED_REWARD}
        atomic_torch_save(ck, save / "last.pt")
        with pytest.raises(UserError, match=f"made for {made_for:,} agent steps; this one asks for 2,000") as e:
            run_live(sr)
        assert "\n" not in str(e.value)
    assert not (tdir / "r1").exists()  # refused before round 1's labels and model
