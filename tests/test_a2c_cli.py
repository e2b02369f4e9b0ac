"""01_a2c.py as a user runs it: a tiny real training run, Ctrl-C, --resume, and bad input."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lib.models.policy import AtariA2C, load_policy, policy_checkpoint
from lib.store.checkpoints import atomic_torch_save
from lib.store.segments import list_segments, load_segment

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "01_a2c.py")


def a2c(tmp_path, *args, **kw):
    cmd = [
        sys.executable,
        SCRIPT,
        "--save",
        str(tmp_path / "saves"),
        "--runs-dir",
        str(tmp_path / "runs"),
        *args,
    ]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=kw.get("timeout", 300))


@pytest.mark.slow
def test_tiny_run_records_evaluates_and_saves(tmp_path):
    db = tmp_path / "db"
    r = a2c(
        tmp_path,
        "-n",
        "tiny",
        "--envs",
        "4",
        "--max-steps",
        "600",
        "--db-path",
        str(db),
        "--record-prob",
        "0.05",
        "--segment-steps",
        "10",
        "--test-every",
        "300",
        "--test-episodes",
        "2",
    )
    assert r.returncode == 0, r.stderr
    assert "finished at step 600" in r.stdout
    saves = sorted(p.name for p in (tmp_path / "saves").iterdir())
    assert "last.pt" in saves and any(s.startswith("best_000000300_score") for s in saves), saves
    segs = list_segments(db)
    assert len(segs) >= 5
    seg = load_segment(db / segs[0])
    assert seg.frames.shape == (10, 210, 160, 3) and seg.rewards is not None
    assert seg.env_id == "SeaquestNoFrameskip-v4"
    # checkpoints carry what is needed to use them
    net, ck = load_policy(tmp_path / "saves" / "last.pt", game="seaquest", obs_shape=(4, 84, 84), n_actions=18)
    assert ck["step"] == 600 and ck["game"] == "seaquest" and ck["n_actions"] == 18
    # TensorBoard got real event files with the curves
    events = list((tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"eval/score_mean", "losses/policy", "losses/value", "losses/entropy"} <= tags, tags
    assert {"eval/best_life_score", "eval/best_life_length"} <= tags, tags  # the book's figure
    # SeaQuest's behaviour figures, read from the oxygen gauge of the evaluation games
    assert {"eval/refills_per_game", "eval/deaths_per_game", "eval/oxygen_death_share"} <= tags, tags
    assert "to oxygen)" in r.stdout
    assert "hyperparameters" in " ".join(acc.Tags()["tensors"])


@pytest.mark.slow
def test_interrupt_then_resume(tmp_path):
    db = tmp_path / "db"
    cmd = [
        sys.executable,
        SCRIPT,
        "-n",
        "intr",
        "--save",
        str(tmp_path / "saves"),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--envs",
        "4",
        "--db-path",
        str(db),
        "--record-prob",
        "0.05",
        "--segment-steps",
        "10",
        "--test-every",
        "0",
    ]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list_segments(db)) < 3 if db.exists() else time.time() < deadline:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "interrupted at step" in out
    assert (tmp_path / "saves" / "last.pt").exists()
    # no half segment: every file loads, no temp files are left
    segs = list_segments(db)
    for s in segs:
        load_segment(db / s)
    assert not [f for f in db.rglob(".tmp*")]
    step = torch.load(tmp_path / "saves" / "last.pt", weights_only=True)["step"]
    assert step > 0

    r = a2c(
        tmp_path,
        "-n",
        "intr",
        "--resume",
        "--envs",
        "4",
        "--db-path",
        str(db),
        "--record-prob",
        "0.05",
        "--segment-steps",
        "10",
        "--test-every",
        "0",
        "--max-steps",
        str(step + 200),
    )
    assert r.returncode == 0, r.stderr
    assert f"resumed at step {step:,}" in r.stdout
    assert torch.load(tmp_path / "saves" / "last.pt", weights_only=True)["step"] >= step + 200
    # the resumed run added segments and overwrote none
    after = list_segments(db)
    assert set(segs) <= set(after) and len(after) > len(segs)


def _breakout_model(path):
    net = AtariA2C((4, 84, 84), 4)
    atomic_torch_save(
        policy_checkpoint(net, "BreakoutNoFrameskip-v4", "breakout", ("NOOP", "FIRE", "RIGHT", "LEFT")), path
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["-m", "nope.pt"], "model file not found: nope.pt"),
        (["--env", "NoSuchGameNoFrameskip-v4"], "unknown --env"),
    ],
)
def test_bad_input_as_a_user_meets_it_one_line_exit_2(tmp_path, args, message):
    """Two subprocess smoke tests: the script turns a UserError into one line and exit 2 (the
    other argument checks run in-process below)."""
    cmd = [sys.executable, SCRIPT, "-n", "bad", "--max-steps", "32", "--envs", "2", *args]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no saves/, runs/ or db/ appeared


def test_help_explains_every_flag():
    """Every option has its own help text, and --help lists each one as a whole word (``--env`` is
    not found inside ``--envs``); a retired flag is left out of --help."""
    import argparse
    import re

    from lib.a2c.cli import build_parser

    parser = build_parser()
    text = parser.format_help()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:  # a retired flag (lib.core.settings.retire)
            continue
        for flag in action.option_strings:
            assert action.help and len(action.help) > 10, flag
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), flag
    flags = {f for a in parser._actions for f in a.option_strings}
    assert {"--dev", "--env", "--envs", "--db-path", "--force", "--resume", "--reward", "--finetune"} <= flags


@pytest.mark.parametrize(
    "case, args, message",
    [
        ("missing model", ["-m", "nope.pt"], "model file not found: nope.pt"),
        ("corrupt model", ["-m", "corrupt.pt"], "corrupt or not a PyTorch checkpoint"),
        ("other game", ["-m", "breakout.pt"], "was trained on BreakoutNoFrameskip-v4"),
        ("unknown env", ["--env", "NoSuchGameNoFrameskip-v4"], "unknown --env"),
        ("unwritable save", ["--save", "afile/saves"], "is not a writable directory"),
        ("unwritable db", ["--db-path", "afile/db"], "is not a writable directory"),
        ("zero envs", ["--envs", "0"], "--envs must be at least 1"),
        ("negative prob", ["--record-prob", "-0.1"], "--record-prob must be in [0, 1]"),
        ("finetune without model", ["--finetune"], "--finetune needs a policy"),
        ("resume without last", ["--resume"], "no saves/new/last.pt to resume from"),
        ("bad name", ["-n", "a/b"], "--name must be plain"),
        (
            "run exists",
            ["-n", "taken"],
            "saves/taken already holds the run 'taken': continue it with --resume",
        ),
        ("text file as model", ["-m", "notes.txt"], "model notes.txt is corrupt or not a PyTorch checkpoint"),
        (
            "resume a copied best",
            ["-n", "copied", "--resume"],
            "saves/copied/last.pt is not a resumable checkpoint",
        ),
        ("db under /proc", ["--db-path", "/proc/forbidden/db"], "cannot create DB dir /proc/forbidden/db"),
        ("resume and force", ["--resume", "--force"], "give one of them"),
        ("infinite lr", ["--lr", "inf"], "--lr must be a number in (0, 1)"),
        ("nan lr", ["--lr", "nan"], "--lr must be a number in (0, 1)"),
        ("negative seed", ["--seed", "-1"], "--seed must be in 0.."),
        ("huge seed", ["--seed", str(2**70)], "--seed must be in 0.."),
        ("nan prob", ["--record-prob", "nan"], "--record-prob must be in [0, 1]"),
        ("long segments", ["--segment-steps", "1400"], "--segment-steps must be in 1..1000"),
        ("negative env threads", ["--env-threads", "-2"], "--env-threads must be >= 0"),
        ("runs under /proc", ["--runs-dir", "/proc/x"], "cannot create TensorBoard dir /proc/x"),
        ("too many envs to record", ["--envs", "101", "--db-path", "db"], "at most 100 envs over all ranks"),
    ],
)
def test_mistakes_are_one_line_and_touch_nothing(tmp_path, monkeypatch, case, args, message):
    """In-process (no subprocess per case): train() raises UserError, one line, before it writes
    anything: no saves/, runs/ or DB (issue 39 item 5: every check, not only -r's, comes before the
    recorder writes the DB's db.json)."""
    from lib.a2c.cli import parse_config
    from lib.a2c.train import train
    from lib.core.errors import UserError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("e\n" * 200)  # torch.load of a text file raised KeyError: 101
    (tmp_path / "corrupt.pt").write_bytes(b"\x00garbage" * 10)
    (tmp_path / "afile").write_text("a file, not a directory")
    _breakout_model(tmp_path / "breakout.pt")
    for name in ("taken", "copied"):
        (tmp_path / "saves" / name).mkdir(parents=True)
        atomic_torch_save(
            policy_checkpoint(AtariA2C((4, 84, 84), 18), "SeaquestNoFrameskip-v4", "seaquest", ("NOOP",) * 18, step=5),
            tmp_path / "saves" / name / "last.pt",
        )
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    # every check runs before the recorder makes its DB (a case's own --db-path, later, wins)
    argv = ["-n", "new", "--max-steps", "32", "--envs", "2", "--test-every", "0", "--runs-dir", "runs"]
    argv += ["--db-path", "newdb", *args]
    with pytest.raises(UserError) as e:
        train(parse_config(argv))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_force_starts_a_run_over(tmp_path):
    args = ("-n", "again", "--envs", "2", "--max-steps", "64", "--test-every", "0")
    assert a2c(tmp_path, *args).returncode == 0
    r = a2c(tmp_path, *args)
    assert r.returncode == 2 and "already holds the run" in r.stderr
    r = a2c(tmp_path, *args, "--force")
    assert r.returncode == 0, r.stderr


def test_help_groups_the_flags_and_m_takes_a_run_directory(tmp_path) -> None:
    from lib.a2c.cli import build_parser, parse_config
    from lib.models.policy import best_checkpoint_name

    groups = [g.title for g in build_parser()._action_groups]
    assert {"core", "speed"} <= set(groups) and any(t.startswith("labels") for t in groups)
    run = tmp_path / "v0"
    run.mkdir()
    for step in (10_000, 20_000):
        (run / best_checkpoint_name(step, step / 100, 500)).write_bytes(b"")
    cfg = parse_config(["-n", "x", "-m", str(run)])
    assert cfg.model == str(run / best_checkpoint_name(20_000, 200.0, 500))


def test_a_choice_set_in_code_is_checked_against_its_choices() -> None:
    """A setting with choices (``--terminal``, ``--reward-norm``) refuses another value when the
    config is made in code (experiments build an A2CConfig), not only when argparse read the flag;
    the line names the flag and its choices."""
    from lib.a2c.config import A2CConfig
    from lib.core.errors import UserError

    A2CConfig(name="x", terminal="none", reward="r.pt", reward_norm="labels").check()
    with pytest.raises(UserError, match=r"^--terminal game was retired after commit [0-9a-f]+: .*give life or none$"):
        A2CConfig(name="x", terminal="game").check()  # a retired choice: the line that says why
    with pytest.raises(UserError, match=r"^--terminal must be one of life, none, got 'lives'$"):
        A2CConfig(name="x", terminal="lives").check()
    with pytest.raises(UserError, match=r"^--reward-norm must be one of running, labels, window, got 'label'$"):
        A2CConfig(name="x", reward_norm="label").check()


def test_a_config_goes_to_the_stage_as_its_own_flags(tmp_path) -> None:
    """experiments/round.py runs 01_a2c.py from an A2CConfig: every field, set away from its
    default, comes back the same through the documented command line."""
    from dataclasses import fields

    from experiments.flags import a2c_argv
    from lib.a2c.cli import parse_config
    from lib.a2c.config import A2CConfig

    policy = tmp_path / "p.pt"
    policy.write_bytes(b"")
    every = A2CConfig(
        name="x", env="BreakoutNoFrameskip-v4", dev="cuda:1", model=str(policy), finetune=True,
        reward="r.pt", reward_reload=True, save="s", db_path="db", envs=8, max_steps=1000, seed=3,
        record_prob=0.25, segment_steps=25, test_every=500, test_episodes=2, force=True, lr=1e-3,
        lr_decay_steps=99, runs_dir="tb", precision="bf16", threads=2, env_threads=1, reward_scale=0.2,
        reward_norm="window", terminal="none", kl=0.5,
        gamma=0.9, entropy=0.02, n_steps=3, clip_grad=0.5, kl_target=0.05, norm_window=10, reward_clip="sign",
        reward_plus_score=True,
    )  # fmt: skip
    at_default = {f.name for f in fields(A2CConfig) if getattr(every, f.name) == getattr(A2CConfig, f.name, None)}
    assert at_default == {"resume", "start_states", "start_share"}  # --resume excludes --force and -m
    assert parse_config(a2c_argv(every)) == every
    starts = A2CConfig(name="x", start_states="states", start_share=0.25)  # SeaQuest's alone
    assert parse_config(a2c_argv(starts)) == starts
    assert a2c_argv(A2CConfig(name="v0")) == ["--name", "v0"]
    resume = A2CConfig(name="v0", resume=True, max_steps=64)
    assert parse_config(a2c_argv(resume)) == resume


RETIRED = [  # (what a user gives, the words the line starts with, what the last commit that had it declares)
    pytest.param(["--reward-alive", "0.1"], "--reward-alive", "reward_alive", id="reward-alive"),
    pytest.param(["--reward-penalty=1"], "--reward-penalty", "reward_penalty", id="reward-penalty"),
    pytest.param(["--terminal", "game"], "--terminal game", '("life", "game", "none")', id="terminal-game"),
    pytest.param(["--bf16"], "--bf16", "bf16: bool = setting(", id="bf16"),
    pytest.param(["--reward-deadzone", "1"], "--reward-deadzone", "reward_deadzone: float", id="reward-deadzone"),
]


@pytest.mark.parametrize("resume", [False, True], ids=["new-run", "resume"])
@pytest.mark.parametrize("given, words, declared", RETIRED)
def test_a_retired_flag_is_one_line_exit_2_naming_its_last_commit(tmp_path, given, words, declared, resume):
    """A lever the measurements closed (docs/reference.md, "Retired flags") is refused by 01_a2c.py
    itself in one line, exit 2, before anything is written: it names the last commit that had the
    flag (a real commit of this repository, whose stage 1 still declares it) and where its figures
    are; a resumed run that gives it again is told the same (test_stage_flags: --help no longer lists it)."""
    import re

    argv = ["-n", "old", "--max-steps", "32", "--envs", "2", *(["--resume"] if resume else []), *given]
    r = subprocess.run([sys.executable, SCRIPT, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.stdout, r.stderr)
    assert lines[0].startswith(f"error: {words} was retired after commit "), lines
    assert "docs/results.md" in lines[0] or "docs/benchmarks.md" in lines[0], lines  # where its figures are
    commit = re.search(r"after commit ([0-9a-f]{7,40}):", lines[0]).group(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no saves/, runs/ or db/ appeared
    shown = subprocess.run(
        ["git", "show", f"{commit}:lib/a2c_config.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if shown.returncode != 0 and not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the commit cannot be looked up")
    assert shown.returncode == 0 and declared in shown.stdout, shown.stderr


def test_a_wrong_choice_is_not_offered_the_retired_one(capsys) -> None:
    """argparse's "invalid choice" line lists the choices kept, not the retired ``game``."""
    from lib.a2c.cli import parse_config

    with pytest.raises(SystemExit) as e:
        parse_config(["-n", "x", "--terminal", "gam"])
    assert e.value.code == 2
    assert "invalid choice: 'gam' (choose from 'life', 'none')" in capsys.readouterr().err


R, WINDOW, DB = ["-r", "r.pt"], ["--reward-norm", "window"], ["--db-path", "db"]


@pytest.mark.parametrize(
    "given, message, with_what_it_needs",
    [
        (["--norm-window", "30"], "--norm-window is --reward-norm window's: give -r with --reward-norm window",
         [*R, *WINDOW]),
        ([*R, "--norm-window", "30"], "--norm-window is --reward-norm window's: --reward-norm running has none",
         WINDOW),
        ([*R, "--reward-norm", "labels", "--norm-window", "30"],
         "--norm-window is --reward-norm window's: --reward-norm labels has none", WINDOW),
        (["--reward-scale", "0.05"], "--reward-scale scales a learned reward: give -r", R),
        (["--reward-norm", "labels"], "--reward-norm labels normalises a learned reward: give -r", R),
        (["--record-prob", "0.01"], "--record-prob is the chance to record a segment: give --db-path", DB),
        (["--segment-steps", "25"], "--segment-steps is a recorded segment's length: give --db-path", DB),
        (["--test-every", "0", "--test-episodes", "4"],
         "--test-episodes is the games of an evaluation: --test-every 0 turns evaluation off", ["--test-every", "5"]),
    ],
)  # fmt: skip
def test_a_flag_given_without_the_flag_it_needs_is_one_line(
    given: list[str], message: str, with_what_it_needs: list[str]
) -> None:
    """A flag given is a flag used: one whose setting only another flag reads (-r, --reward-norm window,
    --db-path, evaluation) is refused in one line naming that flag, not dropped (was: the run went on
    without it, exit 0); with the flag it needs (given after: the last one wins), it is taken."""
    from lib.a2c.cli import parse_config
    from lib.core.errors import UserError

    with pytest.raises(UserError) as e:
        parse_config(["-n", "x", *given])
    assert str(e.value) == message
    flag = message.split()[0]
    cfg = parse_config(["-n", "x", *given, *with_what_it_needs])
    assert cfg.given(flag.removeprefix("--").replace("-", "_"))
