"""Synchronous data-parallel A2C over ``torch.distributed`` (``torchrun``), as CleanRL's multi-GPU
PPO and RLlib's learners do it: every rank steps its own envs and computes the loss on its own
transitions, the gradients are summed across ranks before each optimiser step, so every rank takes
the same step and the weights never drift apart. gloo on CPU, NCCL on CUDA.

A run started without ``torchrun`` (no ``WORLD_SIZE`` in the environment, or 1) is a world of one:
``Dist()``, every collective a no-op, nothing of ``torch.distributed`` initialised.

How the work is split (see ``lib.a2c``): ``--envs`` is per rank; rank r plays the global envs
r*E .. r*E+E-1 with the seeds a single process of K*E envs would give them (ALE seeds env i with
seed + i), records them under those env indices, and samples their actions from per-env random
streams, so K ranks of E envs take the same first update as one process of K*E envs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lib.errors import UserError
from lib.model import resolve_device


@dataclass
class Dist:
    """Where this process stands in the run: its rank and the world's size, over all machines and
    on this one (``Dist()``: a process on its own)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that evaluates, logs and saves."""
        return self.rank == 0

    def all_sum(self, values: list[float]) -> list[float]:
        """The element-wise sum of ``values`` over all ranks (float64 on the host; one small
        collective, a few hundred microseconds with gloo on one machine)."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        if torch.distributed.get_backend() == "nccl":
            t = t.cuda()
        torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over all ranks, in one flat buffer (one collective)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's weights (and buffers) on every rank: one starting point whatever each loaded."""
        if not self.active:
            return
        for t in list(module.parameters()) + list(module.buffers()):
            torch.distributed.broadcast(t.data, src=0)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init_dist(dev: str) -> tuple[Dist, str]:
    """Join the process group torchrun set up (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT`` in the environment), or a world of one without it. Returns the
    Dist and the device string this rank uses: with ``--dev cuda`` each rank takes the GPU of its
    local rank (``cuda:LOCAL_RANK``)."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return Dist(), dev
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    cuda = dev.startswith("cuda")
    if cuda:
        device = resolve_device(dev)  # one line when this machine has no such GPU
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dev = str(device)
    torch.distributed.init_process_group(backend="nccl" if cuda else "gloo")
    return Dist(rank=rank, world=world, local_rank=local_rank, local_world=local_world), dev


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer (set by torchrun)") from None


class NullWriter:
    """A TensorBoard writer that writes nothing: ranks other than 0 log through it."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add_text(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def env_uniforms(seed: int, env_ids: np.ndarray, t: int) -> np.ndarray:
    """(N,) uniforms in [0, 1), one per env, a pure function of (seed, global env index, step t):
    counter-based (SplitMix64 of the three), so an env's action samples do not depend on how many
    envs share its process, nor on anything drawn before."""
    with np.errstate(over="ignore"):
        x = (
            np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
            ^ np.asarray(env_ids, dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
            ^ np.uint64(t & 0xFFFFFFFFFFFF) * np.uint64(0x94D049BB133111EB)
        )
        for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x = (x ^ (x >> np.uint64(shift))) * np.uint64(mul)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
