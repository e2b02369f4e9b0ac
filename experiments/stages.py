"""A round's stages, as the pipeline's scripts run them, and the figures made of what they leave:
what the staged rounds (``experiments.round``) and the live round (``experiments.live``) both do.

- processes: a script started beside the others (``spawn``), stopped the way a person would
  (``stop``: SIGINT, then SIGTERM, then SIGKILL), or run to its end with its output echoed
  (``run_stage``);
- stages: A2C runs (``train_a2c``), a DB's held-out split, a teacher's labels (``label``), reward
  models (``train_reward``), a round's inner loop (``reward_round``: labels, model, figures), the
  evaluation games (``evaluate_arm``); each skipped when its output is there, kept in a cache keyed on
  what it was made from (``cached_json``);
- figures: what the teacher's labels rested on (``teacher_evidence``), TensorBoard curves
  (``tb_scalars``), the notes printed of them; what a reward model pays is ``experiments.readouts``'.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from experiments.flags import a2c_argv, given_flags
from experiments.readouts import HELD_OUT_FIGURES, held_out_figures, label_agreement
from experiments.round_report import behaviour_share
from experiments.round_settings import RoundSettings
from lib.a2c.config import FINETUNE_LEARNING_RATE, A2CConfig
from lib.core.errors import UserError
from lib.core.files import atomic_write
from lib.core.signals import critical
from lib.label_ui.oracle import OracleSettings, oracle_label_db
from lib.label_ui.sampling import MODEL_MODES, SAMPLING_MODES
from lib.models.policy import BEST_GLOB, best_checkpoint, best_checkpoint_figures
from lib.models.reward import reward_training_finished
from lib.models.teachers import RULE_FACTS, segment_facts
from lib.play.config import PlayConfig
from lib.play.play import play
from lib.store.checkpoints import read_checkpoint
from lib.store.labels import FIRST_BETTER, LABELS_FILE, SECOND_BETTER, load_labels
from lib.store.segments import DB_INFO_FILE, SegmentError, db_game, list_segments, read_segment

ROOT = Path(__file__).resolve().parents[1]
NO_MODEL_MODES = tuple(m for m in SAMPLING_MODES if m not in MODEL_MODES)  # random, rare
CURVE_TAGS = (
    "eval/score_mean",
    "eval/refills_per_game",
    "eval/oxygen_death_share",
    "eval/low_climbs_per_game",
    "eval/length_mean",
    "eval/surface_share",
    # the over-optimisation picture (Gao et al. 2022): the proxy's return and the true score of the
    # training games, and the distance from the start policy, per fine-tune
    "finetune/kl_to_start",
    "finetune/learned_return",
    "finetune/score",
)
EVAL_SEED = 20_000  # the evaluation games of every arm: apart from training and in-run eval seeds
STOP_GRACE_S = 60.0  # how long a script gets to finish its Ctrl-C path before SIGTERM


# --- processes ----------------------------------------------------------------------------------


def log(msg: str, who: str = "round") -> None:
    """A progress line, ``[round 12:34:56] msg``; ``who``: whose line it is (the processes' own
    lines, a start or a stop, say ``live``)."""
    print(f"[{who} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Proc:
    """A pipeline script running beside the others, its output in ``logfile``."""

    name: str
    popen: subprocess.Popen
    logfile: Path
    started: float = field(default_factory=time.time)

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 3) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"    {line}" for line in lines[-n:])


def spawn(name: str, cmd: list[str], logfile: Path) -> Proc:
    """Start ``cmd`` (a script of this repository) in its own session, so that a Ctrl-C in the
    terminal reaches this module only and each child is stopped in its turn."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    log(f"{name}: $ {' '.join(str(c) for c in cmd[1:])}  (log: {logfile})", "live")
    f = open(logfile, "a", encoding="utf-8")  # noqa: SIM115 (the child writes to it for its whole life)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    popen = subprocess.Popen(
        [str(c) for c in cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    f.close()  # the child holds its own descriptor
    return Proc(name, popen, logfile)


def stop(proc: Proc, grace: float = STOP_GRACE_S) -> int:
    """Stop ``proc`` the way a person would (Ctrl-C), harder only when it does not end: its exit code."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if not proc.running():
            break
        proc.popen.send_signal(sig)
        try:
            proc.popen.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            log(f"{proc.name}: still running {wait:.0f} s after {sig.name}", "live")
    rc = proc.popen.wait()
    log(f"{proc.name}: stopped (exit {rc})", "live")
    return rc


def stop_piped(name: str, popen: subprocess.Popen, echo: Callable[[str], None]) -> int:
    """Stop a child whose output this process reads line by line (``experiments.round``'s stages, in
    their own sessions) as ``stop`` does, then ``echo`` the lines it wrote meanwhile: its exit code.
    A stop signal meanwhile waits until it is stopped (``lib.core.signals.critical``)."""
    with critical():
        rc = stop(Proc(name, popen, Path(os.devnull)))
        if popen.stdout is not None:
            for line in popen.stdout:
                echo(line)
    return rc


def stop_all(procs: list[Proc]) -> dict[str, int]:
    """Stop every running process, newest first (the agent before the trainer it reads from). A stop
    signal meanwhile waits until all are stopped (``lib.core.signals.critical``): none is left running."""
    with critical():
        return {p.name: stop(p) for p in reversed(procs)}


def wait_for(what: str, done: Callable[[], bool], procs: list[Proc], timeout: float, poll: float = 2.0) -> None:
    """Wait until ``done()``; a process that dies meanwhile, or the timeout, is an error."""
    end = time.time() + timeout
    while not done():
        for p in procs:
            if not p.running():
                raise UserError(f"{p.name} ended (exit {p.popen.returncode}) while waiting for {what}:\n{p.tail()}")
        if time.time() > end:
            raise UserError(f"no {what} after {timeout:.0f} s; the logs are in {procs[0].logfile.parent}")
        time.sleep(poll)


# --- stages -------------------------------------------------------------------------------------


def run_stage(name: str, cmd: list[str], logfile: Path) -> None:
    """Run a pipeline script, its output appended to ``logfile`` and echoed with a prefix."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    log(f"{name}: $ {' '.join(cmd[1:])}  (log: {logfile})")
    with open(logfile, "a", encoding="utf-8") as f:

        def echo(line: str) -> None:
            f.write(line)
            f.flush()
            print(f"  [{name}] {line}", end="", flush=True)

        # its own session: Ctrl-C, SIGTERM and SIGHUP reach this module only (cli), which stops it
        # on its own Ctrl-C path (stop_piped) before it ends
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                echo(line)
        except KeyboardInterrupt:
            stop_piped(name, proc, echo)
            raise
        rc = proc.wait()
    if rc != 0:
        raise UserError(f"stage {name} failed (exit {rc}); its output is in {logfile}")


def _last_checkpoint(save_dir: Path) -> dict[str, Any] | None:
    """A run's last.pt in ``save_dir``, None when it has none."""
    last = save_dir / "last.pt"
    return read_checkpoint(last, "model") if last.exists() else None


def _recorded(ck: dict[str, Any], spec: dict[str, tuple[Any, bool]], name: str, path: Path, within: str = "") -> Any:
    """``ck[name]`` (None when missing), a field of a run's last.pt the round reads, once it passes
    the check ``01_a2c.py --resume`` makes of it (``spec``: ``lib.a2c.run``'s field checks; ``within``:
    the dict it sits in); UserError with one line naming the file for a value no run writes."""
    value = ck.get(name)
    if value is not None:
        try:
            spec[name][0](value)
        except ValueError as e:
            raise UserError(
                f"{path}: field '{within}{name}' {e}: remove the directory to train the run again"
            ) from None
    return value


def _steps_done(ck: dict[str, Any], path: Path) -> int:
    """The agent steps a run's last.pt (``ck``, read from ``path``) says it has done (0: none recorded)."""
    from lib.a2c.run import PROGRESS_FIELDS

    progress = ck.get("progress", {})
    if not isinstance(progress, dict):
        raise UserError(
            f"{path}: field 'progress' is not a dict of counters: remove the directory to train the run again"
        )
    return _recorded(progress, PROGRESS_FIELDS, "step", path, "progress.") or 0


def a2c_progress(save_dir: Path) -> int | None:
    """Agent steps a run in ``save_dir`` has done (from its last.pt), None when it has none."""
    ck = _last_checkpoint(save_dir)
    return None if ck is None else _steps_done(ck, save_dir / "last.pt")


def check_same_kl(cfg: A2CConfig, last: dict[str, Any]) -> None:
    """A run in ``cfg.save_dir`` is reused or continued only if it pulled toward its start policy
    with the --kl the arm asks for now: its last.pt (``last``) records the B it ran with (a run from
    before that record, whose B the directory's name alone told, is reused only where --kl was given)."""
    from lib.a2c.run import RESUME_FIELDS, kl_beta

    had, want = _recorded(last, RESUME_FIELDS, "kl", cfg.save_dir / "last.pt"), kl_beta(cfg, bool(cfg.model), None)
    if had is None and (cfg.kl is not None or want == 0):
        return
    if had != want:
        ran = f"--kl {had:g}" if had is not None else "no --kl recorded (before its default for a learned reward)"
        raise UserError(
            f"{cfg.save_dir} was fine-tuned with {ran}; this arm asks for --kl {want:g}: "
            "remove the directory, or give --ft-args with the --kl it ran with"
        )


def check_same_steps(cfg: A2CConfig, last: dict[str, Any]) -> None:
    """A run in ``cfg.save_dir`` is reused or continued only if it was made for the steps the arm
    asks for now: its last.pt records the length of its learning-rate schedule (``--max-steps``
    unless ``--lr-decay-steps`` set it), so a v0 of 500k is not extended toward 1M, or a 500k
    fine-tune passed off as a 250k one, because a later command gave other steps."""
    from lib.a2c.run import RESUME_FIELDS, lr_schedule_steps

    had, want = _recorded(last, RESUME_FIELDS, "lr_decay_steps", cfg.save_dir / "last.pt"), lr_schedule_steps(cfg)
    if had is None:  # a run from before the record
        return
    if had != want:
        raise UserError(
            f"{cfg.save_dir} holds a run made for {had:,} agent steps; this one asks for {want:,}: give the "
            "steps it was made with (--v0-steps for v0, --ft-steps for a fine-tune, before --scale) or "
            "remove the directory"
        )


def checked_progress(cfg: A2CConfig) -> int | None:
    """Agent steps the run in ``cfg.save_dir`` has done (None: it has no last.pt), once its last.pt
    is known to be made for what ``cfg`` asks (``check_same_kl``, ``check_same_steps``): the one check
    every path that reuses or continues a run goes through (``train_a2c``, the live round)."""
    last = _last_checkpoint(cfg.save_dir)  # read once: it is tens of MB
    if last is None:
        return None
    check_same_kl(cfg, last)
    check_same_steps(cfg, last)
    return _steps_done(last, cfg.save_dir / "last.pt")


def train_a2c(cfg: A2CConfig, evals: int, args: RoundSettings, reward_oracle: bool = False) -> None:
    """``01_a2c.py`` with the arm's settings (``cfg``: name, save directory, ``max_steps``, where it
    starts and what it learns from and records) and the round's (device, seed, logs, ``evals``
    evaluations): skipped when done, continued (``resume``) when stopped. ``reward_oracle``: stage 1
    as the lab runs it, the true score sent through -r's path (``experiments.lab_a2c``)."""
    steps = cfg.max_steps
    done = checked_progress(cfg)
    if done is not None and done >= steps:
        log(f"{cfg.name}: done ({done:,} steps in {cfg.save_dir}), reused")
        return
    cfg = replace(
        cfg,
        dev=args.dev,
        seed=args.seed,
        runs_dir=str(args.out / "tb"),
        test_every=max(steps // evals, 1),
        test_episodes=args.test_episodes,
    )
    # stopped part-way: continue from last.pt (its policy, not the one the arm starts from)
    cfg = replace(cfg, resume=True, model=None) if done is not None else replace(cfg, force=True)
    cmd = [sys.executable, str(ROOT / "01_a2c.py"), *a2c_argv(cfg)]
    if reward_oracle:
        cmd = [sys.executable, "-m", "experiments.lab_a2c", "--reward-oracle", "--a2c-args", shlex.join(a2c_argv(cfg))]
    run_stage(cfg.name, cmd, args.out / "logs" / f"{cfg.name}.log")
    reached = a2c_progress(cfg.save_dir) or 0
    if reached < steps:  # Ctrl-C reached the child too: it saved last.pt and ended cleanly
        raise UserError(f"{cfg.name} stopped at step {reached:,} of {steps:,}: run the same command to continue")


def best_policy(save_dir: Path) -> Path:
    """A run's best checkpoint (``lib.models.policy.best_checkpoint``)."""
    best = best_checkpoint(save_dir)
    if best is None:
        raise UserError(f"no {BEST_GLOB} in {save_dir}: the run never finished an evaluation")
    return best


def split_db(db: Path, out: Path, holdout: float, seed: int) -> dict[str, list[str]]:
    """Held-out and labelable segments of the v0 DB (kept in out/split.json, made once)."""
    path = out / "split.json"
    if path.exists():
        return json.loads(path.read_text())
    segs = list_segments(db)
    if len(segs) < 10:
        raise UserError(f"v0 recorded {len(segs)} segments into {db}: too few for a round (raise --record-prob)")
    order = np.random.default_rng(seed).permutation(len(segs))
    n_hold = max(2, int(round(holdout * len(segs))))
    split = {"holdout": sorted(segs[i] for i in order[:n_hold]), "train": sorted(segs[i] for i in order[n_hold:])}
    atomic_write(path, json.dumps(split).encode())
    return split


def teacher_db(db: Path, tdb: Path, train: list[str]) -> None:
    """A DB of the labelable segments for one teacher's labels: hard links to v0's files (a
    DB holds one labels.jsonl, and teachers must not share it)."""
    for rel in [DB_INFO_FILE, *train]:
        src, dst = db / rel, tdb / rel
        if dst.exists() or not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            atomic_write(dst, src.read_bytes())


def ft_config(args: RoundSettings, **fields: Any) -> A2CConfig:
    """An rlhf or oracle arm's A2CConfig: the round's ``fields`` with --ft-args on top, read by
    01_a2c.py's parser; a flag given is used even where its value is 01_a2c.py's default (checked
    before: ``experiments.round.check``)."""
    from lib.a2c.cli import build_parser as a2c_parser

    return A2CConfig(**{**fields, **given_flags(a2c_parser(), shlex.split(args.ft_args))})


def ft_settings(layers: str) -> dict[str, Any]:
    """A fine-tune's A2CConfig fields for --ft-layers: frozen conv layers (--finetune), or every
    layer trained at the fine-tune's learning rate."""
    if layers == "frozen":
        return {"finetune": True}
    return {"finetune": False, "lr": FINETUNE_LEARNING_RATE}


def label_steps(n: int, sampling: str) -> list[int]:
    """Label counts at which a model is trained before the next pick: all at once at random or
    rare, else thirds (the first at random: no model exists yet)."""
    return [n] if sampling in NO_MODEL_MODES else sorted({n // 3, 2 * n // 3, n})


def label(tdb: Path, args: RoundSettings, upto: int | None = None, reward: Path | None = None) -> None:
    """The teacher labels ``tdb`` up to ``upto`` (default --labels) pairs: at random, or picked by
    --sampling with ``reward``, as the label page would offer them."""
    upto = args.labels if upto is None else upto
    have = len(load_labels(tdb, warn=None))
    if have >= upto:
        log(f"labels: {have} in {tdb}, reused")
        return
    how = args.sampling if reward is not None or args.sampling in NO_MODEL_MODES else "random"
    s = oracle_label_db(
        tdb,
        upto - have,
        seed=args.seed if args.sampling == "random" else args.seed * 1000 + upto,  # random: as before --sampling
        settings=OracleSettings(
            teacher=args.teacher,
            noise=args.teacher_noise,
            sampling=how,
            reward=reward,
            death_penalty=args.death_penalty,
        ),
    )
    log(f"labels: {s.labeled} {how} pairs from the {args.teacher} teacher in {s.seconds:.0f} s: {s.counts}")


def label_and_train(tdb: Path, tdir: Path, args: RoundSettings, older: list[Path] | None = None) -> Path:
    """Labels of ``tdb`` and the round's reward model, trained on them and on the ``older`` rounds'
    label DBs. With a model-picked --sampling, a model trained on the first third picks the second
    third, a model of both the last; only the final one is the round's."""
    model: Path | None = None
    steps = label_steps(args.labels, args.sampling)
    for n in steps:
        label(tdb, args, n, model)
        model = train_reward([*(older or []), tdb], tdir, args, "round" if n == steps[-1] else f"round-{n}")
    assert model is not None
    return model


def train_reward(dbs: list[Path], tdir: Path, args: RoundSettings, name: str = "round") -> Path:
    path = tdir / f"reward-{name}.pt"
    if reward_training_finished(path):
        log(f"reward model: {path}, reused")
        return path
    if path.exists():
        log(f"reward model: {path} was stopped early by hand (or is unreadable): training it again")
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", name, "-o", str(tdir), "--dev", args.dev]
    cmd += ["--seed", str(args.seed), "--runs-dir", str(args.out / "tb"), "--no-progress"]
    cmd += [*shlex.split(args.reward_args), *map(str, dbs)]
    run_stage("reward", cmd, args.out / "logs" / f"reward-{tdir.parent.name}-{tdir.name}-{name}.log")
    return path


@dataclass
class SeedRun:
    """One seed's run: its settings (``args.out`` is the seed's directory, ``args.seed`` its seed),
    the teacher's directory, v0's DB, split and best policy."""

    args: RoundSettings
    tdir: Path
    db: Path
    split: dict[str, list[str]]
    v0_policy: Path


def round_source(sr: SeedRun, k: int) -> tuple[Path, dict[str, list[str]]]:
    """The DB round ``k`` labels, and its split: v0's in round 1, else what round k-1's rlhf
    fine-tune recorded of its own play (split with a seed of its own)."""
    if k == 1:
        return sr.db, sr.split
    db = sr.tdir / f"r{k - 1}" / "rlhf-db"
    return db, split_db(db, sr.tdir / f"r{k}", sr.args.holdout, sr.args.seed + k)


def rlhf_start(sr: SeedRun, k: int) -> Path:
    """The policy round ``k``'s rlhf arm starts from: v0's best in round 1 (and every round with
    ``--from v0``), else round k-1's best rlhf policy."""
    if k == 1 or sr.args.start == "v0":
        return sr.v0_policy
    return best_policy(sr.tdir / f"r{k - 1}" / "rlhf")


BRANCH_DONE = "branch.json"  # written last into a finished branch DB: what made it and the rules
BRANCH_MIN_GAMES = 20  # games a round's branch DB may take at least (v0 made ~13 pairs a game)
BRANCH_KINDS = ("climb", "death")  # --branch-pairs, --death-pairs: what a round's pairs from one saved state are


def branch_round(sr: SeedRun, k: int, kind: str = "climb") -> tuple[Path, dict[str, Any]] | None:
    """Round ``k``'s ``--branch-pairs`` (``kind`` climb: pairs of clips played twice from one saved
    state of the policy the round's rlhf arm starts from, one that may only climb, labelled by the
    surface teacher into ``r<k>/branch-db``) or ``--death-pairs`` (``kind`` death: the state before a
    lost life played again until one replay dies and one lives, labelled by the round's teacher into
    ``r<k>/death-db``; ``experiments/branch.py``): its directory and what decided its labels. Made in
    a ``.partial`` directory and renamed when whole, so a stopped run makes it again; None when the
    round asks for none."""
    args = sr.args
    climb = kind == "climb"
    n = getattr(args, "branch_pairs" if climb else "death_pairs", 0)
    if not n:
        return None
    from experiments import branch

    bdb = sr.tdir / f"r{k}" / ("branch-db" if climb else "death-db")
    try:
        made = json.loads((bdb / BRANCH_DONE).read_text())
        log(f"{kind} pairs: {made['pairs']} in {bdb}, reused")
        return bdb, made
    except (OSError, ValueError, KeyError, TypeError):
        if bdb.exists():
            raise UserError(
                f"{bdb} has no readable {BRANCH_DONE}: move it away to make the {kind} pairs again"
            ) from None
    policy = rlhf_start(sr, k)
    part = bdb.with_name(bdb.name + ".partial")
    if part.exists():
        shutil.rmtree(part)
    part.mkdir(parents=True)
    seed = (args.seed * 1000 + k + (0 if climb else 500)) % 2**31
    most = max(BRANCH_MIN_GAMES, n // 2 if climb else n)  # a death pair costs a lost life: ~4 a game
    steps = args.branch_steps if climb else args.death_steps
    s = branch.BranchSettings(
        n,
        steps,
        seed=seed,
        max_games=most,
        teacher=args.teacher,  # climb pairs: a teacher of the climb (the round's checks refuse others)
    )
    log(f"{kind} pairs: {s.pairs} of {s.steps} steps from {policy} into {bdb} (at most {most} games)")
    t0 = time.time()
    make = branch.make_pairs if climb else branch.make_death_pairs
    rules = make(policy, part, s, log=lambda m: log(m, "branch"))
    made = {
        "kind": kind,
        "pairs": sum(rules.values()),
        "asked": s.pairs,
        "steps": s.steps,
        "seed": s.seed,
        "policy": str(policy),
        "rules": rules,
        "seconds": round(time.time() - t0, 1),
    }
    atomic_write(part / BRANCH_DONE, json.dumps(made).encode())
    part.rename(bdb)
    return bdb, made


def reward_round(sr: SeedRun, k: int) -> tuple[Path, dict[str, Any]]:
    """Round ``k``'s inner loop: labels of its DB, a reward model of every label so far, its
    held-out figures and the labels' evidence (the reward model and its ``reward_model`` and
    ``evidence`` figures)."""
    args, rdir = sr.args, sr.tdir / f"r{k}"
    rdir.mkdir(parents=True, exist_ok=True)
    src, split = round_source(sr, k)
    ldb = rdir / "label-db"
    teacher_db(src, ldb, split["train"])
    older = [sr.tdir / f"r{j}" / "label-db" for j in range(1, k)]
    branches = {
        kind: [b for j in range(1, k + 1) if (b := branch_round(sr, j, kind)) is not None] for kind in BRANCH_KINDS
    }
    older += [bdb for kind in BRANCH_KINDS for bdb, _ in branches[kind]]  # every round's pairs so far, this one's too
    previous = sr.tdir / f"r{k - 1}" / "reward-round.pt"
    if k > 1 and not (rdir / "reward-round.pt").exists():
        label(ldb, args)  # this round's labels first: the previous model is judged on them before training
    reward = label_and_train(ldb, rdir, args, older)
    before = None
    if k > 1 and previous.exists():
        before = cached_json(
            rdir / "previous_model_on_new_labels.json",
            lambda: label_agreement(previous, ldb, args.dev),
            {"reward": file_digest(previous), "labels": file_digest(ldb / LABELS_FILE)},
        )
    figs = cached_json(
        rdir / "reward_heldout.json",
        lambda: held_out_figures(src, split["holdout"], reward, args.teacher, args.dev, args.death_penalty),
        held_out_key(reward, args, split["holdout"]),
    )
    evidence = cached_json(
        rdir / "evidence.json",
        lambda: teacher_evidence(src, ldb, split["train"], args.teacher),
        {"labels": file_digest(ldb / LABELS_FILE), "teacher": args.teacher},
    )
    if before is not None:
        figs = {**figs, "previous_on_new_labels": before["agreement"], "previous_on_new_pairs": before["pairs"]}
    for kind, key in zip(BRANCH_KINDS, ("branch", "death_branch"), strict=True):
        if branches[kind]:
            evidence = {**evidence, key: branches[kind][-1][1]}
    return reward, {"reward_model": figs, "evidence": evidence}


def cached_json(path: Path, make: Any, key: dict[str, Any] | None = None) -> Any:
    """``make()``'s JSON-able result, kept in ``path`` with ``key`` (what it was made from: a
    file's digest, the settings) and read back when the command runs again with the same key;
    made again when the key differs or the file is unreadable."""
    if path.exists():
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            kept = None
        if isinstance(kept, dict) and kept.get("made_from") == key and "value" in kept:
            return kept["value"]
    value = make()
    atomic_write(path, json.dumps({"made_from": key, "value": value}).encode())
    return value


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes: what a cached figure of it was made from."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tb_scalars(tb_root: Path, run_prefix: str, tag: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``tag`` from the newest TensorBoard run whose name starts with
    ``run_prefix`` (a resumed run continues in the same directory)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(p for p in tb_root.glob(f"{run_prefix}__*") if p.is_dir())
    steps: dict[int, float] = {}
    for run in runs:  # earlier directories of a run started over are overwritten by later ones
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            steps.update({e.step: e.value for e in acc.Scalars(tag)})
    keys = sorted(steps)
    return keys, [steps[k] for k in keys]


# --- figures ------------------------------------------------------------------------------------


def held_out_key(reward: Path, args: RoundSettings, holdout: list[str]) -> dict[str, Any]:
    """What a reward model's held-out figures were made from (``cached_json``'s key): the model's
    bytes, the teacher and its death penalty, the held-out set's size, and the figures' version, so
    that figures cached by an older way of measuring are made again."""
    key = {"reward": file_digest(reward), "teacher": args.teacher, "holdout": len(holdout)}
    key |= {"death_penalty": args.death_penalty} if args.death_penalty else {}
    return key | {"figures": HELD_OUT_FIGURES}


EVIDENCE_KEY = {"oxygen_deaths": "by_oxygen_death", "refills": "by_refill", "returns": "by_score"}


RULE_KEY = {"oxygen_death": "by_oxygen_death", "refill": "by_refill", "score": "by_score"}


def teacher_evidence(db: Path, tdb: Path, train: list[str], teacher: str) -> dict[str, int]:
    """What the teacher had to go on: how its labels were decided (by the teacher's own rule: the
    score teacher decides every label by the score), and how many of the labelable segments show a
    voluntary refill or an oxygen death at all (SeaQuest)."""
    ev = {"labels": 0, "by_oxygen_death": 0, "by_refill": 0, "by_score": 0, "ties": 0, "cant_tell": 0}
    rules: dict[str, int] = {}
    for lab in load_labels(tdb, warn=None).values():
        ev["labels"] += 1
        rule = lab.extra.get("rule")
        if isinstance(rule, str):  # the rule the teacher recorded (lib.label_ui.oracle)
            rules[rule] = rules.get(rule, 0) + 1
        if lab.label not in (FIRST_BETTER, SECOND_BETTER):
            ev["ties" if lab.label == 0 else "cant_tell"] += 1
            continue
        if rule in RULE_KEY:  # recorded: oxygen_death, refill or score (climb and idle: in "rules" only)
            ev[RULE_KEY[rule]] += 1
            continue
        for fact in RULE_FACTS.get(teacher, ()):  # labels written before rules were recorded
            values = lab.extra.get(fact)
            if isinstance(values, list) and len(values) == 2 and values[0] != values[1]:
                ev[EVIDENCE_KEY[fact]] += 1
                break
    ev["rules"] = rules  # type: ignore[assignment]
    game = (db_game(db) or (None, None))[0]
    ev.update(segments=0, with_refill=0, with_oxygen_death=0, lives_lost=0)
    for rel in train:
        try:
            seg = read_segment(db, rel)
        except SegmentError:
            continue
        f = segment_facts(seg.frames, seg.rewards, seg.dones, game)
        ev["segments"] += 1
        if f.oxygen is not None:
            ev["with_refill"] += f.oxygen.refills > 0
            ev["with_oxygen_death"] += f.oxygen.oxygen_deaths > 0
            ev["lives_lost"] += f.oxygen.deaths
    return ev


def evaluate_arm(policy: Path, cache: Path, args: RoundSettings) -> dict[str, Any]:
    """--eval-games full games with EVAL_SEED (the same games for every arm); kept in ``cache``,
    keyed on the policy's content (a run resumed to more steps writes a new ``last.pt`` at the
    same path) and the games. With them, the evaluation that saved the run's best checkpoint
    (``best_checkpoint``: step, mean score, mean length), where the policy's directory has one."""

    def games() -> dict[str, Any]:
        log(f"evaluating {policy}: {args.eval_games} games")
        cfg = PlayConfig(model=str(policy), episodes=args.eval_games, dev=args.dev, seed=EVAL_SEED)
        results = play(cfg, log=lambda m: None)
        return {
            "policy": str(policy),
            "games": args.eval_games,
            "scores": [r.score for r in results],
            "lengths": [r.steps for r in results],
            "refills": [r.oxygen.refills if r.oxygen else None for r in results],
            "deaths": [r.oxygen.deaths if r.oxygen else None for r in results],
            "oxygen_deaths": [r.oxygen.oxygen_deaths if r.oxygen else None for r in results],
            **{name: [_surface(r, key) for r in results] for name, key in SURFACE_FIGURES.items()},
            "lives": [[list(life) for life in r.lives] for r in results],  # (score, steps) of each life
        }

    key = {"policy": file_digest(policy), "games": args.eval_games, "seed": EVAL_SEED, "record": EVAL_RECORD}
    record = cached_json(cache, games, key)
    best = best_checkpoint(policy.parent)  # the run's, read from its name: not played, not cached
    if best is not None and (figures := best_checkpoint_figures(best)) is not None:
        record["best_checkpoint"] = dict(zip(("step", "score", "length"), figures, strict=True))
    return record


# evaluate_arm's record: its name -> the SurfaceCounts field per game
SURFACE_FIGURES = {
    "climbs": "low_climbs",
    "surface_steps": "surface_steps",
    "rescues": "rescues",
    "diver_steps": "diver_steps",
    "surfacing_deaths": "surfacing_deaths",
}
# evaluate_arm's record layout: a cache of an older one (no surfacing_deaths) is played again. One
# without "lives" (per-life scores, added later) still loads: its best-life cell reads n/a.
EVAL_RECORD = 2


def _surface(res: Any, key: str) -> float | None:
    """A game's surface figure (``lib.atari.behaviour``'s observer), None where the game had none."""
    counts = getattr(res, "surface", None)
    return None if counts is None else float(getattr(counts, key))


def print_model_figures(what: str, rm: dict[str, Any]) -> None:
    """A reward model's held-out figures: overall, per deciding rule, on low-gauge diver steps."""
    during = rm.get("step_corr_finetune")
    print(
        f"{what} on {rm['heldout_segments']} never-seen segments of the round's DB: "
        f"{100 * rm['teacher_agreement']:.1f}% agreement with the teacher ({rm['teacher_pairs']} pairs), "
        f"{100 * rm['score_agreement']:.1f}% with the score; per-step correlation with the true reward "
        f"{rm['step_corr_heldout']:+.2f} (held out)"
        + (f", {during:+.2f} (during the rlhf fine-tune)" if during is not None else "")
    )
    if by_rule := rm.get("by_rule"):
        parts = [f"{rule} {100 * v['agreement']:.1f}% ({v['pairs']} pairs)" for rule, v in by_rule.items()]
        print("  held-out agreement per deciding rule: " + ", ".join(parts))
    if "diver_climb_z" in rm:
        print(
            f"  mean normalised reward on held-out steps with a low gauge and a diver aboard: climbing "
            f"{rm['diver_climb_z']:+.2f} ({rm['diver_climb_steps']} steps), not climbing "
            f"{rm['diver_still_z']:+.2f} ({rm['diver_still_steps']} steps)"
        )


def print_evidence(ev: dict[str, Any]) -> None:
    """How the labels were decided (``teacher_evidence``)."""
    rules = _by_count(ev.get("rules", {}))
    print(
        f"  the teacher's {ev['labels']} labels: {ev['by_oxygen_death']} decided by an oxygen death, "
        f"{ev['by_refill']} by a refill, {ev['by_score']} by the score, {ev['ties']} ties, "
        f"{ev['cant_tell']} can't tell"
        + (f"; by the rule recorded: {rules}" if rules else "")
        + f"; {100 * behaviour_share(ev):.0f}% decided by a rule the score does not pay for"
        + f"; of the DB's {ev['segments']} labelable segments {ev['with_refill']} show a voluntary refill "
        f"and {ev['with_oxygen_death']} an oxygen death ({ev['lives_lost']} lives lost)"
    )
    for key, what in (("branch", "branch pairs"), ("death_branch", "death pairs")):
        if b := ev.get(key):
            print(
                f"  this round's {what}: {b['pairs']} of {b['steps']} steps from {b['policy']}; "
                f"decided by {_by_count(b['rules'])}"
            )


def _by_count(counts: dict[str, int]) -> str:
    """{"tie": 3, "death": 5} -> "5 death, 3 tie"."""
    return ", ".join(f"{n} {rule}" for rule, n in sorted(counts.items(), key=lambda x: -x[1]))
