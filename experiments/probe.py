"""The behaviour probe: does a policy go up for air when it has a diver aboard and little oxygen left?

A whole round takes hours before its evaluation games say whether the agent refills; this asks in
minutes. A finder policy (v0) plays SeaQuest in one emulator (``lib.atari.saved_states.SingleGame``,
stepped as stage 1 steps it) on seeds no round plays, and where its gauge is low with a diver aboard
and the sub is deep (``experiments.branch.at_branch_point``) the emulator's state is saved, at most
one state a life. From each saved state every probed policy plays ``--tries`` times with actions
sampled from its own softmax, until the first thing that settles the life:

- **refill**: the gauge rises (the sub surfaced with a diver aboard; ``lib.atari.seaquest.OxygenTracker``);
- **surfaced empty**: the life is lost at the surface with no diver aboard (the surfacing rule);
- **drowned**: the life is lost with the gauge run out;
- **died otherwise**: the life is lost to an enemy;
- **none**: ``--steps`` agent steps passed with none of these (a gauge at 16 of 63 lasts ~128).

It reports the share of each, the rows climbed toward the surface before it (start row minus the
highest row reached) and the gauge when a refill began. Beside it, "can the policy see it": a
ridge regression from the policy's conv features (the 3,136 inputs of its heads) to the gauge level
and to the divers aboard, fitted on the frames of some of the finder's games and scored on the
others (R², and the share of frames whose rounded diver count is right).

States and the sample frames are kept on disk as a segment DB (``--states``): a state is a 4-step
segment (the frames of the policy input's stack) whose meta holds the emulator state as hex; the
samples are 4-step segments too. They are read with the segment DB's strict reader like any DB a
user hands over: no code runs from them, and a broken file is skipped with a warning. The emulator
state itself is parsed by ALE's own C++ reader once ``lib.atari.saved_states`` found it laid out as this
emulator lays out one. The DB is found once, in a directory beside ``--states`` renamed into place
when complete, with ``probe.json`` saying how (the finder, its seed, the counts asked for): a run cut
short leaves nothing a later run would take for a DB, a later run reuses it only with the same
settings, and a ``--states`` holding anything else is refused untouched.

    python -m experiments.probe --states runs/probe/states --policy runs/round/seed0/v0 \\
        --policy runs/round/seed0/surface-100/r1/rlhf/last.pt --features
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.branch import ENV_ID, at_branch_point
from experiments.flags import check_out, given_flags, rows_out_setting
from lib.a2c.train import act
from lib.atari.envs import STACK, grey84
from lib.atari.saved_states import SavedState, SingleGame
from lib.atari.seaquest import OxygenTracker, SurfaceTracker, divers_aboard, oxygen_levels, sub_rows
from lib.core.errors import EXIT_INTERRUPTED, UserError, run_cli
from lib.core.files import atomic_write, read_regular
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, in_range, setting
from lib.core.signals import SignalStop, critical
from lib.models.policy import AtariA2C, load_policy, policy_file
from lib.store.segment_writer import claim_db, save_segment
from lib.store.segments import Segment
from lib.store.states import SAMPLE_ENV, STATE_ENV, load_states

OUTCOMES = ("refill", "surfaced_empty", "drowned", "died_otherwise", "none")
FIND_SEED = 10_000  # the finder's games: seeds no round plays (rounds use 0..N)


# --- saved states -------------------------------------------------------------------------------


def _window(frames: list[np.ndarray]) -> np.ndarray:
    """The last STACK frames, the first repeated where fewer have been seen."""
    last = frames[-STACK:]
    return np.stack([last[0]] * (STACK - len(last)) + last)


def _save(db: Path, env: int, step: int, frames: np.ndarray, meta: dict[str, Any], meanings: tuple[str, ...]) -> None:
    n = len(frames)
    seg = Segment(
        frames=frames,
        actions=np.zeros(n, dtype=np.int64),
        rewards=np.zeros(n, dtype=np.float32),
        dones=np.zeros(n, dtype=bool),
        game_over=np.zeros(n, dtype=bool),
        lives=np.zeros(n, dtype=np.int32),
        env_id=ENV_ID,
        action_meanings=meanings,
        env_index=env,
        step=step,
        time=time.time(),
        meta=meta,
    )
    save_segment(db, seg, fsync=False)


def find_states(
    policy: Path,
    db: Path,
    n_states: int,
    seed: int = FIND_SEED,
    sample_every: int = 8,
    max_games: int = 200,
    at: Callable[[np.ndarray], bool] = at_branch_point,
    max_samples: int = 3000,
) -> tuple[int, int]:
    """Play the finder ``policy`` (actions sampled) until ``n_states`` states are saved into ``db``
    (at most one a life) or ``max_games`` games are over; every ``sample_every`` steps a sample
    (its 4 frames) goes into ``db`` too, ``max_samples`` at most. Returns (states, samples) saved."""
    game = SingleGame(seed)
    net, _ = load_policy(policy, ENV_ID, "seaquest", (STACK, 84, 84), len(game.actions))
    net.eval()
    claim_db(db, ENV_ID, game.meanings)
    rng = np.random.default_rng(seed + 1)
    states = samples = step = lives = games = 0
    started = time.time()
    while games < max_games and states < n_states:
        g, games = games, games + 1
        game.reset()
        seen: list[np.ndarray] = [game.frame.copy()]
        taken, over = False, False  # a state was taken this life
        while not over and states < n_states:
            frame = game.frame
            if not taken and len(seen) >= STACK and at(frame):
                meta = _facts(frame) | {"ale_state": game.ale.cloneState().serialize().hex(), "game": g, "life": lives}
                _save(db, STATE_ENV, step, _window(seen), meta, game.meanings)
                states, taken = states + 1, True
                if states % 5 == 0 or states == n_states:
                    print(
                        f"  {states}/{n_states} states, {g + 1} games, {step:,} steps, {time.time() - started:.0f} s",
                        flush=True,
                    )
            if step % sample_every == 0 and len(seen) >= STACK and samples < max_samples:
                _save(db, SAMPLE_ENV, step, _window(seen), _facts(frame) | {"game": g}, game.meanings)
                samples += 1
            _, lost, over = game.step(_sample(net, game.stack[None], rng)[0])
            step += 1
            seen = [game.frame.copy()] if lost else [*seen[-(STACK - 1) :], game.frame.copy()]
            taken, lives = taken and not lost, lives + lost
    print(
        f"  {states} states in {games} games ({step:,} agent steps, {lives} lives lost), {samples} samples", flush=True
    )
    return states, samples


def _facts(frame: np.ndarray) -> dict[str, int]:
    return {"level": int(oxygen_levels(frame)), "divers": int(divers_aboard(frame)), "row": int(sub_rows(frame))}


# --- the state DB: found once, whole, with how it was found ------------------------------------

FOUND_FILE = "probe.json"  # a state DB's record of how the finder found its states
FOUND_FORMAT = "rlhf-atari-probe-states"
FOUND_WITH = {"find_seed": "--find-seed", "n_states": "--n-states", "max_games": "--max-games"}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_found(db: Path) -> dict[str, Any] | None:
    """The record a finished finder left in ``db`` (FOUND_FILE); None where there is none or it is
    not one."""
    try:
        d = json.loads(read_regular(db / FOUND_FILE, 1 << 16))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("format") == FOUND_FORMAT else None


def find_db(finder: Path, db: Path, a: ProbeSettings, at: Callable[[np.ndarray], bool] | None = None) -> dict[str, Any]:
    """Find the states (``find_states``, ``at`` its test: the branch point by default) into a new
    directory beside ``db``, record how (FOUND_FILE) and rename it to ``db`` once complete: a run cut
    short (Ctrl-C, a full disk) leaves nothing behind that a later run would take for a state DB.
    Returns the record; one line where it cannot be written."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{db.name}.finding-", dir=db.parent))
    except OSError as e:
        raise UserError(f"cannot make --states {db}: {e.strerror or e}") from None
    try:
        n, m = find_states(finder, tmp, a.n_states, a.find_seed, max_games=a.max_games, at=at or at_branch_point)
        if n == 0:
            raise UserError(
                f"the finder {finder} came to no state in {a.max_games} games: give more --max-games or another "
                "--find-with"
            )
        record = {"format": FOUND_FORMAT, "version": 1, "finder": str(finder), "finder_sha256": _sha256(finder)}
        record |= {k: getattr(a, k) for k in FOUND_WITH} | {"states": n, "samples": m, "time": time.time()}
        atomic_write(tmp / FOUND_FILE, json.dumps(record, indent=1).encode())
        with critical():
            os.rename(tmp, db)  # onto nothing or an empty directory only: never over what is there
    except OSError as e:
        raise UserError(f"cannot write the states into {tmp}: {e.strerror or e}; --states {db} is as it was") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # what a run cut short found (renamed away when complete)
    return record


def open_states(a: ProbeSettings, finder: Path, given: set[str] | None = None) -> dict[str, Any]:
    """``--states`` ready to read: found now where it is missing or empty, else the record of a DB
    this probe found with the same settings, of those given on the command line (``given``, field
    names; None: all): a found DB is probed as it is, and a finder setting given that differs is a
    mistake (``--find-with`` compared only when given: the first ``--policy`` changes as policies are
    probed). One line, the directory untouched, for anything else."""
    db = a.states
    if os.path.lexists(db) and not db.is_dir():
        raise UserError(f"--states {db} is a file: give a directory")
    try:
        filled = db.is_dir() and any(db.iterdir())
    except OSError as e:
        raise UserError(f"cannot read --states {db}: {e.strerror or e}") from None
    if not filled:
        print(f"finding {a.n_states} states with {finder} into {db}", flush=True)
        return find_db(finder, db, a)
    found = read_found(db)
    if found is None:
        raise UserError(
            f"--states {db} is not a state DB this probe found (it has no {FOUND_FILE}): give a new or empty "
            "directory, where the probe finds its states"
        )
    mine = {k: getattr(a, k) for k in FOUND_WITH}
    asked = FOUND_WITH if given is None else {k: f for k, f in FOUND_WITH.items() if k in given}
    differ = [f"{f} {found.get(k)} (this run: {mine[k]})" for k, f in asked.items() if found.get(k) != mine[k]]
    if a.find_with is not None and found.get("finder_sha256") != _sha256(finder):
        differ.append(f"--find-with {found.get('finder')} (this run: {finder})")
    if differ:
        raise UserError(
            f"--states {db} holds states found with {', '.join(differ)}: give the same to probe them, "
            "or another --states"
        )
    return found


# --- the rollouts -------------------------------------------------------------------------------


def _sample(net: AtariA2C, stacks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(B, 4, 84, 84) uint8 -> (B,) actions sampled from the policy's softmax (stage 1's ``act``)."""
    return act(net, np.ascontiguousarray(stacks), torch.device("cpu"), False, rng.random(len(stacks)))[0]


@dataclass
class Rollout:
    """How one replay of a state ended (``OUTCOMES``), after how many agent steps, the rows it climbed
    (start row minus the highest row reached), and the gauge where a refill began (-1: none)."""

    outcome: str
    steps: int
    climbed: int
    refill_level: int = -1


class _Watch:
    """Follows one replay with the trackers the evaluation uses, primed on the state's frames."""

    def __init__(self, s: SavedState) -> None:
        self.oxygen, self.surface = OxygenTracker(), SurfaceTracker()
        for f in s.frames[:-1]:  # the last one is the first replay step's frame
            self._feed(f, False)
        self.start, self.top, self.last_level = s.row, s.row, int(oxygen_levels(s.frames[-2]))

    def _feed(self, frame: np.ndarray, lost: bool) -> tuple[int, int]:
        level, row = int(oxygen_levels(frame)), int(sub_rows(frame))
        self.oxygen.step(level, lost)
        self.surface.step(level, row, lost, int(divers_aboard(frame)))
        return level, row

    def step(self, frame: np.ndarray, lost: bool, t: int) -> Rollout | None:
        """``frame``: the one this step's action was chosen on; ``lost``: the step ended the life."""
        refills, drowned = self.oxygen.counts.refills, self.oxygen.counts.oxygen_deaths
        empty = self.surface.counts.surfacing_deaths
        before = self.last_level
        level, row = self._feed(frame, lost)
        if row >= 0:
            self.top = min(self.top, row)
        climbed = max(0, self.start - self.top)
        if self.oxygen.counts.refills > refills:
            return Rollout("refill", t, climbed, before)
        if level >= 0:
            self.last_level = level
        if lost:
            if self.oxygen.counts.oxygen_deaths > drowned:
                return Rollout("drowned", t, climbed)
            if self.surface.counts.surfacing_deaths > empty:
                return Rollout("surfaced_empty", t, climbed)
            return Rollout("died_otherwise", t, climbed)
        return None


def replay(
    net: AtariA2C, states: list[SavedState], tries: int, steps: int, seed: int, batch: int = 64
) -> list[Rollout]:
    """Every state played ``tries`` times by ``net`` (sampled actions), ``batch`` games side by
    side with one forward a step; one ``Rollout`` per (state, try), in that order."""
    jobs = [(s, k) for s in states for k in range(tries)]
    out: list[Rollout] = []
    rng = np.random.default_rng(seed)
    pool = [SingleGame(seed) for _ in range(min(batch, len(jobs)))]
    for lo in range(0, len(jobs), batch):
        part = jobs[lo : lo + batch]
        games, watches = [], []
        for (s, _), g in zip(part, pool, strict=False):
            g.restore(s)
            games.append(g)
            watches.append(_Watch(s))
        ends: list[Rollout | None] = [None] * len(part)
        for t in range(steps):
            live = [i for i, e in enumerate(ends) if e is None]
            if not live:
                break
            acts = _sample(net, np.stack([games[i].stack for i in live]), rng)
            for i, a in zip(live, acts.tolist(), strict=True):
                frame = games[i].frame.copy()
                _, lost, over = games[i].step(a)
                ends[i] = watches[i].step(frame, lost or over, t + 1)
        for i, w in enumerate(watches):
            out.append(ends[i] or Rollout("none", steps, max(0, w.start - w.top)))
    return out


def summarise(rollouts: list[Rollout]) -> dict[str, float]:
    """Shares of each outcome, mean rows climbed, mean steps to the outcome, mean gauge at a refill."""
    n = len(rollouts)
    out: dict[str, float] = {"rollouts": n}
    for o in OUTCOMES:
        out[o] = sum(r.outcome == o for r in rollouts) / n if n else math.nan
    out["climbed"] = float(np.mean([r.climbed for r in rollouts])) if n else math.nan
    out["steps"] = float(np.mean([r.steps for r in rollouts])) if n else math.nan
    levels = [r.refill_level for r in rollouts if r.outcome == "refill"]
    out["refill_level"] = float(np.mean(levels)) if levels else math.nan
    return out


# --- can the policy see it: a linear probe of its features ----------------------------------------


def _ridge(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """Weights (D+1,) of ridge regression of y on standardised-by-caller x, with an unpenalised bias."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    reg = lam * np.eye(xb.shape[1])
    reg[-1, -1] = 0.0
    return np.linalg.solve(xb.T @ xb + reg, xb.T @ y)


def _predict(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x @ w[:-1] + w[-1]


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else math.nan


LAMBDAS = (1e-1, 1.0, 10.0, 100.0, 1000.0, 1e4)


def linear_probe(features: np.ndarray, target: np.ndarray, games: np.ndarray) -> dict[str, float]:
    """Ridge regression of ``target`` (N,) on ``features`` (N, D): fitted on the samples of 3/5 of the
    games, lambda chosen on 1/5, scored on the last 1/5 (games never seen in the fit): held-out R²
    and the share whose rounded prediction equals the target (for a count)."""
    ids = np.unique(games)
    order = np.random.default_rng(0).permutation(ids)
    k = max(1, len(ids) // 5)
    test_g, val_g = set(order[:k].tolist()), set(order[k : 2 * k].tolist())
    test = np.isin(games, list(test_g))
    val = np.isin(games, list(val_g)) & ~test
    fit = ~test & ~val
    if fit.sum() < 10 or test.sum() < 10 or val.sum() < 2:
        return {"r2": math.nan, "exact": math.nan, "test_frames": int(test.sum())}
    mu, sd = features[fit].mean(0), features[fit].std(0) + 1e-6
    z = (features - mu) / sd
    y = target.astype(np.float64)
    best = min(LAMBDAS, key=lambda lam: float(((_predict(z[val], _ridge(z[fit], y[fit], lam)) - y[val]) ** 2).mean()))
    w = _ridge(z[fit | val], y[fit | val], best)
    pred = _predict(z[test], w)
    majority = np.bincount(target[fit | val].astype(np.int64) - target.min()).argmax() + target.min()
    return {
        "r2": _r2(y[test], pred),
        "exact": float(np.mean(np.rint(pred) == y[test])),
        "majority_exact": float(np.mean(y[test] == majority)),  # what always guessing the commonest value gets
        "lambda": best,
        "test_frames": int(test.sum()),
    }


def features_of(net: AtariA2C, samples: list[SavedState], batch: int = 256) -> np.ndarray:
    """(N, D) the conv features of each sample's policy input."""
    out = []
    with torch.no_grad():
        for lo in range(0, len(samples), batch):
            stacks = np.stack([grey84(s.frames) for s in samples[lo : lo + batch]])
            out.append(net.features(torch.from_numpy(stacks)).numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


def see_probe(net: AtariA2C, samples: list[SavedState]) -> dict[str, dict[str, float]]:
    """``linear_probe`` of the gauge level (on samples where the gauge shows) and of divers aboard."""
    fx = features_of(net, samples)
    level = np.array([s.level for s in samples])
    divers = np.array([s.divers for s in samples])
    games = np.array([s.game for s in samples])
    shown = level >= 0
    return {
        "gauge": linear_probe(fx[shown], level[shown], games[shown]),
        "divers": linear_probe(fx, divers, games),
    }


# --- the command ----------------------------------------------------------------------------------


def probe_policy(path: Path, states: list[SavedState], samples: list[SavedState], a: ProbeSettings) -> dict:
    net, _ = load_policy(path, ENV_ID, "seaquest", (STACK, 84, 84), None)
    net.eval()
    t0 = time.time()
    rolls = replay(net, states, a.tries, a.steps, a.seed)
    row: dict[str, Any] = {"policy": str(path), **summarise(rolls), "seconds": time.time() - t0}
    if a.features and samples:
        row["see"] = see_probe(net, samples)
    return row


def print_table(rows: list[dict]) -> None:
    head = "| policy | rollouts | refill | surfaced empty | drowned | died otherwise | none | rows climbed |"
    print(head + " gauge at refill |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        shares = " | ".join(f"{100 * r[o]:.0f}%" for o in OUTCOMES)
        print(f"| {r['policy']} | {r['rollouts']} | {shares} | {r['climbed']:.1f} | {r['refill_level']:.1f} |")
    if any("see" in r for r in rows):
        print("\n| policy | gauge R² (held-out games) | divers R² | divers exact (commonest) | frames |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            if "see" in r:
                g, d = r["see"]["gauge"], r["see"]["divers"]
                print(
                    f"| {r['policy']} | {g['r2']:.3f} | {d['r2']:.3f} | {100 * d['exact']:.1f}% "
                    f"({100 * d.get('majority_exact', math.nan):.1f}%) | {d['test_frames']} |"
                )


GROUPS = {  # --help's groups, in order, and their titles
    "states": "the states and the policies",
    "replays": "the replays",
    "output": "output and speed",
}


@dataclass(frozen=True)
class ProbeSettings:
    """What ``python -m experiments.probe`` is told, one field per flag in ``--help`` order."""

    states: Path = setting(
        help="DB of saved states: found once into a new or empty directory, then reused by runs with the same "
        "--find-seed, --n-states and --max-games",
        group="states",
        type=Path,
    )
    policy: list[Path] = setting(
        help="a policy to probe (a .pt or a run directory: its best); repeat",
        group="states",
        type=Path,
        action="append",
    )
    find_with: Path | None = setting(
        None, "the policy whose play the states come from (default: the first --policy)", group="states", type=Path
    )
    n_states: int = setting(
        60, "states to find when --states holds none", group="states", checks=in_range("--n-states", 1, 10_000)
    )
    max_games: int = setting(200, "finder games at most", group="states", checks=in_range("--max-games", 1, 100_000))
    find_seed: int = setting(
        FIND_SEED,
        f"the finder's first game seed ({FIND_SEED:,}: seeds no round plays); states for 01_a2c.py "
        "--start-states come from other seeds than the held-out states a policy is probed on (20000)",
        group="states",
        checks=in_range("--find-seed", 0, 2**31 - 1000),
    )
    tries: int = setting(
        4, "replays of each state per policy (actions sampled)", group="replays", checks=in_range("--tries", 1, 1000)
    )
    steps: int = setting(
        200,
        "agent steps a replay may last (a low gauge lasts ~128)",
        group="replays",
        checks=in_range("--steps", 1, 10_000),
    )
    seed: int = setting(0, "the replays' action sampling", group="replays", checks=in_range("--seed", 0, 2**31 - 1))
    features: bool = setting(False, "also the linear probe of each policy's conv features", group="replays")
    out: Path | None = rows_out_setting(group="output")
    threads: int = setting(
        1,
        "torch threads (the forwards are small: more only fight other work)",
        group="output",
        checks=in_range("--threads", 1, 256),
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags in groups (``--help``), one per ``ProbeSettings`` field."""
    return settings_parser(
        ProbeSettings,
        "python -m experiments.probe",
        "The behaviour probe: from saved SeaQuest states with a low gauge and a diver aboard, how often "
        "does each policy refill, surface empty, drown or die otherwise (module docstring)",
        GROUPS,
    )


def main(argv: list[str] | None = None) -> None:
    """The probe. Ctrl-C or SIGTERM: one line, then KeyboardInterrupt goes on up (to ``cli``, or to a
    caller such as ``experiments.ladder``)."""
    a = ProbeSettings(**vars(build_parser().parse_args(argv)))
    check_fields(a)
    check_out(a.out)
    torch.set_num_threads(a.threads)
    policies = [policy_file(p) for p in a.policy]
    finder = policy_file(a.find_with) if a.find_with else policies[0]
    with SignalStop(at_once=True) as stop:  # SIGTERM too: the finder's directory is removed all the same
        try:
            found = open_states(a, finder, set(given_flags(build_parser(), argv if argv is not None else sys.argv[1:])))
            states, samples = load_states(a.states), load_states(a.states, SAMPLE_ENV)
            if not states:
                raise UserError(f"{a.states} holds no readable state: remove it to find new ones")
            how = " ".join(f"{flag} {found.get(k)}" for k, flag in FOUND_WITH.items())
            print(
                f"{len(states)} states ({np.mean([s.level for s in states]):.1f} of 63 oxygen, "
                f"{np.mean([s.divers for s in states]):.2f} divers, row {np.mean([s.row for s in states]):.0f} "
                f"on average; found by {found.get('finder')} with {how}), {len(samples)} sample frames",
                flush=True,
            )
            rows = [probe_policy(p, states, samples, a) for p in policies]
        except KeyboardInterrupt:  # a DB the finder had not finished is gone already (find_db)
            kept = "no rows were written" if read_found(a.states) else f"no state was kept in --states {a.states}"
            print(f"interrupted ({stop.signal or 'SIGINT'}): {kept}", file=sys.stderr, flush=True)
            raise
    print()
    print_table(rows)
    if a.out:
        try:
            atomic_write(a.out, json.dumps(rows, indent=1).encode())
        except OSError as e:
            raise UserError(f"cannot write --out {a.out}: {e.strerror or e} (the table above holds the rows)") from None
        print(f"\n{a.out}")


def cli(argv: list[str]) -> int:
    """``python -m experiments.probe``: ``main``, exit 130 after its line where it was interrupted."""
    try:
        main(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    run_cli(lambda: cli(sys.argv[1:]))
