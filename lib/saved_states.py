"""Saved SeaQuest emulator states, and lives that start from them (``01_a2c.py --start-states``). A
state is a 4-step segment in a segment DB whose meta holds the emulator's state as hex and what the
screen showed (``experiments.probe`` writes them). It is read with the segment DB's strict reader,
and the state itself by ALE's own C++ reader after a size and hex check. ``SavedStartsVec`` has
``AtariVec``'s interface; a lost life ends, with probability ``share``, in a jump to a saved state:
a new game for the learner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lib.envs import DEFAULT_ENV, STACK, AtariVec, VecStep, grey84, rom_name
from lib.errors import UserError, warn
from lib.segments import SegmentError, list_segments, read_segment

STATE_ENV, SAMPLE_ENV = 0, 1  # env directories of a state DB: saved states, sample frames
MAX_STATE_HEX = 1 << 17  # an ALE state is ~8 KB (16 K hex digits); more is not one
FRAME_SKIP = 4
NOOP_MAX = 30
GAME = "seaquest"


class SingleGame:
    """One SeaQuest emulator stepped as ``AtariVec`` steps it (4 frames an agent step, max of the
    last two, grey 84x84 stack of 4, a lost life starting the stack again), whose state can be saved
    and restored (the emulator, the frame the agent sees and its policy input)."""

    def __init__(self, seed: int) -> None:
        from ale_py import ALEInterface, LoggerMode, roms

        ALEInterface.setLoggerMode(LoggerMode.Error)
        self.ale = ALEInterface()
        self.ale.setInt("random_seed", seed)
        self.ale.setFloat("repeat_action_probability", 0.0)
        self.ale.loadROM(roms.get_rom_path(GAME))
        self.actions = list(self.ale.getMinimalActionSet())
        self.meanings = tuple(a.name for a in self.actions)
        self.rng = np.random.default_rng(seed)
        self.frame = np.zeros((210, 160, 3), dtype=np.uint8)
        self.stack = np.zeros((STACK, 84, 84), dtype=np.uint8)

    def reset(self) -> None:
        """A new game: up to NOOP_MAX no-ops, then FIRE (as ``AtariVec``'s fire reset)."""
        self.ale.reset_game()
        for _ in range(int(self.rng.integers(0, NOOP_MAX + 1))):
            self.ale.act(self.actions[0])
        self.ale.act(self.actions[self.meanings.index("FIRE")])
        self.frame = self.ale.getScreenRGB()
        self.stack[:] = grey84(self.frame[None])[0]

    def step(self, action: int) -> tuple[float, bool, bool]:
        """One agent step: (reward, a life was lost or the game ended, the game ended)."""
        lives, reward, before = self.ale.lives(), 0.0, None
        for k in range(FRAME_SKIP):
            reward += self.ale.act(self.actions[action])
            if k == FRAME_SKIP - 2:
                before = self.ale.getScreenRGB()
        last = self.ale.getScreenRGB()
        self.frame = last if before is None else np.maximum(before, last)
        over = self.ale.game_over()
        lost = over or self.ale.lives() < lives
        g = grey84(self.frame[None])[0]
        if lost:
            self.stack[:] = g
        else:
            self.stack[:-1] = self.stack[1:]
            self.stack[-1] = g
        return float(reward), lost, over

    def save(self) -> tuple[Any, np.ndarray, np.ndarray]:
        return self.ale.cloneState(), self.frame.copy(), self.stack.copy()

    def load(self, state: tuple[Any, np.ndarray, np.ndarray]) -> None:
        self.ale.restoreState(state[0])
        self.frame, self.stack = state[1].copy(), state[2].copy()

    def restore(self, s: SavedState) -> None:
        """Go on from the saved state ``s``: its emulator, its last frame, its frames' policy input;
        one line where ALE cannot restore it (bytes ALE's reader takes can still fail here)."""
        state = restore_state(s.ale)
        try:
            self.ale.restoreState(state)
        except Exception as e:  # ALE's own error, untranslated (a SystemError)
            raise UserError(f"{s.name}: this ale-py cannot restore the saved emulator state ({e})") from None
        self.frame, self.stack = s.frames[-1].copy(), grey84(s.frames)


@dataclass(frozen=True)
class SavedState:
    """One saved emulator state: ``frames`` (4, 210, 160, 3) uint8 the last frames the agent saw,
    ``ale`` the emulator's serialised state, what the screen showed (gauge level, divers aboard, the
    sub's top row), and the finder's ``game`` and ``life`` (lives lost before)."""

    name: str
    frames: np.ndarray
    ale: bytes
    level: int
    divers: int
    row: int
    game: int
    life: int = 0


def _int_meta(meta: dict[str, Any], key: str) -> int:
    v = meta.get(key)
    if type(v) is not int:
        raise SegmentError(f"meta {key!r} is not an integer")
    return v


def _ale_bytes(meta: dict[str, Any]) -> bytes:
    text = meta.get("ale_state")
    if not isinstance(text, str) or not 0 < len(text) <= MAX_STATE_HEX:
        raise SegmentError(f"no emulator state of at most {MAX_STATE_HEX // 2:,} bytes in its meta")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise SegmentError("its emulator state is not hex") from None


def load_states(db: Path, env: int = STATE_ENV) -> list[SavedState]:
    """The saved states (``env`` = STATE_ENV) or samples (SAMPLE_ENV, ``ale`` empty) of ``db``;
    a broken file is skipped with one warning."""
    out = []
    for rel in list_segments(db):
        if not rel.startswith(f"{env:02d}/"):
            continue
        try:
            seg = read_segment(db, rel)
            if seg.frames.shape != (STACK, 210, 160, 3):
                raise SegmentError(f"frames {seg.frames.shape}, not {STACK} SeaQuest frames")
            ale = _ale_bytes(seg.meta) if env == STATE_ENV else b""
            facts = [_int_meta(seg.meta, k) for k in ("level", "divers", "row", "game")]
            facts.append(_int_meta(seg.meta, "life") if env == STATE_ENV else 0)
        except (SegmentError, ValueError) as e:
            warn(f"{db / rel}: skipped ({e})")
            continue
        out.append(SavedState(rel, seg.frames, ale, *facts))
    return out


def restore_state(data: bytes) -> Any:
    """A saved state's bytes as an ``ALEState`` (ALE's own C++ reader), or one line where it cannot read them."""
    from ale_py import ALEState

    try:
        return ALEState(data)
    except Exception as e:  # ALE's reader: a state of another build or a damaged one
        raise UserError(f"a saved emulator state could not be read by this ale-py ({e})") from None


def start_states(path: str | Path, flag: str = "--start-states") -> list[SavedState]:
    """The states of the DB ``path`` lives may start from, each checked to restore; one line where
    there is none."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{flag} {p}: not a directory (a DB of saved states: python -m experiments.probe writes one)")
    states = load_states(p)
    if not states:
        raise UserError(f"{flag} {p} holds no readable saved state")
    game = SingleGame(0)
    for s in states:
        game.restore(s)  # a state this ale-py cannot restore is refused now, not at the first jump
    return states


class SavedStartsVec:
    """N SeaQuest emulators with ``AtariVec``'s interface (``frames``, ``reset``, ``step_async`` /
    ``step_wait`` giving a ``VecStep``), each a ``SingleGame`` stepped in this thread; a life lost
    ends, with probability ``share``, in a jump to a random one of ``states`` (a new game:
    ``game_over`` is set), and so does each reset. ``jumps`` counts them."""

    def __init__(self, n_envs: int, seed: int, states: list[SavedState], share: float) -> None:
        if not states:
            raise UserError("--start-states holds no readable saved state")
        self.env_id, self.game, self.n_envs = DEFAULT_ENV, GAME, n_envs
        self.games = [SingleGame(seed + i) for i in range(n_envs)]
        self.action_meanings = self.games[0].meanings
        self.n_actions = len(self.action_meanings)
        self.obs_shape = self.games[0].stack.shape
        self.states, self.share = states, share
        self.rng = np.random.default_rng([seed, 1])
        self.jumps = 0
        self.frames = np.zeros((n_envs, 210, 160, 3), dtype=np.uint8)
        self.lives = np.zeros(n_envs, dtype=np.int32)

    def _jump(self, g: SingleGame) -> None:
        g.restore(self.states[int(self.rng.integers(len(self.states)))])
        self.jumps += 1

    def _show(self) -> np.ndarray:
        self.frames = np.stack([g.frame for g in self.games])  # a new array each step, as AtariVec hands out
        self.lives = np.array([g.ale.lives() for g in self.games], dtype=np.int32)
        return np.stack([g.stack for g in self.games])

    def reset(self) -> np.ndarray:
        for g in self.games:
            g.reset()
            if self.rng.random() < self.share:
                self._jump(g)
        return self._show()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions).tolist()

    def step(self, actions: np.ndarray) -> VecStep:
        self.step_async(actions)
        return self.step_wait()

    def step_wait(self) -> VecStep:
        n = self.n_envs
        rewards, lost, over = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        final = np.zeros((n, *self.obs_shape), dtype=np.uint8)
        for i, (g, a) in enumerate(zip(self.games, self._actions, strict=True)):
            rewards[i], lost[i], over[i] = g.step(a)
            final[i] = g.stack
            if lost[i] and self.rng.random() < self.share:
                self._jump(g)
                over[i] = True
            elif over[i]:
                g.reset()
        obs = self._show()
        no = np.zeros(n, dtype=bool)
        return VecStep(obs, rewards, rewards.copy(), lost, no, over, final, self.lives.copy())

    def close(self) -> None:
        pass


def vec_env(
    env: str, n_envs: int, seed: int | None = None, starts: tuple[list[SavedState], float] | None = None, **kwargs: Any
) -> AtariVec | SavedStartsVec:
    """Stage 1's vector env: ``AtariVec`` (``kwargs`` its own), or with ``starts`` = (states, share)
    a ``SavedStartsVec`` of SeaQuest."""
    if starts is None:
        return AtariVec(env, n_envs, seed=seed, **kwargs)
    if rom_name(env) != GAME:
        raise UserError(f"--start-states restores SeaQuest states: --env {env} is another game")
    return SavedStartsVec(n_envs, seed or 0, *starts)
