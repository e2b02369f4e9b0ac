#!/usr/bin/env python3
"""Benchmark of stage 1: env stepping and A2C training speed, plain, with a reward model, in bf16
and while recording segments (the segment format itself: bench_segments.py). Prints a table:
figure | value | unit | setting.

    python bench/bench_a2c.py [--steps 30000] [--dev cpu]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from table import print_table  # noqa: E402  (bench/ is on sys.path when run as a script)

from lib.envs import AtariVec  # noqa: E402
from lib.recorder import DEFAULT_RECORD_PROB  # noqa: E402


def env_only(n_envs: int, steps: int) -> float:
    env = AtariVec("SeaquestNoFrameskip-v4", n_envs, seed=0)
    env.reset()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(steps // n_envs):
        env.step(rng.integers(0, env.n_actions, n_envs))
    dt = time.perf_counter() - t0
    env.close()
    return steps / dt


def sync_vector_env(n_envs: int, steps: int) -> float:
    """gymnasium's SyncVectorEnv with the usual Python wrapper stack, for comparison."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)

    def make() -> gym.Env:
        env = gym.make("SeaquestNoFrameskip-v4")
        env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
        return gym.wrappers.FrameStackObservation(env, 4)

    env = gym.vector.SyncVectorEnv([make for _ in range(n_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(steps // n_envs):
        env.step(rng.integers(0, 18, n_envs))
    dt = time.perf_counter() - t0
    env.close()
    return steps / dt


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bfloat16 natively (AVX512-BF16 or AMX); without it torch emulates
    bf16 autocast and a --bf16 run is many times slower (a 40k-step run took over 10 minutes)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def make_reward_model(path: Path, arch: str) -> None:
    """A fresh reward model of ``arch`` for full-resolution frames: its speed does not depend on
    its weights."""
    import torch

    from lib.reward_model import new_reward_model, reward_checkpoint, save_reward_checkpoint

    torch.manual_seed(0)
    model = new_reward_model(arch, 18)
    ck = reward_checkpoint([model], "SeaquestNoFrameskip-v4", "seaquest", None, norm_mean=0.0, norm_std=1.0)
    save_reward_checkpoint(ck, path)


def train_run(
    tmp: Path, name: str, steps: int, dev: str, record_prob: float | None, extra: tuple[str, ...] = ()
) -> tuple[float, float, Path | None]:
    """Run 01_a2c.py as a user would; returns (steps/s, peak RSS MB of that process, db)."""
    db = tmp / f"db-{name}" if record_prob is not None else None
    cmd = [
        sys.executable,
        str(ROOT / "01_a2c.py"),
        "-n",
        name,
        "--save",
        str(tmp / "saves" / name),
        "--runs-dir",
        str(tmp / "runs"),
        "--max-steps",
        str(steps),
        "--test-every",
        "0",
        "--dev",
        dev,
    ]
    if db is not None:
        cmd += ["--db-path", str(db), "--record-prob", str(record_prob)]
    cmd += list(extra)
    code = (
        "import resource, runpy, sys; sys.argv = sys.argv[1:]; "
        "exec('try:\\n runpy.run_path(sys.argv[0], run_name=\"__main__\")\\nexcept SystemExit: pass'); "
        "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    r = subprocess.run([sys.executable, "-c", code, *cmd[1:]], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    # Speed over the steady part: the progress lines report steps/s per 10 s window.
    rates = [float(x.replace(",", "")) for x in re.findall(r"\|\s+([\d,]+) steps/s", r.stdout)]
    total = float(re.search(r"\(([\d,]+) steps/s incl", r.stdout).group(1).replace(",", ""))
    sps = float(np.median(rates[1:])) if len(rates) > 2 else total
    peak = int(re.search(r"PEAK_RSS_KB (\d+)", r.stdout).group(1)) / 1024
    return sps, peak, db


def env_rows(rows: list[tuple[str, str, str, str]]) -> None:
    """The env-only stepping rows: ale-py's vector env as we use it, and gymnasium's for comparison."""
    rows.append(
        (
            "env-only stepping",
            f"{env_only(16, 16_000):,.0f}",
            "agent steps/s",
            "ale_py.AtariVectorEnv, 16 envs, RGB 210x160 + our 84x84 stack",
        )
    )
    rows.append(
        (
            "env-only stepping",
            f"{sync_vector_env(16, 8_000):,.0f}",
            "agent steps/s",
            "gymnasium SyncVectorEnv + AtariPreprocessing, 16 envs (not used)",
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40_000, help="agent steps per training run")
    ap.add_argument("--dev", default="cpu", help="device for the training runs")
    ap.add_argument(
        "--reward-only", action="store_true", help="measure plain A2C and A2C with -r only (each reward model kind)"
    )
    args = ap.parse_args()
    rows: list[tuple[str, str, str, str]] = []

    if not args.reward_only:
        env_rows(rows)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sps, peak, _ = train_run(tmp, "plain", args.steps, args.dev, None)
        rows.append(("A2C training", f"{sps:,.0f}", "agent steps/s", f"16 envs, no recording, {args.dev}"))
        rows.append(("A2C peak memory", f"{peak:,.0f}", "MB RSS", "no recording"))
        plain_sps = sps
        for arch, what in (("diff", "--arch diff (default)"), ("book", "--arch book, full res")):
            make_reward_model(tmp / f"reward-{arch}.pt", arch)
            sps, _, _ = train_run(
                tmp, f"reward-{arch}", args.steps, args.dev, None, ("-r", str(tmp / f"reward-{arch}.pt"))
            )
            rows.append(
                (
                    "A2C training, -r reward model",
                    f"{sps:,.0f}",
                    "agent steps/s",
                    f"{what} reward model, 16 envs, {args.dev}: {sps / plain_sps:.2f}x plain",
                )
            )
        if args.reward_only:
            print_table("bench_a2c (stage 1, -r only)", rows)
            return
        if args.dev != "cpu" or cpu_has_bf16():
            sps, _, _ = train_run(tmp, "bf16", args.steps, args.dev, None, ("--bf16",))
            rows.append(("A2C training", f"{sps:,.0f}", "agent steps/s", f"16 envs, no recording, {args.dev}, --bf16"))
            sps, _, _ = train_run(tmp, "bf16t1", args.steps, args.dev, None, ("--bf16", "--threads", "1"))
            rows.append(
                (
                    "A2C training",
                    f"{sps:,.0f}",
                    "agent steps/s",
                    f"16 envs, no recording, {args.dev}, --bf16 --threads 1",
                )
            )
        else:
            rows.append(
                (
                    "A2C training, --bf16",
                    "skipped",
                    "",
                    "this CPU has no AVX512-BF16/AMX: bf16 is emulated, slow",
                )
            )
        sps, _, db = train_run(tmp, "rec", args.steps, args.dev, DEFAULT_RECORD_PROB)
        rows.append(("A2C training + recording", f"{sps:,.0f}", "agent steps/s", f"p={DEFAULT_RECORD_PROB} (default)"))
        p100 = DEFAULT_RECORD_PROB * 100
        sps, peak, db = train_run(tmp, "rec100", args.steps, args.dev, p100)
        rows.append(("A2C training + recording", f"{sps:,.0f}", "agent steps/s", f"p={p100:g} (100x default)"))
        rows.append(("A2C peak memory", f"{peak:,.0f}", "MB RSS", f"recording at p={p100:g}"))

    print_table("bench_a2c (stage 1)", rows)


if __name__ == "__main__":
    main()
