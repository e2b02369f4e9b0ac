"""Where an agent step's time goes in stage 1, on this machine. Prints a table: figure | value | unit |
setting.

Each part is timed alone, as the training loop calls it, in microseconds per agent step (16 envs:
a vector step is 16 agent steps, an update 128):

- env: ``AtariVec.step`` (ale-py's C++ threads, RGB frames, the 84x84 stack made here);
- acting forward: ``lib.a2c.train.act`` on the 16 envs' stacks;
- learner: ``lib.a2c.train.a2c_loss`` on a batch of 128 transitions, its backward, the gradient clip and
  Adam's step; and for a fine-tune (``--finetune``, the conv layers frozen) the same on the heads
  alone, from the features the acting forward kept, beside the frozen trunk run again on the frames;
- reward model: what ``RewardModelWrapper`` adds to a step (the default ``--arch diff`` model);
- the rest: a real training run's time per step (``01_a2c.py``, ``--max-steps``) less the parts
  above: the Python bookkeeping (n-step returns, statistics, logging) less what overlapped.

Then the compute limit of the book's network: its floating-point operations per agent step (an
acting forward, and a forward and backward in the learner), counted by torch's own
``FlopCounterMode``, against the fp32 (and, where the CPU has it natively, bf16) matrix-multiply
rate measured here: the agent steps per second the learner's arithmetic alone allows.

    python -m bench.bench_step [--steps 20000] [--precision fp32]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.bench_a2c import GAME, cpu_name, make_reward_model, train_run
from lib.a2c.config import ADAM_EPS, BATCH_SIZE, CLIP_GRAD, ENTROPY_BETA, LEARNING_RATE
from lib.a2c.experience import BOOT_NEXT, Transitions
from lib.a2c.run import FUSED_ADAM_DEVICES, autocast, cpu_has_native_bf16
from lib.a2c.train import a2c_loss, act
from lib.atari.envs import AtariVec, default_env_threads
from lib.core.table import Rows, print_table
from lib.models.policy import AtariA2C

ENVS = 16
Row = tuple[str, str, str, str]


def per_call(fn: Callable[[], object], seconds: float = 3.0, warmup: int = 3) -> float:
    """Seconds per call of ``fn``: the median of 5 timed windows of about ``seconds`` / 5 each."""
    for _ in range(warmup):
        fn()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2:
        fn()
        n += 1
    per = max(1, int(n * seconds / 5 / 0.2))
    windows = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(per):
            fn()
        windows.append((time.perf_counter() - t) / per)
    return float(np.median(windows))


def batch_of(obs: np.ndarray, n: int, rng: np.random.Generator) -> Transitions:
    """``n`` transitions of real frames (their values do not change the cost)."""
    pick = rng.integers(0, len(obs), n)
    return Transitions(
        obs=obs[pick],
        actions=rng.integers(0, 18, n).astype(np.int64),
        returns=rng.normal(size=n).astype(np.float32),
        discount=np.full(n, 0.99**5, dtype=np.float32),
        steps=np.full(n, 5, dtype=np.int64),
        boot_mode=np.full(n, BOOT_NEXT, dtype=np.int8),
        boot_obs=obs[pick],
        env=(pick % ENVS).astype(np.int64),
    )


def real_obs(env: AtariVec, steps: int, rng: np.random.Generator) -> np.ndarray:
    """The stacks of ``steps`` vector steps of random play: (steps * envs, 4, 84, 84) uint8."""
    out = [env.reset()]
    for _ in range(steps - 1):
        out.append(env.step(rng.integers(0, env.n_actions, env.n_envs)).obs)
    return np.concatenate(out)


def part_rows(rows: list[Row], bf16: bool, seconds: float) -> dict[str, float]:
    """The env, acting, learner and reward-model parts, microseconds per agent step."""
    from lib.a2c.reward_env import RewardModelWrapper

    dev = torch.device("cpu")
    rng = np.random.default_rng(0)
    env = AtariVec(GAME, ENVS, seed=0)
    obs = real_obs(env, 40, rng)
    acts = rng.integers(0, env.n_actions, ENVS)
    us: dict[str, float] = {"env": per_call(lambda: env.step(acts), seconds) / ENVS * 1e6}
    torch.manual_seed(0)
    net = AtariA2C((4, 84, 84), env.n_actions)
    net.conv.to(memory_format=torch.channels_last)  # as stage 1 runs it on a CPU
    stacks = obs[:ENVS]
    u = rng.random(ENVS)
    us["acting forward"] = per_call(lambda: act(net, stacks, dev, bf16, u), seconds) / ENVS * 1e6
    opt = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE, eps=ADAM_EPS, fused=dev.type in FUSED_ADAM_DEVICES)
    batch = batch_of(obs, BATCH_SIZE, rng)
    boot = np.zeros(BATCH_SIZE, dtype=np.float32)

    def update() -> None:
        opt.zero_grad(set_to_none=False)
        loss, _ = a2c_loss(net, batch, boot, dev, ENTROPY_BETA, bf16)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP_GRAD)
        opt.step()

    us["learner"] = per_call(update, seconds) / BATCH_SIZE * 1e6
    us.update(finetune_learner(net, batch, boot, bf16, seconds))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reward.pt"
        make_reward_model(path, "diff")
        wrapped = RewardModelWrapper(env, str(path), device=dev, verbose=False)
        wrapped.reset()
        with_model = per_call(lambda: wrapped.step(acts), seconds) / ENVS * 1e6
    us["reward model (-r)"] = max(0.0, with_model - us["env"])
    env.close()
    what = "bf16" if bf16 else "fp32"
    for name, v in us.items():
        rows.append((f"per agent step: {name}", f"{v:,.0f}", "µs", f"{what}, {ENVS} envs, timed alone"))
    return us


def finetune_learner(
    net: AtariA2C, batch: Transitions, boot: np.ndarray, bf16: bool, seconds: float
) -> dict[str, float]:
    """A fine-tune's learner step (a copy of ``net`` with its conv layers frozen, Adam over the
    heads), microseconds per agent step: on the features ``act`` kept in batches of ENVS, as
    training runs it, and with the frozen trunk run again on the batch's frames."""
    dev = torch.device("cpu")
    ft = copy.deepcopy(net)
    ft.freeze_conv()
    heads = [p for p in ft.parameters() if p.requires_grad]
    opt = torch.optim.Adam(heads, lr=LEARNING_RATE, eps=ADAM_EPS, fused=dev.type in FUSED_ADAM_DEVICES)
    u = np.zeros(ENVS)
    kept = [act(ft, batch.obs[i : i + ENVS], dev, bf16, u, keep_features=True)[2] for i in range(0, len(batch), ENVS)]
    with_features = dataclasses.replace(batch, features=torch.cat(kept))

    def update(b: Transitions) -> None:
        opt.zero_grad(set_to_none=False)
        loss, _ = a2c_loss(ft, b, boot, dev, ENTROPY_BETA, bf16)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads, CLIP_GRAD)
        opt.step()

    return {
        "learner, --finetune": per_call(lambda: update(with_features), seconds) / len(batch) * 1e6,
        "learner, --finetune, trunk run again": per_call(lambda: update(batch), seconds) / len(batch) * 1e6,
    }


def flops_per_agent_step(bf16: bool) -> tuple[float, float]:
    """(acting forward, learner forward + backward) floating-point operations per agent step."""
    from torch.utils.flop_counter import FlopCounterMode

    net = AtariA2C((4, 84, 84), 18)
    x = torch.zeros((BATCH_SIZE, 4, 84, 84), dtype=torch.uint8)
    with FlopCounterMode(display=False) as fwd, torch.no_grad(), autocast(torch.device("cpu"), bf16):
        net(x)
    with FlopCounterMode(display=False) as both, autocast(torch.device("cpu"), bf16):
        logits, values = net(x)
        (logits.float().sum() + values.float().sum()).backward()
    return fwd.get_total_flops() / BATCH_SIZE, both.get_total_flops() / BATCH_SIZE


def matmul_rate(dtype: torch.dtype, seconds: float) -> float:
    """FLOP/s of a 1024x1024 matrix product on this process's torch threads."""
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    return 2 * 1024**3 / per_call(lambda: a @ b, seconds)


def limit_rows(rows: list[Row], seconds: float) -> None:
    acting, learner = flops_per_agent_step(False)
    per_step = acting + learner
    rows.append(("network FLOPs per agent step", f"{per_step / 1e6:,.1f}", "MFLOP", "acting forward + learner fwd+bwd"))
    precisions = [("fp32", torch.float32)] + ([("bf16", torch.bfloat16)] if cpu_has_native_bf16() else [])
    for what, dtype in precisions:
        rate = matmul_rate(dtype, seconds)
        rows.append(
            (f"{what} matmul rate", f"{rate / 1e9:,.0f}", "GFLOP/s", f"1024x1024, {torch.get_num_threads()} threads")
        )
        rows.append(
            (
                "compute limit",
                f"{rate / per_step:,.0f}",
                "agent steps/s",
                f"{what}: the network's arithmetic alone at the matmul rate (convolutions reach less)",
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000, help="agent steps of the real training run")
    ap.add_argument("--seconds", type=float, default=3.0, help="timing of each part")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="the forward passes' precision")
    args = ap.parse_args()
    bf16 = args.precision == "bf16"
    rows: list[Row] = Rows()
    rows.append(("cores", str(default_env_threads()), "cores", f"this process may use; {cpu_name()}"))
    us = part_rows(rows, bf16, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        sps, _ = train_run(Path(tmp), "step", args.steps, "cpu", None, ("--precision", args.precision))
    total = 1e6 / sps
    parts = us["env"] + us["acting forward"] + us["learner"]
    rows.append(
        ("per agent step: the rest", f"{total - parts:,.0f}", "µs", "training's time less env, acting, learner")
    )
    rows.append(("per agent step: training", f"{total:,.0f}", "µs", f"01_a2c.py, {args.precision}: {sps:,.0f} steps/s"))
    limit_rows(rows, args.seconds)
    print_table(f"bench_step (stage 1), {os.cpu_count()} cores, {args.precision}", rows)


if __name__ == "__main__":
    main()
