"""Benchmark of stage 1: A2C training speed against the machine's ceiling. Prints a table:
figure | value | unit | setting.

The ceiling is ale-py's vector env alone, with the grey 84x84 4-stack made in C++ and the same
envs and threads as training: no learner, no Python per env. Every training row is also given as a
share of it. Rows: the machine (cores this process may use, CPU), the ceiling, our env alone (RGB
out, the 84x84 stack made here), gymnasium's SyncVectorEnv for comparison, training plain / with a
reward model (-r) / in fp32 where the default runs bf16 / recording, torchrun with 2 ranks, --dev
cuda rows when a GPU is there, and with --book DIR the book's own chapter 19 01_a2c.py (sync, its
default) alternating with ours (fp32 and --precision auto) on the same machine, --book-repeats
rounds (the segment format itself: bench_segments.py).

    python -m bench.bench_a2c [--steps 40000] [--dev cpu] [--book PATH/TO/Chapter19]
    python -m bench.bench_a2c --book PATH/TO/Chapter19 --book-only --book-seconds 120
    python -m bench.bench_a2c --finetune-only --steps 20000    # a fine-tune with and without each of its settings
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.dbs import make_state_db
from lib.a2c.recorder import DEFAULT_RECORD_PROB
from lib.a2c.run import cpu_has_native_bf16
from lib.atari.envs import AtariVec, default_env_threads
from lib.core.table import Rows, print_table

ROOT = Path(__file__).resolve().parents[1]

GAME = "SeaquestNoFrameskip-v4"
Row = tuple[str, str, str, str]


def ceiling(n_envs: int, steps: int, threads: int) -> float:
    """ale-py's AtariVectorEnv alone, grey 84x84 4-stack in C++, random actions: agent steps/s."""
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv(
        "seaquest",
        n_envs,
        num_threads=min(threads, n_envs),
        autoreset_mode="SameStep",
        noop_max=30,
        life_loss_info=True,
        reward_clipping=False,
        repeat_action_probability=0.0,
    )
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n = env.single_action_space.n
    env.step(rng.integers(0, n, n_envs))
    t0 = time.perf_counter()
    for _ in range(steps // n_envs):
        env.step(rng.integers(0, n, n_envs))
    dt = time.perf_counter() - t0
    env.close()
    return steps / dt


def env_only(n_envs: int, steps: int, threads: int) -> float:
    """Our AtariVec: full-resolution RGB out, the policy's 84x84 stack made in one batched call."""
    env = AtariVec(GAME, n_envs, seed=0, num_threads=threads)
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
        env = gym.make(GAME)
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


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def make_reward_model(path: Path, arch: str) -> None:
    """A fresh reward model of ``arch`` for full-resolution frames: its speed does not depend on
    its weights."""
    import torch

    from lib.models.reward import new_reward_model, reward_checkpoint, save_reward_checkpoint

    torch.manual_seed(0)
    model = new_reward_model(arch, 18)
    ck = reward_checkpoint([model], GAME, "seaquest", None, norm_mean=0.0, norm_std=1.0)
    save_reward_checkpoint(ck, path)


PEAK = (
    "import resource, runpy, sys; sys.argv = sys.argv[1:]; "
    "exec('try:\\n runpy.run_path(sys.argv[0], run_name=\"__main__\")\\nexcept SystemExit: pass'); "
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


def train_run(
    tmp: Path,
    name: str,
    steps: int,
    dev: str,
    record_prob: float | None = None,
    extra: tuple[str, ...] = (),
    ranks: int = 1,
) -> tuple[float, float]:
    """Run 01_a2c.py as a user would (with ``ranks`` > 1 under torchrun); returns (steps/s over
    the steady part, peak RSS MB of the process, or of rank 0)."""
    args = [
        str(ROOT / "01_a2c.py"),
        *("-n", name, "--save", str(tmp / "saves" / name), "--runs-dir", str(tmp / "runs")),
        *("--max-steps", str(steps), "--test-every", "0", "--dev", dev),
    ]
    if record_prob is not None:
        args += ["--db-path", str(tmp / f"db-{name}"), "--record-prob", str(record_prob)]
    args += list(extra)
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        cmd = [*launcher, *args]
    else:
        cmd = [sys.executable, "-c", PEAK, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    # Speed over the steady part: the progress lines report steps/s per 10 s window.
    rates = [float(x.replace(",", "")) for x in re.findall(r"\|\s+([\d,]+) steps/s", r.stdout)]
    total = float(re.search(r"\(([\d,]+) steps/s incl", r.stdout).group(1).replace(",", ""))
    sps = float(np.median(rates[1:])) if len(rates) > 2 else total
    peak = re.search(r"PEAK_RSS_KB (\d+)", r.stdout)
    return sps, (int(peak.group(1)) / 1024 if peak else float("nan"))


def book_run(book: Path, seconds: float) -> float:
    """The book's chapter 19 ``01_a2c.py`` (sync, its default) for ``seconds``:
    agent steps/s, the median of the speeds it prints between finished games after the first
    quarter of the run. Its evaluation (10 games at batch 1 every 12,800 steps) is not counted:
    the windows that hold one are the slow outliers the median leaves out."""
    boot = (
        "import sys, runpy, ale_py, gymnasium; gymnasium.register_envs(ale_py); "
        "sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-u", "-c", boot, str(book), str(book / "01_a2c.py"), "-n", "bench"]
        out = Path(tmp) / "out.txt"
        with out.open("w") as f:
            proc = subprocess.Popen(cmd, cwd=tmp, stdout=f, stderr=subprocess.STDOUT)
            time.sleep(seconds)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        text = out.read_text()
    speeds = [float(x) for x in re.findall(r"speed ([\d.]+) f/s", text)]
    if len(speeds) < 4:
        raise RuntimeError(f"the book's 01_a2c.py printed {len(speeds)} speeds in {seconds:.0f} s:\n{text[-2000:]}")
    return float(np.median(speeds[len(speeds) // 4 :]))


def share(sps: float, ceil: float) -> str:
    return f"{100 * sps / ceil:.0f}% of the ceiling"


def speed(rows: list[Row], figure: str, sps: float, setting: str) -> None:
    rows.append((figure, f"{sps:,.0f}", "agent steps/s", setting))


def machine_rows(rows: list[Row], threads: int, envs: int, steps: int) -> float:
    """The machine, the ceiling and the env rows; returns the ceiling for ``envs`` envs."""
    rows.append(("cores", str(default_env_threads()), "cores", f"this process may use; {cpu_name()}"))
    ceil = ceiling(envs, steps, threads)
    speed(rows, "ceiling: ALE alone", ceil, f"{envs} envs, {threads} threads, 84x84x4 in C++")
    sps = env_only(envs, steps, threads)
    speed(rows, "env-only stepping", sps, f"AtariVec: RGB 210x160 + our 84x84 stack; {share(sps, ceil)}")
    sps = sync_vector_env(envs, steps // 2)
    speed(rows, "env-only stepping", sps, f"gymnasium SyncVectorEnv + AtariPreprocessing, {envs} envs (not used)")
    return ceil


def training_rows(rows: list[Row], tmp: Path, args: argparse.Namespace, ceil: float) -> float:
    """Plain (the default precision), -r with each reward model kind, fp32 where the default is bf16,
    and recording; returns the plain speed."""
    dev, steps = args.dev, args.steps
    auto = "bf16" if dev != "cpu" or cpu_has_native_bf16() else "fp32"  # what --precision auto runs here
    plain, peak = train_run(tmp, "plain", steps, dev)
    speed(rows, "A2C training", plain, f"16 envs, no recording, {dev}, --precision auto ({auto}); {share(plain, ceil)}")
    rows.append(("A2C peak memory", f"{peak:,.0f}", "MB RSS", "no recording"))
    for arch, what in (("diff", "--arch diff (default)"), ("book", "--arch book, full res")):
        make_reward_model(tmp / f"reward-{arch}.pt", arch)
        sps, _ = train_run(tmp, f"reward-{arch}", steps, dev, None, ("-r", str(tmp / f"reward-{arch}.pt")))
        setting = f"{what} reward model, 16 envs, {dev}: {sps / plain:.2f}x plain; {share(sps, ceil)}"
        speed(rows, "A2C training, -r reward model", sps, setting)
    if args.reward_only:
        return plain
    if auto == "bf16":
        sps, _ = train_run(tmp, "fp32", steps, dev, None, ("--precision", "fp32"))
        setting = f"16 envs, no recording, {dev}, --precision fp32: {plain / sps:.2f}x it at auto; {share(sps, ceil)}"
        speed(rows, "A2C training", sps, setting)
    else:
        rows.append(("A2C training, --precision bf16", "skipped", "", "no AVX512-BF16/AMX: auto is fp32 here"))
    sps, _ = train_run(tmp, "rec", steps, dev, DEFAULT_RECORD_PROB)
    speed(rows, "A2C training + recording", sps, f"p={DEFAULT_RECORD_PROB} (default); {share(sps, ceil)}")
    p100 = DEFAULT_RECORD_PROB * 100
    sps, peak = train_run(tmp, "rec100", steps, dev, p100)
    speed(rows, "A2C training + recording", sps, f"p={p100:g} (100x default)")
    rows.append(("A2C peak memory", f"{peak:,.0f}", "MB RSS", f"recording at p={p100:g}"))
    return plain


def make_policy(path: Path) -> None:
    """A fresh policy checkpoint to fine-tune from (-m): its speed does not depend on its weights."""
    import torch

    from lib.atari.envs import POLICY_FRAME, STACK
    from lib.models.policy import AtariA2C, policy_checkpoint

    torch.manual_seed(0)
    net = AtariA2C((STACK, POLICY_FRAME, POLICY_FRAME), 18)
    torch.save(policy_checkpoint(net, GAME, "seaquest", tuple(f"A{i}" for i in range(18))), path)


PLAIN_ARM = "plain A2C"  # no -m: training from scratch, the speed every fine-tune is also given against
FINETUNE_ARMS = {  # name: the flags beside -m --finetune; the arm each is compared with
    PLAIN_ARM: ((), None),
    "": ((), None),
    "--kl 0.1": (("--kl", "0.1"), ""),
    "--start-states": (("--start-states", "{states}"), ""),
    "-r": (("-r", "{reward}"), None),
    "-r --kl-target 0.1": (("-r", "{reward}", "--kl-target", "0.1"), "-r"),
    "-r --reward-norm window --reward-clip sign": (
        ("-r", "{reward}", "--reward-norm", "window", "--reward-clip", "sign"),
        "-r",
    ),
    "-r --kl-target 0.1 --start-states": (
        ("-r", "{reward}", "--kl-target", "0.1", "--start-states", "{states}"),
        "-r --kl-target 0.1",
    ),
}


def finetune_rows(rows: list[Row], tmp: Path, args: argparse.Namespace, ceil: float, repeats: int = 2) -> None:
    """A fine-tune (-m --finetune) plain, with --kl 0.1 (the start policy's head, one more small
    linear forward per batch) and with lives from saved states (``SavedStartsVec``: the emulators
    stepped in Python, one thread), and on a learned reward (-r, --arch diff: --kl 1 by default)
    plain, with --kl-target 0.1, with the book's window-and-sign path and with --kl-target 0.1 and
    lives from saved states (the refill ladder's learner), beside plain A2C from scratch: run
    alternately ``repeats`` times each; the median of each, its ratio to the arm it adds to and to
    plain A2C."""
    policy = tmp / "v0.pt"
    make_policy(policy)
    make_reward_model(tmp / "reward-diff.pt", "diff")
    make_state_db(tmp / "states")
    fill = {"reward": str(tmp / "reward-diff.pt"), "states": str(tmp / "states")}
    runs: dict[str, list[float]] = {name: [] for name in FINETUNE_ARMS}
    for r in range(repeats):
        for k, (name, (flags, _)) in enumerate(FINETUNE_ARMS.items()):
            start = () if name == PLAIN_ARM else ("-m", str(policy), "--finetune")
            extra = (*start, *(f.format(**fill) for f in flags))
            runs[name].append(train_run(tmp, f"ft{r}-{k}", args.steps, args.dev, None, extra)[0])
    median = {name: float(np.median(v)) for name, v in runs.items()}
    for name, (_, against) in FINETUNE_ARMS.items():
        if name == PLAIN_ARM:
            speed(rows, "A2C training", median[name], f"plain, 16 envs, {args.dev}, median of {repeats}")
            continue
        setting = f"-m --finetune {name}".rstrip() + f", 16 envs, {args.dev}, median of {repeats}"
        if against is not None:
            setting += f": {median[name] / median[against]:.2f}x {('-m --finetune ' + against).rstrip()}"
        setting += f", {median[name] / median[PLAIN_ARM]:.2f}x plain A2C"
        speed(rows, "A2C fine-tune", median[name], f"{setting}; {share(median[name], ceil)}")


def scale_rows(rows: list[Row], tmp: Path, args: argparse.Namespace, plain: float, threads: int) -> None:
    """torchrun with 2 ranks of 8 envs beside one process of 16, and the GPU rows."""
    sps, _ = train_run(tmp, "ranks2", args.steps, "cpu", None, ("--envs", "8"), ranks=2)
    speed(rows, "A2C training, torchrun", sps, f"2 ranks x 8 envs, gloo, cpu: {sps / plain:.2f}x one process")
    import torch

    if not torch.cuda.is_available():
        rows.append(("A2C training, --dev cuda", "skipped", "", "no CUDA device here"))
        return
    for envs in (16, 64):
        ceil = ceiling(envs, args.steps, threads)
        speed(rows, "ceiling: ALE alone", ceil, f"{envs} envs, {threads} threads")
        sps, _ = train_run(tmp, f"cuda{envs}", args.steps, "cuda", None, ("--envs", str(envs)))
        speed(rows, "A2C training", sps, f"{envs} envs, cuda; {share(sps, ceil)}")
        if envs == 16:
            cuda_plain = sps
    sps, _ = train_run(tmp, "cuda-r", args.steps, "cuda", None, ("-r", str(tmp / "reward-diff.pt")))
    speed(rows, "A2C training, -r reward model", sps, f"--arch diff, 16 envs, cuda: {sps / cuda_plain:.2f}x plain")


def book_rows(rows: list[Row], tmp: Path, args: argparse.Namespace, ceil: float) -> None:
    """The book's script (sync: its default) and ours, plain fp32 and at --precision auto, run
    alternately ``--book-repeats`` times on the same machine; each figure is the median of its runs
    and each pair's ratio is taken within one round (the machine's speed drifts between rounds)."""
    runs: dict[str, list[float]] = {"ours fp32": [], "ours auto": [], "book": []}
    for r in range(args.book_repeats):
        runs["ours fp32"].append(train_run(tmp, f"bk{r}", args.steps, "cpu", None, ("--precision", "fp32"))[0])
        runs["ours auto"].append(train_run(tmp, f"bka{r}", args.steps, "cpu", None, ("--precision", "auto"))[0])
        runs["book"].append(book_run(args.book, args.book_seconds))
        fp32, auto, theirs = (runs[k][-1] for k in ("ours fp32", "ours auto", "book"))
        line = f"  round {r + 1}: ours {fp32 / theirs:.2f}x the book, at --precision auto {auto / theirs:.2f}x"
        print(line, file=sys.stderr)
    n = args.book_repeats
    book = float(np.median(runs["book"]))
    speed(rows, "book A2C training", book, f"the book's ch.19 01_a2c.py, sync, 16 envs, cpu, median of {n}")
    for what in ("fp32", "auto"):
        ours = runs[f"ours {what}"]
        ratio = float(np.median([o / b for o, b in zip(ours, runs["book"], strict=True)]))
        setting = f"ours, --precision {what}, alternating with the book: {ratio:.2f}x it (median of {n} rounds)"
        speed(
            rows,
            "A2C training beside the book",
            float(np.median(ours)),
            f"{setting}; {share(float(np.median(ours)), ceil)}",
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40_000, help="agent steps per training run")
    ap.add_argument("--dev", default="cpu", help="device for the training runs")
    ap.add_argument(
        "--reward-only", action="store_true", help="measure plain A2C and A2C with -r only (each reward model kind)"
    )
    ap.add_argument(
        "--finetune-only",
        action="store_true",
        help="measure a fine-tune (-m --finetune) plain and with each of its settings (--kl 0.1, --start-states, "
        "-r, -r --kl-target 0.1, -r --reward-norm window --reward-clip sign), alternately, twice each",
    )
    ap.add_argument(
        "--book",
        type=Path,
        metavar="DIR",
        help="the book's Chapter19 directory (its 01_a2c.py and lib/): run it side by side (not shipped here)",
    )
    ap.add_argument("--book-seconds", type=float, default=240.0, help="wall time of each run of the book's script")
    ap.add_argument("--book-repeats", type=int, default=2, help="rounds of ours and the book's script, alternating")
    ap.add_argument(
        "--book-only", action="store_true", help="with --book: the machine rows and the alternating rounds alone"
    )
    args = ap.parse_args()
    if args.book_only and args.book is None:
        ap.error("--book-only needs --book DIR")
    if args.book is not None and not (args.book / "01_a2c.py").is_file():
        ap.error(f"--book {args.book}: no 01_a2c.py there (give the book's Chapter19 directory)")
    threads = default_env_threads()
    rows: list[Row] = Rows()
    ceil = machine_rows(rows, threads, 16, 16_000)
    if args.finetune_only:
        with tempfile.TemporaryDirectory() as tmp:
            finetune_rows(rows, Path(tmp), args, ceil)
        print_table(f"bench_a2c (stage 1), {os.cpu_count()} cores, env threads {threads}, fine-tune only", rows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if not args.book_only:
            plain = training_rows(rows, Path(tmp), args, ceil)
            if not args.reward_only:
                scale_rows(rows, Path(tmp), args, plain, threads)
        if args.book is not None:
            book_rows(rows, Path(tmp), args, ceil)
    title = f"bench_a2c (stage 1), {os.cpu_count()} cores, env threads {threads}"
    print_table(title + (", -r only" if args.reward_only else ""), rows)


if __name__ == "__main__":
    main()
