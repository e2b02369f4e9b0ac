"""Benchmark of stage 3: reward-model training speed and memory, inference cost, and the cost of
RewardModelWrapper per agent step. Prints a table: figure | value | unit | setting.

    python -m bench.bench_reward [--labels 1000] [--segments 2000] [--dev cpu]

The training rows run ``03_reward_train.py`` as a user would (one epoch on ``--labels`` oracle
labels over a DB of ``--segments`` real SeaQuest segments played with random actions) and read
its seconds per pair and peak RSS from its report. The book's figures to compare with: ~0.45 s
per labeled pair per epoch and 8 GB peak with 40 labels (12-15 GB at batch 64); its wrapper calls
the model once per env per frame with batch size 1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lib.a2c.recorder import EpisodeRecorderWrapper
from lib.a2c.reward_env import RewardModelWrapper
from lib.atari.envs import AtariVec
from lib.core.table import print_table
from lib.label_ui.oracle import oracle_label_db
from lib.models.reward import (
    RewardModel,
    load_reward_model,
    new_reward_model,
    reward_checkpoint,
    save_reward_checkpoint,
)
from lib.store.segments import list_segments

ROOT = Path(__file__).resolve().parents[1]

BOOK_S_PER_PAIR = 0.45


def record_db(db: Path, n_segments: int, seed: int = 0) -> int:
    """A DB of real SeaQuest segments played with random actions (16 envs)."""
    env = AtariVec("SeaquestNoFrameskip-v4", 16, seed=seed)
    rec = EpisodeRecorderWrapper(env, db, record_prob=0.05, rng=np.random.default_rng(seed))
    rec.reset()
    rng = np.random.default_rng(seed)
    while rec.segments_written < n_segments:
        for _ in range(50):
            rec.step(rng.integers(0, env.n_actions, env.n_envs))
    rec.close()
    return len(list_segments(db))


def train_run(db: Path, out: Path, runs: Path, *extra: str) -> tuple[float, float, str]:
    """03_reward_train.py for one epoch; returns (s per pair per epoch, peak RSS MB, stdout). Both
    figures are the trainer's own report (its "ms/pair" and "peak memory" lines)."""
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", "bench", "-o", str(out), str(db)]
    cmd += ["--epochs", "1", "--runs-dir", str(runs), "--no-progress", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    ms, peak = re.search(r", (\d+) ms/pair", r.stdout), re.search(r"peak memory (\d+) MB", r.stdout)
    if r.returncode != 0 or ms is None or peak is None:
        raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
    return float(ms.group(1)) / 1000, float(peak.group(1)), r.stdout


def time_it(fn, repeat: int = 7) -> float:  # noqa: ANN001
    """Best-of-``repeat`` seconds of ``fn()`` after one warm-up (the machine may be shared)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def inference_rows(tmp: Path) -> list[tuple[str, str, str, str]]:
    rows = []
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (16, 210, 160, 3), dtype=np.uint8)
    actions = rng.integers(0, 18, 16)
    ft, at = torch.from_numpy(frames), torch.from_numpy(actions)
    for downscale, label in ((1, "full 210x160"), (2, "half 105x80")):
        m = RewardModel(18, downscale=downscale).eval()
        path = tmp / f"r{downscale}.pt"
        save_reward_checkpoint(reward_checkpoint([m], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0), path)
        rm = load_reward_model(path)
        lean = time_it(lambda rm=rm: rm.predict(frames, actions))
        rows.append(
            (
                "reward inference",
                f"{lean / 16 * 1000:.3f}",
                "ms/frame",
                f"{label}, batch 16, folded BN, channels-last, inference mode",
            )
        )
        if downscale == 1:
            diff = new_reward_model("diff", 18).eval()
            save_reward_checkpoint(
                reward_checkpoint([diff], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0), tmp / "diff.pt"
            )
            rd = load_reward_model(tmp / "diff.pt")
            nxt = np.roll(frames, 1, axis=0)
            rows.append(
                (
                    "reward inference",
                    f"{time_it(lambda rd=rd, nxt=nxt: rd.predict(frames, actions, nxt)) / 16 * 1000:.3f}",
                    "ms/frame",
                    "--arch diff (grey 84x84 of the frame and the next, pooled), batch 16, incl. the resize",
                )
            )

            def plain(m: RewardModel = m) -> None:
                with torch.no_grad():
                    m(ft, at)

            def book(m: RewardModel = m) -> None:
                with torch.no_grad():
                    for i in range(16):
                        m(ft[i : i + 1], at[i : i + 1])

            rows.append(
                (
                    "reward inference",
                    f"{time_it(plain) / 16 * 1000:.3f}",
                    "ms/frame",
                    f"{label}, batch 16, eval-mode model as trained (no folding)",
                )
            )
            rows.append(
                (
                    "reward inference",
                    f"{time_it(book, 3) / 16 * 1000:.3f}",
                    "ms/frame",
                    f"{label}, batch 1 per env (the book's wrapper)",
                )
            )
    return rows


def wrapper_rows(tmp: Path, steps: int = 300) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, label in (
        ("diff.pt", "--arch diff"),
        ("r1.pt", "full-resolution book"),
        ("r2.pt", "half-resolution book"),
    ):
        path = tmp / name
        res = {}
        for mode in ("plain", "wrapped"):
            env = AtariVec("SeaquestNoFrameskip-v4", 16, seed=0)
            e = RewardModelWrapper(env, path) if mode == "wrapped" else env
            e.reset()
            rng = np.random.default_rng(0)
            acts = rng.integers(0, 18, (steps, 16))
            for a in acts[:20]:
                e.step(a)
            best = float("inf")
            for rep in range(3):
                t0 = time.perf_counter()
                for a in acts[20 + rep * 90 : 20 + (rep + 1) * 90]:
                    e.step(a)
                best = min(best, (time.perf_counter() - t0) / 90)
            res[mode] = best
            env.close()
        rows.append(("vector env step", f"{res['plain'] * 1000:.2f}", "ms/step", "16 SeaQuest envs, no reward model"))
        rows.append(
            (
                "RewardModelWrapper step",
                f"{res['wrapped'] * 1000:.2f}",
                "ms/step",
                f"16 envs, {label} model"
                + (", forward after the env step" if name == "diff.pt" else ", forward overlapped with the env step"),
            )
        )
        rows.append(
            (
                "wrapper extra cost",
                f"{(res['wrapped'] - res['plain']) * 1000:.2f}",
                "ms/step",
                f"{label}, per agent step of 16 envs (A2C-relative speed: bench_a2c)",
            )
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, default=1000, help="oracle labels for the training rows")
    ap.add_argument("--segments", type=int, default=2000, help="segments in the benchmark DB")
    ap.add_argument("--dev", default="cpu", help="device for the training rows")
    args = ap.parse_args()
    rows: list[tuple[str, str, str, str]] = []
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows += inference_rows(tmp)
        rows += wrapper_rows(tmp)
        db = tmp / "db"
        t0 = time.perf_counter()
        n = record_db(db, args.segments)
        print(f"recorded {n} segments in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        summary = oracle_label_db(db, args.labels, seed=0)
        setting = f"{summary.labeled} labels over {n} segments, 1 epoch, {args.dev}, {threads} threads"
        for arch, batch, inp in (
            ("diff", 64, ""),
            ("book", 64, "full"),
            ("book", args.labels, "full"),
        ):
            flags = ["--arch", arch, "--batch", str(batch), "--dev", args.dev] + (["--input", inp] if inp else [])
            s, peak, _ = train_run(db, tmp / "saves", tmp / "runs", *flags)
            what = f"--arch {arch}" + (f" {inp} res" if inp else "")
            rows.append(("reward training", f"{s:.3f}", "s/labeled pair/epoch", f"{what}, --batch {batch}, {setting}"))
            rows.append(
                ("  vs the book's 0.45 s", f"{BOOK_S_PER_PAIR / s:.1f}", "x faster", f"{what}, --batch {batch}")
            )
            rows.append(
                ("reward training peak memory", f"{peak:,.0f}", "MB RSS", f"{what}, --batch {batch}, {setting}")
            )

    print_table("bench_reward (stage 3)", rows)


if __name__ == "__main__":
    main()
