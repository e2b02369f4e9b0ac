"""Saved SeaQuest emulator states, and lives that start from them (``01_a2c.py --start-states``): a
state's bytes checked field for field against a state this emulator saves of SeaQuest before ALE's
own C++ reader sees them (``check_state``: ALE's reader trusts their lengths), one emulator
(``SingleGame``), and ``SavedStartsVec``, with ``AtariVec``'s interface, where a lost life ends,
with probability ``share``, in a jump to a saved state: a new game for the learner. The state DB
they are read from is ``lib.store.states``."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.atari.envs import DEFAULT_ENV, STACK, AtariVec, VecStep, grey84, rom_name
from lib.core.errors import UserError

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
        state = restore_state(s.ale, s.name)
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


# --- the emulator state's layout, checked before ALE's reader sees it -------------------------------

# ALE's reader (src/ale/emucore/Deserializer.cxx) trusts every length it reads: a RAM length of 200
# writes past the RIOT's 128 bytes (the process dies then or later), a string length of 2**31 - 1
# reads that much. So a state's bytes are first walked here as ALE's writer lays them out
# (Serializer.cxx: an int is 4 bytes little-endian, a bool an int of one of two patterns, a string an
# int length and its bytes) and compared with a state this emulator has just saved of SeaQuest: only
# the values may differ, never a name, a length, a field's kind or its place. The values the video
# chip indexes its tables with unmasked must lie where its own writes keep them (a horizontal motion
# of 171 read past its table and crashed the process in a fuzz of single bytes).
BOOL_PATTERNS = (0xFAB1FAB2, 0xBAD1BAD2)  # Serializer's TruePattern, FalsePattern
PARTS = {  # what each part writes after its name, as ale-py 0.12's save() does (src/ale/emucore/)
    "M6502Low": "6i 7b i",  # the CPU: registers, status flags, execution status
    "M6502High": "6i 7b 3i",
    "M6532": "n 4i b 2i",  # the RIOT: RAM, timer, ports
    # the video chip: clocks, registers, graphics, enables, motions, delays, collisions, positions...
    "TIA": "19i 2b 5i 4b 5m 5b i 5p 3i 2b i b i",
    "TIASound": "7i",
    "Cartridge4K": "",  # SeaQuest's 4 KB cartridge: no bank to remember
}
# The kinds of field in PARTS: "i" an int, "b" a bool, "k" an int every SeaQuest state holds alike
# (the template's value), "n" a length (the template's) and that many bytes of RAM, one int each, and
# ints kept in a range: a byte, a horizontal motion (TIA::poke keeps ``value >> 4``), a position on
# the 160 pixels of a line (every move wraps it).
RANGES = {"u": (0, 255), "m": (0, 15), "p": (0, 159)}
N_PARTS = 5  # the CPU, then the console's devices: the RIOT, the TIA (then its sound), the cartridge
# How libstdc++ writes a std::mt19937 (the System's and ALE's random generators): 624 words, each
# followed by a space, then the index of the next one.
MT_TEXT = re.compile(rb"(?:(?:0|[1-9][0-9]{0,9}) ){624}(0|[1-9][0-9]{0,2})")
MAX_MT_TEXT = 624 * 11 + 3


class _Walk:
    """ALE's serialised fields read off ``data`` in order into ``layout``: what each one is, less its
    value (a name and a length are kept whole). ValueError where a field does not fit, or (with
    ``expect``, a layout) where it is not what ``expect`` has in its place."""

    def __init__(self, data: bytes, layout: list[str], expect: tuple[str, ...] | None) -> None:
        self.data, self.at, self.layout, self.expect = data, 0, layout, expect

    def note(self, field: str) -> None:
        i = len(self.layout)
        if self.expect is not None and self.expect[i : i + 1] != (field,):
            want = self.expect[i] if i < len(self.expect) else "nothing"
            raise ValueError(f"field {i + 1} is {field} where this ale-py writes {want}")
        self.layout.append(field)

    def int(self) -> int:
        if self.at + 4 > len(self.data):
            raise ValueError(f"it ends inside a field at byte {self.at:,} of {len(self.data):,}")
        self.at += 4
        return int.from_bytes(self.data[self.at - 4 : self.at], "little")

    def bool(self, part: str) -> bool:
        v = self.int()
        if v not in BOOL_PATTERNS:
            raise ValueError(f"{part}: a bool of {v:#x} at byte {self.at - 4:,}")
        self.note(f"{part} bool")
        return v == BOOL_PATTERNS[0]

    def string(self, most: int) -> bytes:
        at, n = self.at, self.int()
        if n > len(self.data) - self.at:
            raise ValueError(f"a string of {n:,} bytes at byte {at:,}: past its end")
        if n > most:
            raise ValueError(f"a string of {n:,} bytes at byte {at:,}, where {most:,} at most can be")
        self.at += n
        return self.data[self.at - n : self.at]

    def name(self) -> str:
        name = self.string(64).decode("latin-1")
        self.note(f"name {name!r}")
        return name

    def mt_text(self, part: str) -> None:
        text = self.string(MAX_MT_TEXT)
        m = MT_TEXT.fullmatch(text)
        if not m or int(m[1]) > 624 or any(int(w) >= 1 << 32 for w in text.split()):
            raise ValueError(f"{part}: its random generator's state is not 625 numbers")
        self.note(f"{part} random generator")

    def fields(self, spec: str, part: str) -> None:
        for count, kind in re.findall(r"(\d*)([ibknump])", spec):
            for _ in range(int(count or 1)):
                if kind == "b":
                    self.bool(part)
                    continue
                v = self.int()
                if kind == "k":
                    self.note(f"{part} value {v:,}")
                elif kind == "n":
                    self.note(f"{part} length {v:,}")
                    self.fields(f"{v}u", part)  # one too many ends inside a field: never a long loop
                elif kind in RANGES and not RANGES[kind][0] <= v <= RANGES[kind][1]:
                    lo, hi = RANGES[kind]
                    raise ValueError(f"{part}: {v:,} at byte {self.at - 4:,}, where ALE keeps {lo}..{hi}")
                else:
                    self.note(f"{part} int")

    def end(self) -> None:
        if self.at != len(self.data):
            raise ValueError(f"{len(self.data) - self.at:,} bytes after its last field")


def state_layout(data: bytes, expect: tuple[str, ...] | None = None) -> list[str]:
    """What each field of a serialised SeaQuest ``ALEState`` is, in order (``_Walk``), read as ale-py
    writes one (``ALEState::serialize`` around ``ALEState::save``, src/ale/environment/ale_state.cpp);
    ValueError where the bytes do not fit that, or differ from the layout ``expect``."""
    layout: list[str] = []
    outer = _Walk(data, layout, expect)
    outer.fields("2k 2i 2k", "ALEState")  # the paddles, the frame numbers, mode and difficulty
    inner = _Walk(outer.string(len(data)), layout, expect)  # the emulator's own state
    inner.name()  # the ROM's md5
    if inner.name() != "System":
        raise ValueError("no System part where the emulator's state begins")
    inner.fields("i", "System")  # its cycles
    inner.mt_text("System")
    for _ in range(N_PARTS):
        part = inner.name()
        if part not in PARTS:
            raise ValueError(f"an unknown part {part!r}")
        inner.fields(PARTS[part], part)
    inner.fields("2i b i", "SeaQuest")  # its settings (games/supported/Seaquest.cpp): reward, score, over, lives
    if inner.bool("ALE"):  # ALE's own random generator follows
        inner.mt_text("ALE")
    inner.end()
    outer.fields("2k", "ALEState")  # the paddles' range
    outer.end()
    if expect is not None and len(layout) != len(expect):
        raise ValueError(f"{len(layout)} fields where this ale-py writes {len(expect)}")
    return layout


@functools.cache
def seaquest_layout() -> tuple[str, ...]:
    """The layout (``state_layout``) of a SeaQuest state this ale-py has just saved; UserError where
    it is not one this module can walk (another ale-py's writer: no saved state can be checked)."""
    import ale_py

    try:
        return tuple(state_layout(SingleGame(0).ale.cloneState().serialize()))
    except ValueError as e:
        raise UserError(
            f"ale-py {ale_py.__version__} lays out SeaQuest states otherwise than lib/atari/saved_states.py "
            f"knows ({e}): no saved state can be checked before ALE reads it"
        ) from None


def check_state(data: bytes) -> None:
    """ValueError saying where ``data`` is not laid out as this ale-py lays out a SeaQuest state
    (``seaquest_layout``): every name, length and field kind, all but the values."""
    state_layout(data, seaquest_layout())


def restore_state(data: bytes, name: str = "a saved state") -> Any:
    """A saved state's bytes as an ``ALEState`` (ALE's own C++ reader), once ``check_state`` has
    found them laid out as this ale-py lays out a SeaQuest state; one line naming ``name`` where
    they are not or ALE cannot read them."""
    from ale_py import ALEState

    try:
        check_state(data)
    except ValueError as e:
        raise UserError(f"{name}: its emulator state is not one this ale-py saves of SeaQuest ({e})") from None
    try:
        return ALEState(data)
    except Exception as e:  # ALE's reader: a state of another build or a damaged one
        raise UserError(f"{name}: its emulator state could not be read by this ale-py ({e})") from None


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
