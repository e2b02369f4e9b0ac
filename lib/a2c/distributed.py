"""Synchronous data-parallel A2C over ``torch.distributed`` (``torchrun``): every rank steps its own
envs and computes the loss on its own transitions; the gradients are summed across ranks before each
optimiser step, so the weights never drift apart (gloo on CPU, NCCL on CUDA). Without torchrun a run
is a world of one (``Dist()``, every collective a no-op). Rank r plays the global envs r*E ..
r*E+E-1 with the seeds and action streams one process of K*E envs would give them. Each rank leaves
its machine and process id in the store, so when one dies the others say which (``RankLost``)
instead of ending in a gloo traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lib.core.errors import UserError
from lib.models.policy import resolve_device


@dataclass
class Dist:
    """Where this process stands in the run: its rank and the world's size, over all machines and
    on this one (``Dist()``: a process on its own)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    peers: Peers | None = None  # every rank's process, to tell which one is gone (None: a world of one)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that evaluates, logs and saves."""
        return self.rank == 0

    def all_sum(self, values: list[float]) -> list[float]:
        """The element-wise sum of ``values`` over all ranks (float64 on the host, one small
        collective)."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        if torch.distributed.get_backend() == "nccl":
            t = t.cuda()
        with self._watch():
            torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over all ranks, in one flat buffer (one collective)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        with self._watch():
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
        with self._watch():
            for t in list(module.parameters()) + list(module.buffers()):
                torch.distributed.broadcast(t.data, src=0)

    def barrier(self) -> None:
        if self.active:
            with self._watch():
                torch.distributed.barrier()

    @contextlib.contextmanager
    def _watch(self) -> Iterator[None]:
        """A collective that fails (gloo: "Connection closed by peer") ends in RankLost, which says
        which rank is gone, not in a traceback."""
        try:
            yield
        except RuntimeError as e:  # torch.distributed.DistError is one
            _LOST[0] = True
            raise RankLost(self.rank, self.peers.gone(self.rank) if self.peers else [], e) from None

    def close(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init_dist(dev: str) -> tuple[Dist, str]:
    """Join the process group torchrun or a person set up (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT``), or a world of one without it. Returns the Dist and this rank's
    device string: with ``--dev cuda`` each rank takes ``cuda:LOCAL_RANK``."""
    env = dist_env()
    if env is None:
        return Dist(), dev
    local_rank = env.local_rank
    cuda = dev.startswith("cuda")
    if cuda:
        device = resolve_device(dev)  # one line when this machine has no such GPU
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dev = str(device)
    return join(env, "nccl" if cuda else "gloo"), dev


WAIT_ENV = "RLHF_DIST_WAIT"  # seconds the ranks wait for each other at the start
DEFAULT_WAIT_S = 300.0
HOW = (
    "start the ranks with torchrun --nproc-per-node N 01_a2c.py ..., or give each its WORLD_SIZE, RANK, "
    "LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
)


@dataclass(frozen=True)
class DistEnv:
    """A rank's place in the world, as the environment gives it (torchrun, or set by hand)."""

    rank: int
    world: int
    local_rank: int
    local_world: int


def dist_env() -> DistEnv | None:
    """WORLD_SIZE, RANK, LOCAL_RANK and LOCAL_WORLD_SIZE of the environment, checked: one line for
    what is missing or out of range. None for a world of one (no WORLD_SIZE, or 1)."""
    world = _env_int("WORLD_SIZE", 1)
    if world < 1:
        raise UserError(f"WORLD_SIZE={world} must be at least 1 (the number of ranks)")
    if world == 1:
        return None
    _require(("RANK", "LOCAL_RANK"), f"WORLD_SIZE={world} is set but ")
    env = DistEnv(_env_int("RANK"), world, _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE", world))
    if not 0 <= env.rank < world:
        raise UserError(f"RANK={env.rank} is not in 0..{world - 1} (WORLD_SIZE={world}): each rank takes its own")
    if not 1 <= env.local_world <= world:
        raise UserError(f"LOCAL_WORLD_SIZE={env.local_world} is not in 1..{world} (WORLD_SIZE={world})")
    if not 0 <= env.local_rank < env.local_world:
        raise UserError(f"LOCAL_RANK={env.local_rank} is not in 0..{env.local_world - 1} (the ranks on this machine)")
    return env


def join(env: DistEnv, backend: str) -> Dist:
    """Meet the other ranks at MASTER_ADDR:MASTER_PORT and start the process group, waiting up to
    ``RLHF_DIST_WAIT`` seconds (saying so unless torchrun started the ranks). A timeout or Ctrl-C
    ends the wait in one line."""
    addr, port = _master()
    wait, agent = _wait_s(), os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    where = f"{addr}:{port}"
    fd = _listen(addr, port) if env.rank == 0 and not agent else None  # rank 0 holds the store
    if not agent:
        print(
            f"rank {env.rank} of {env.world}: waiting up to {wait:g} s for the other ranks at {where} "
            f"({WAIT_ENV} sets how long)",
            flush=True,
        )
    deadline = time.monotonic() + wait
    try:
        store = _store(env, addr, port, wait, fd, deadline)
        peers = _meet(store, env, (addr, port), wait, deadline)
        torch.distributed.init_process_group(backend, store=store, rank=env.rank, world_size=env.world)
    except KeyboardInterrupt:
        print(f"\nrank {env.rank}: stopped by Ctrl-C while waiting for the other ranks at {where}", file=sys.stderr)
        raise SystemExit(130) from None
    except RuntimeError as e:  # torch.distributed.DistError: a rank went away while they met
        raise UserError(
            f"rank {env.rank} of {env.world}: the ranks could not meet at {where} ({_first_line(e)})"
        ) from None
    signal.signal(signal.SIGTERM, _on_sigterm)
    return Dist(env.rank, env.world, env.local_rank, env.local_world, peers)


def _master() -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT, checked."""
    _require(("MASTER_ADDR", "MASTER_PORT"), "")
    port = _env_int("MASTER_PORT")
    if not 1 <= port <= 65535:
        raise UserError(f"MASTER_PORT={port} is not a port (1..65535)")
    return os.environ["MASTER_ADDR"], port


def _wait_s() -> float:
    raw = os.environ.get(WAIT_ENV) or str(DEFAULT_WAIT_S)
    try:
        wait = float(raw)
    except ValueError:
        wait = 0.0
    if not 0 < wait < 1e9:
        raise UserError(f"{WAIT_ENV}={raw} must be a number of seconds > 0 (how long the ranks wait for each other)")
    return wait


def _store(env: DistEnv, addr: str, port: int, wait: float, fd: int | None, deadline: float) -> Any:
    """The run's key-value store. Rank 0 of a world set by hand holds it on the socket ``fd``, which
    listens at MASTER_ADDR only (TCPStore alone would listen on every interface); the other ranks,
    and all of them under torchrun, connect once it answers."""
    timeout = timedelta(seconds=wait)
    if fd is not None:
        return torch.distributed.TCPStore(addr, port, env.world, True, timeout, False, master_listen_fd=fd)
    while not _answers(addr, port):  # in Python, not in TCPStore's retries: Ctrl-C works here
        if time.monotonic() >= deadline:
            raise UserError(
                f"rank {env.rank} of {env.world}: nothing answered at {addr}:{port} within {wait:g} s: start rank 0 "
                f"there (RANK=0, the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT), or use torchrun"
            )
        time.sleep(0.2)
    return torch.distributed.TCPStore(addr, port, env.world, False, timeout)


def _listen(addr: str, port: int) -> int:
    """A socket listening at ``addr``:``port``; its file descriptor, which the store takes over."""
    try:
        family, *_, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        sock = socket.create_server(sockaddr, family=family, backlog=128)
    except OSError as e:
        raise UserError(
            f"rank 0 cannot listen at MASTER_ADDR:MASTER_PORT {addr}:{port}: {e.strerror or e} (it must be an "
            f"address of rank 0's machine and a free port)"
        ) from None
    return sock.detach()


def _answers(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=1).close()
    except OSError:
        return False
    return True


def _meet(store: Any, env: DistEnv, at: tuple[str, int], wait: float, deadline: float) -> Peers:
    """Each rank leaves its process id and machine in the store, then waits (Ctrl-C works) until
    every rank has, up to the deadline."""
    keys = torch.distributed.PrefixStore(f"rlhf{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    keys.set(f"rank{env.rank}", f"{os.getpid()} {socket.gethostname()}")
    joined = keys.add("joined", 1)
    while joined < env.world:
        if time.monotonic() >= deadline:
            raise UserError(
                f"rank {env.rank} of {env.world}: only {joined} of {env.world} ranks joined at {at[0]}:{at[1]} within "
                f"{wait:g} s: start every rank (RANK 0..{env.world - 1}) with the same WORLD_SIZE, MASTER_ADDR and "
                f"MASTER_PORT, or use torchrun --nproc-per-node {env.world}"
            )
        time.sleep(0.05)
        if not _answers(*at):  # rank 0 gave up: say so, before a store call logs a C++ stack
            raise UserError(f"rank {env.rank} of {env.world}: rank 0 at {at[0]}:{at[1]} stopped waiting for the ranks")
        joined = keys.add("joined", 0)
    procs = {}
    for k in range(env.world):
        pid, host = keys.get(f"rank{k}").decode().split(" ", 1)
        procs[k] = (host, int(pid))
    return Peers(keys, procs, at)


@dataclass
class Peers:
    """Every rank's machine and process id, left in the store when the ranks met."""

    store: Any  # the run's keys in the store (a PrefixStore)
    procs: dict[int, tuple[str, int]]
    at: tuple[str, int]  # where the store answers

    def gone(self, me: int) -> list[int]:
        """The ranks on this machine whose process is gone, leaving out those that saw the loss
        too (they say so in the store before they end)."""
        up = _answers(*self.at)  # no store call when its host is gone: each would log a C++ stack
        if up:
            with contextlib.suppress(RuntimeError):
                self.store.set(f"lost{me}", "1")
        here = socket.gethostname()
        mine = [(k, pid) for k, (host, pid) in sorted(self.procs.items()) if k != me and host == here]
        give_up = time.monotonic() + 2.0  # a killed process still exits for a moment after its sockets close
        while True:
            out = [k for k, pid in mine if not _alive(pid) and not (up and self._saw_loss(k))]
            if out or time.monotonic() > give_up:
                return out
            time.sleep(0.05)

    def _saw_loss(self, rank: int) -> bool:
        try:
            return bool(self.store.check([f"lost{rank}"]))
        except RuntimeError:  # the store is gone with its rank 0
            return False


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, killed and not yet reaped, does not)."""
    if not Path("/proc/self").is_dir():  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class RankLost(UserError):
    """A collective failed because another rank is gone (killed, crashed, its machine lost).
    ``gone``: the ranks found dead on this machine (empty: it cannot tell which)."""

    def __init__(self, rank: int, gone: list[int], cause: Exception):
        self.rank, self.gone = rank, gone
        who = f"rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}"
        self.what = f"{who} is gone (killed or crashed)" if gone else "another rank stopped answering"
        super().__init__(f"rank {rank}: {self.what} ({_first_line(cause)})")

    def ended(self, step: int, save_dir: str | os.PathLike) -> UserError:
        """The line that ends the run: which rank, where last.pt is and at which step, how to go on."""
        last = Path(save_dir) / "last.pt"
        if self.rank == 0:
            saved = f"{last} saved at step {step:,}"
        elif 0 in self.gone:
            saved = f"rank 0 saved {last} only at its evaluations"
        else:
            saved = f"rank 0 saves {last} (step {step:,})"
        return UserError(f"{self.what}: {saved}; continue with the same command plus --resume")


_LOST = [False]  # a collective failed: this rank is saving last.pt and saying what happened


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM outside the training loop's handler ends the process as by default, except after a
    lost rank: then torchrun's SIGTERM must not cut short saving last.pt and the line that says why."""
    if _LOST[0]:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _require(names: tuple[str, ...], context: str) -> None:
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise UserError(f"{context}{' and '.join(missing)} {verb} not set: {HOW}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:160] if text else type(e).__name__


def _env_int(name: str, default: int = 0) -> int:
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
    """(N,) uniforms in [0, 1), one per env, a pure function of (seed, global env index, step t) by
    SplitMix64, so an env's action samples do not depend on how many envs share its process."""
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
