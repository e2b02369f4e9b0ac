"""Live rounds: the stages at once, over the same files. The agent fine-tunes on the installed
reward model and records its play; a synthetic teacher labels its newest clips as they appear; the
reward model is retrained every --retrain-every labels and the agent switches to each new version
without stopping (Christiano et al. 2017's loop, with our offline stages as its parts).

Two uses:

- ``python -m experiments.round --live`` (``run_live``): the staged benchmark's teacher, total
  labels and agent steps, live. It starts where staged round 1 starts (v0, round 1's labels of
  v0's DB and its reward model), then one fine-tune of --rounds x --ft-steps agent steps from v0's
  best policy while the teacher labels the other (--rounds - 1) x --labels pairs of the agent's own
  clips at a constant rate per agent step. Its evaluation games sit beside the staged rounds'.
- ``python -m experiments.live`` (``make demo-live``): a few minutes on 2 cores from nothing: a
  recording A2C on the true score makes the first clips, the following oracle labels them, the
  following trainer makes v1, then the reloading A2C learns from each new version. Prints the
  versions made, the labels and the true score over time, and writes a PNG of it.

Every process is one of the pipeline's scripts; this module only starts, watches and stops them.
Stopping is always SIGINT first (each script's Ctrl-C path: labels flushed, checkpoints whole),
SIGTERM after a grace period, SIGKILL last. Ctrl-C, SIGTERM and SIGHUP to this module all take that
path for every child (``lib.core.signals.PARENT_SIGNALS``); a second signal does not cut it short.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.flags import a2c_argv, at_least_one, seed_setting
from experiments.readouts import held_out_figures
from experiments.round_report import arm_row, table
from experiments.round_settings import RoundSettings
from experiments.stages import (
    CURVE_TAGS,
    SeedRun,
    a2c_progress,
    cached_json,
    checked_progress,
    evaluate_arm,
    file_digest,
    ft_config,
    ft_settings,
    held_out_key,
    print_evidence,
    print_model_figures,
    reward_round,
    spawn,
    stop_all,
    tb_scalars,
    teacher_evidence,
    wait_for,
)
from lib.core.errors import UserError, run_cli
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, setting
from lib.core.signals import PARENT_SIGNALS, SignalStop
from lib.models.teachers import DEFAULT_TEACHER, TEACHERS
from lib.reward.follow import read_versions, versions_log

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def log(msg: str) -> None:
    print(f"[live {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- what the files say ---------------------------------------------------------------------------


def count_labels(db: Path) -> int:
    """Training labels in ``db`` (the last answer per pair, 1 / 2 / 0)."""
    from lib.store.labels import load_labels

    if not (db / "labels.jsonl").exists():
        return 0
    return sum(1 for lab in load_labels(db, warn=lambda m: None).values() if lab.label in (0, 1, 2))


def versions_table(versions: list[dict[str, Any]]) -> str:
    """One row per version the trainer made (its ``versions.jsonl``): labels, held-out figures, the
    comparison with the model installed before it, the fresh evidence, installed or not and why."""
    lines = [
        "| version | labels | held-out pairs | held-out acc | vs installed: new / old acc (pairs) "
        "| installed's acc on newer labels (pairs) | oracle agr. | installed |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for v in versions:
        vs = "n/a"
        if "compared_pairs" in v:
            new, old = _pct(v.get("candidate_accuracy")), _pct(v.get("installed_heldout_accuracy"))
            vs = f"{new} / {old} ({v['compared_pairs']})"
        fresh = f"{_pct(v.get('fresh_accuracy'))} ({v.get('fresh_pairs', 0)})" if v.get("fresh_pairs") else "n/a"
        verdict = "yes" if v.get("installed") else "no"
        lines.append(
            f"| v{v.get('version', '?')} | {v.get('labels', '?')} | {v.get('heldout_pairs', '?')} "
            f"| {_pct(v.get('heldout_accuracy'))} | {vs} | {fresh} | {_pct(v.get('oracle_agreement'))} "
            f"| {verdict}: {v.get('why', '')} |"
        )
    return "\n".join(lines)


def _pct(v: Any) -> str:
    return f"{v:.0%}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


# --- experiments.round --live ------------------------------------------------------------------

LIVE_VERSIONS = 8  # reward-model versions a live round aims at: a retrain every 1/8 of its labels (25 of 200)
LIVE_RECENT = 200  # the teacher labels pairs of the agent's newest clips: what it does now


def live_plan(args: RoundSettings) -> dict[str, Any]:
    """The staged benchmark's budget, live: agent steps, labels after round 1's, their rate."""
    steps = int(args.ft_steps * args.scale) * args.rounds
    later = args.labels * (args.rounds - 1)
    rate = 1000.0 * later / steps if steps else 0.0
    return {"steps": steps, "labels": later, "rate": rate, "retrain_every": max(1, math.ceil(later / LIVE_VERSIONS))}


def run_live(sr: SeedRun) -> dict[str, Any]:
    """One seed's live round: its rows, versions and figures."""
    from lib.core.files import atomic_write
    from lib.store.segments import list_segments

    args = sr.args
    ldir = sr.tdir / "live"
    ldir.mkdir(parents=True, exist_ok=True)
    plan = live_plan(args)
    db, save, stable = ldir / "rlhf-db", ldir / "rlhf", ldir / "reward-live.pt"
    name = f"round-live-{sr.tdir.name}"
    cfg = ft_config(  # --ft-args too: the live arm learns as the staged rlhf arms do
        args,
        name=name,
        save=str(save),
        max_steps=plan["steps"],
        model=str(sr.v0_policy),
        reward=str(stable),
        reward_reload=True,
        db_path=str(db),
        record_prob=args.record_prob,
        dev=args.dev,
        seed=args.seed,
        runs_dir=str(args.out / "tb"),
        test_every=max(plan["steps"] // (args.evals * args.rounds), 1),
        test_episodes=args.test_episodes,
        **ft_settings(args.ft_layers),
    )
    done = checked_progress(cfg)  # a run made for other steps or another --kl: refused, as the staged arms'
    reward1, figures1 = reward_round(sr, 1)  # live starts where staged round 1 starts
    if not stable.exists():
        atomic_write(stable, reward1.read_bytes())
    if done is None or done < plan["steps"]:
        cfg = replace(cfg, resume=True, model=None) if done is not None else replace(cfg, force=True)
        live_loop(sr, cfg, a2c_argv(cfg), plan, reward1)
    reached = a2c_progress(save) or 0
    if reached < plan["steps"]:
        raise UserError(f"{name} stopped at step {reached:,} of {plan['steps']:,}: run the same command to continue")
    final = stable
    figs = cached_json(
        ldir / "reward_heldout.json",
        lambda: held_out_figures(sr.db, sr.split["holdout"], final, args.teacher, args.dev, args.death_penalty),
        held_out_key(final, args, sr.split["holdout"]),
    )
    row = arm_row(evaluate_arm(save / "last.pt", ldir / "eval.json", args))
    evidence = cached_json(
        ldir / "evidence.json",
        lambda: teacher_evidence(db, db, list_segments(db), args.teacher),
        {"labels": file_digest(db / "labels.jsonl"), "teacher": args.teacher},
    )
    return {
        "row": row,
        "plan": plan,
        "labels": count_labels(db),
        "versions": read_versions(versions_log(ldir, "live")),
        "reward_model": figs,
        "reward_model_r1": figures1["reward_model"],
        "evidence": evidence,
        "curves": {tag: tb_scalars(args.out / "tb", name, tag) for tag in CURVE_TAGS},
        "version_steps": tb_scalars(args.out / "tb", name, "reward_model/version"),
    }


def live_loop(sr: SeedRun, cfg: Any, a2c_flags: list[str], plan: dict[str, Any], reward1: Path) -> None:
    """The agent, the following teacher and the following trainer side by side until the agent
    has done its steps; then the teacher and the trainer are stopped."""
    args = sr.args
    ldir = sr.tdir / "live"
    logs = args.out / "logs"
    db = Path(cfg.db_path)
    older = sr.tdir / "r1" / "label-db"
    owed = plan["labels"] - count_labels(db)
    procs = [spawn(cfg.name, [PY, ROOT / "01_a2c.py", *a2c_flags], logs / f"{cfg.name}.log")]
    try:
        wait_for(f"the first segment in {db}", lambda: any(db.glob("[0-9][0-9]/*.dat")), procs, timeout=1800)
        if owed > 0:
            oracle = [PY, ROOT / "02_label_ui.py", "-d", db, "--oracle", str(owed), "--follow"]
            oracle += ["--teacher", args.teacher, "--sampling", args.sampling, "--recent", str(LIVE_RECENT)]
            oracle += ["--death-penalty", str(args.death_penalty)]  # 0 too: unset, 02_label_ui.py takes its default
            oracle += ["--schedule", "constant", "--label-rate", f"{plan['rate']:.6g}", "--seed", str(args.seed)]
            procs.append(spawn("oracle", oracle, logs / f"oracle-{ldir.parent.name}-live.log"))
        trainer = [PY, ROOT / "03_reward_train.py", "-n", "live", "-o", ldir, "--follow"]
        trainer += ["--retrain-every", str(plan["retrain_every"]), "--dev", args.dev, "--seed", str(args.seed)]
        trainer += ["--runs-dir", args.out / "tb", "--no-progress", older, db]
        procs.append(spawn("trainer", trainer, logs / f"trainer-{ldir.parent.name}-live.log"))
        last = 0.0
        while procs[0].running():
            for p in procs[1:]:
                if not p.running():
                    raise UserError(f"{p.name} ended (exit {p.popen.returncode}) before the agent:\n{p.tail()}")
            if time.time() - last > 300:
                vs = read_versions(versions_log(ldir, "live"))
                log(f"agent: {procs[0].tail(1).strip()}")
                installed = sum(bool(v.get("installed")) for v in vs)
                log(f"labels {count_labels(db)}, versions {len(vs)} ({installed} installed)")
                last = time.time()
            time.sleep(5)
    finally:
        stop_all(procs)


def staged_rows(sr: SeedRun) -> list[dict[str, dict[str, float]]]:
    """The staged rounds' rows of the same teacher directory (its round.json), [] when not run."""
    try:
        report = json.loads((sr.tdir / "round.json").read_text())
        return [r["rows"] for r in report["rounds"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def report_live(sr: SeedRun, res: dict[str, Any], t0: float) -> list[dict[str, dict[str, float]]]:
    """The live row beside the staged rounds' (same evaluation games), the versions, the final
    model's held-out figures against round 1's, live.png and live.json."""
    from lib.core.files import atomic_write

    args, plan = sr.args, res["plan"]
    staged = staged_rows(sr)[: args.rounds]
    rows = [*staged, {"live": res["row"]}]
    names = [str(k) for k in range(1, len(staged) + 1)] + [f"1-{args.rounds}"]
    if not staged:
        rows[0]["v0"] = arm_row(evaluate_arm(sr.v0_policy, args.out / "eval" / "v0.json", args))
    print(
        f"\n## Live: {args.teacher} teacher, {args.labels} labels of v0's DB, then {plan['labels']} more at "
        f"{plan['rate']:.3g} per 1,000 agent steps over one {plan['steps']:,}-step fine-tune; "
        f"{args.eval_games} eval games (seed {args.seed})\n"
    )
    print(table(rows, arms=("v0", "control", "rlhf", "live"), names=names) + "\n")
    if not staged:
        print(f"(no staged rounds in {sr.tdir / 'round.json'}: run the same command without --live for them)\n")
    vs = res["versions"]
    print(f"the trainer's versions ({len(vs)} made, {sum(bool(v.get('installed')) for v in vs)} installed):\n")
    print(versions_table(vs) + "\n")
    print(f"labels written live: {res['labels']} (planned {plan['labels']})")
    print_model_figures("round 1's reward model (where the live run starts)", res["reward_model_r1"])
    print_model_figures("the live run's last installed model", res["reward_model"])
    print_evidence(res["evidence"])
    plot_live(sr.tdir / "live.png", res, staged_curves(sr), f"{args.teacher} teacher: live vs staged, seed {args.seed}")
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **{k: res[k] for k in ("row", "plan", "labels", "versions", "reward_model", "evidence")},
        "staged": staged,
    }
    atomic_write(sr.tdir / "live.json", json.dumps(report, indent=1).encode())
    print(f"\n{sr.tdir / 'live.png'}, {sr.tdir / 'live.json'} ({(time.time() - t0) / 60:.1f} min so far)")
    return rows


def staged_curves(sr: SeedRun) -> dict[str, tuple[list[int], list[float]]]:
    """The staged rlhf and control arms' eval score over cumulative fine-tune steps (round k's
    curve shifted by k-1 fine-tunes)."""
    args = sr.args
    steps = int(args.ft_steps * args.scale)
    out: dict[str, tuple[list[int], list[float]]] = {"rlhf": ([], []), "control": ([], [])}
    for k in range(1, args.rounds + 1):
        for arm, prefix in (("rlhf", f"round-rlhf-{sr.tdir.name}-r{k}"), ("control", f"round-control-r{k}")):
            xs, ys = tb_scalars(args.out / "tb", prefix, "eval/score_mean")
            out[arm][0].extend(x + (k - 1) * steps for x in xs)
            out[arm][1].extend(ys)
    return out


def plot_live(path: Path, res: dict[str, Any], staged: dict[str, tuple[list, list]], title: str) -> None:
    """live.png: eval score over agent steps, live against the staged arms; a line per version switch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for arm, style in (("control", dict(color="tab:grey", linestyle="--")), ("rlhf", dict(color="tab:blue"))):
        if staged[arm][0]:
            ax.plot(*staged[arm], marker="o", label=f"staged {arm}", **style)
    xs, ys = res["curves"].get("eval/score_mean", ([], []))
    if xs:
        ax.plot(xs, ys, marker="s", color="tab:red", label="live rlhf")
    vsteps, versions = res["version_steps"]
    for i in range(1, len(versions)):
        if versions[i] != versions[i - 1]:
            ax.axvline(vsteps[i], color="tab:red", alpha=0.25, linewidth=1)
    ax.set_xlabel("fine-tune agent steps (faint lines: the agent switched reward model)")
    ax.set_ylabel("mean eval score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- make demo-live ----------------------------------------------------------------------------


PHASE2_MIN_SHARE = 0.4  # the reloading phase runs at least this share of --minutes, however long phase 1 took


def demo_paths(root: Path) -> dict[str, Path]:
    """Where the demo's files go under ``root`` (the repository for make demo-live)."""
    return {
        "db": root / "db/demo-live",  # the recording A2C's clips (true score)
        "db_rl": root / "db/demo-live-rl",  # the reloading A2C's clips (learned reward)
        "save": root / "saves/demo-live",
        "save_rl": root / "saves/demo-live-rl",
        "reward": root / "saves/demo-live-reward",
        "logs": root / "saves/demo-live-logs",
        "runs": root / "runs",
    }


COUNTS_WRONG = "--envs and --retrain-every must be at least 1, --label-rate above 0"


@dataclass(frozen=True)
class DemoSettings:
    """What ``python -m experiments.live`` (``make demo-live``) is told, one field per flag."""

    minutes: float = setting(
        5.0,
        "how long the whole demo runs (default 5)",
        group="demo",
        checks=[(lambda v: 1 <= v <= 600, "--minutes must be in 1..600, got {v:g}")],
    )
    teacher: str = setting(DEFAULT_TEACHER, "the oracle's teacher", group="demo", choices=TEACHERS)
    envs: int = setting(
        8, "envs of each A2C (default 8: 2 cores run four processes)", group="demo", checks=at_least_one(COUNTS_WRONG)
    )
    label_rate: float = setting(
        10.0,
        "oracle labels per 1,000 agent steps (default 10)",
        group="demo",
        checks=[(lambda v: v > 0, COUNTS_WRONG)],
    )
    retrain_every: int = setting(
        10, "new labels between reward-model versions", group="demo", checks=at_least_one(COUNTS_WRONG)
    )
    seed: int = seed_setting("seed of every process", group="demo")
    dir: Path = setting(Path("."), "where db/, saves/ and runs/ are (default: here)", group="demo")


def build_parser() -> argparse.ArgumentParser:
    """The demo's flags (``--help``), one per ``DemoSettings`` field."""
    return settings_parser(
        DemoSettings,
        "python -m experiments.live",
        "make demo-live: the four live processes together for a few minutes, from nothing. A recording "
        "A2C on the true score makes the first clips; a following oracle labels them as they appear; a following "
        "trainer makes reward model v1; then the recording A2C is stopped and a reloading A2C starts from its "
        "policy, learning from each new version while the oracle labels its own clips and the trainer goes on. "
        "At the end every process is stopped with Ctrl-C (SIGINT). Files: db/demo-live*, saves/demo-live*, "
        "runs/demo-live* (the previous demo's are removed first).",
        {"demo": "the demo"},
    )


def demo(args: DemoSettings) -> int:
    """``make demo-live``; returns the exit code (0: every process stopped cleanly)."""
    check_fields(args)
    where = demo_paths(args.dir.resolve())
    for key, path in where.items():
        if key != "runs":
            shutil.rmtree(path, ignore_errors=True)
    for old in where["runs"].glob("demo-live*"):
        shutil.rmtree(old, ignore_errors=True)
    deadline = time.time() + 60 * args.minutes
    logs, seed = where["logs"], ["--seed", str(args.seed)]
    a2c = ["--max-steps", "100000000", "--envs", str(args.envs), "--record-prob", "0.01", *seed]
    a2c += ["--test-every", "100000000", "--runs-dir", where["runs"]]
    oracle = ["--oracle", "100000", "--follow", "--teacher", args.teacher, "--schedule", "constant"]
    oracle += ["--label-rate", str(args.label_rate), "--poll", "2", *seed]
    trainer = [PY, ROOT / "03_reward_train.py", "-n", "demo-live", "-o", where["reward"], "--follow"]
    trainer += ["--retrain-every", str(args.retrain_every), "--poll", "2", "--epochs", "30", "--no-progress"]
    trainer += ["--runs-dir", where["runs"], *seed]
    stable = where["reward"] / "reward-demo-live.pt"
    t0 = time.time()
    log(f"demo-live: {args.minutes:g} minutes; every process's output is in {logs}/")

    # phase 1: clips of an agent learning the true score, labels as they appear, the first reward model
    record = [PY, ROOT / "01_a2c.py", "-n", "demo-live", "--save", where["save"], "--db-path", where["db"], *a2c]
    procs = [spawn("a2c-record", record, logs / "a2c-record.log")]
    try:
        wait_for("first clip", lambda: any(where["db"].glob("[0-9][0-9]/*.dat")), procs, 60 * args.minutes)
        procs.append(spawn("oracle", [PY, ROOT / "02_label_ui.py", "-d", where["db"], *oracle], logs / "oracle.log"))
        procs.append(spawn("trainer", [*trainer, where["db"]], logs / "trainer.log"))
        # on a busy machine phase 1 may take the whole budget: the demo then overruns rather than skip phase 2
        wait_for(f"reward model {stable}", stable.exists, procs, max(deadline - time.time(), 60 * args.minutes))
    finally:
        codes = stop_all(procs)
    switch_step = _last_step(where["save"])

    # phase 2: the reloading agent learns from each new version; the oracle labels its own clips
    log(
        f"phase 2 after {time.time() - t0:.0f} s: the reloading A2C starts from {where['save']} at step {switch_step:,}"
    )
    reload = [PY, ROOT / "01_a2c.py", "-n", "demo-live-rl", "--save", where["save_rl"], "-m", where["save"] / "last.pt"]
    reload += ["-r", stable, "--reward-reload", "--db-path", where["db_rl"], *a2c]
    procs = [spawn("a2c-reload", reload, logs / "a2c-reload.log")]
    try:
        deadline = max(deadline, time.time() + PHASE2_MIN_SHARE * 60 * args.minutes)
        wait_for("first clip", lambda: any(where["db_rl"].glob("[0-9][0-9]/*.dat")), procs, deadline - time.time())
        procs.append(
            spawn("oracle-rl", [PY, ROOT / "02_label_ui.py", "-d", where["db_rl"], *oracle], logs / "oracle-rl.log")
        )
        procs.append(spawn("trainer-2", [*trainer, where["db"], where["db_rl"]], logs / "trainer.log"))
        while time.time() < deadline:
            for p in procs:
                if not p.running():
                    raise UserError(f"{p.name} ended (exit {p.popen.returncode}) before the demo's end:\n{p.tail()}")
            time.sleep(2)
    finally:
        codes.update(stop_all(procs))
    return demo_report(where, codes, switch_step, time.time() - t0)


def _last_step(save: Path) -> int:
    return a2c_progress(save) or 0


def demo_report(where: dict[str, Path], codes: dict[str, int], switch_step: int, seconds: float) -> int:
    """What the demo made: versions, labels, the true score over time (printed and a PNG)."""
    versions = read_versions(versions_log(where["reward"], "demo-live"))
    print(f"\n== demo-live done in {seconds / 60:.1f} min")
    print(f"versions made: {len(versions)} ({sum(bool(v.get('installed')) for v in versions)} installed)")
    print(versions_table(versions))
    print(f"labels: {count_labels(where['db'])} in {where['db']}, {count_labels(where['db_rl'])} in {where['db_rl']}")
    rec = tb_scalars(where["runs"], "demo-live", "charts/episode_score")
    rl = tb_scalars(where["runs"], "demo-live-rl", "charts/episode_score")
    ver = tb_scalars(where["runs"], "demo-live-rl", "reward_model/version")
    rl = ([s + switch_step for s in rl[0]], rl[1])
    ver = ([s + switch_step for s in ver[0]], ver[1])
    print("true score over time (mean of the games that ended in each stretch of agent steps):")
    for name, (xs, ys) in (("recording A2C, true score", rec), ("reloading A2C, learned reward", rl)):
        for lo, hi, mean, n in score_stretches(xs, ys):
            print(f"  {name}: steps {lo:>9,} - {hi:>9,}: {mean:7.1f} ({n} games)")
    png = where["save_rl"] / "score_over_time.png"
    plot_demo(png, rec, rl, ver)
    print(f"plot: {png}")
    print("stopped: " + ", ".join(f"{k} exit {v}" for k, v in codes.items()))
    bad = {k: v for k, v in codes.items() if v not in (0, 130)}
    if bad:
        print(f"not stopped cleanly: {bad}", file=sys.stderr)
        return 1
    return 0


def score_stretches(xs: list[int], ys: list[float], n: int = 5) -> list[tuple[int, int, float, int]]:
    """(first step, last step, mean score, games) of ``n`` consecutive stretches of the games."""
    out = []
    size = max(1, math.ceil(len(xs) / n))
    for i in range(0, len(xs), size):
        chunk = ys[i : i + size]
        out.append((xs[i], xs[min(i + size, len(xs)) - 1], sum(chunk) / len(chunk), len(chunk)))
    return out


def plot_demo(path: Path, rec: tuple[list, list], rl: tuple[list, list], ver: tuple[list, list]) -> None:
    """score_over_time.png: every game's true score against agent steps; a line per version switch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*rec, ".", color="tab:grey", label="recording A2C (true score)")
    ax.plot(*rl, ".", color="tab:red", label="reloading A2C (learned reward)")
    top = max([*rec[1], *rl[1], 1.0])
    for i, (x, v) in enumerate(zip(*ver, strict=True)):
        if i == 0 or v != ver[1][i - 1]:
            ax.axvline(x, color="tab:red", alpha=0.3)
            ax.text(x, top, f" v{v:g}", fontsize=7, va="bottom")
    ax.set_xlabel("agent steps")
    ax.set_ylabel("true game score")
    ax.set_title(
        "make demo-live: true score while the reward model is retrained (lines: the agent switched)", fontsize=9
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)  # keeps the version labels readable
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return demo(DemoSettings(**vars(build_parser().parse_args(argv))))


def cli() -> None:
    stop = SignalStop(at_once=True, signals=PARENT_SIGNALS)  # SIGTERM and SIGHUP: the Ctrl-C path
    try:
        with stop:
            run_cli(main)
    except KeyboardInterrupt:
        how = "Ctrl-C" if stop.signal in (None, "SIGINT") else stop.signal
        print(f"\ninterrupted ({how}): every process was stopped with Ctrl-C", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
