"""The state DB of ``01_a2c.py --start-states``: saved SeaQuest emulator states, each a 4-step
segment whose meta holds the emulator's state as hex and what the screen showed
(``experiments.probe`` writes them). A segment is read with the segment DB's strict reader, its
facts range-checked, and its state's bytes checked field for field (``lib.atari.saved_states``)
before ALE's reader sees them; anything else is skipped with one warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lib.atari.envs import STACK
from lib.atari.saved_states import SavedState, SingleGame, check_state, seaquest_layout
from lib.core.errors import UserError, warn
from lib.store.segments import SegmentError, list_segments, read_segment

STATE_ENV, SAMPLE_ENV = 0, 1  # env directories of a state DB: saved states, sample frames
MAX_STATE_HEX = 1 << 17  # an ALE state is ~8 KB (16 K hex digits); more is not one


def _int_meta(meta: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = meta.get(key)
    if type(v) is not int:
        raise SegmentError(f"meta {key!r} is not an integer")
    if not lo <= v <= hi:
        raise SegmentError(f"meta {key!r} is not in {lo}..{hi:,}")
    return v


def _ale_bytes(meta: dict[str, Any]) -> bytes:
    text = meta.get("ale_state")
    if not isinstance(text, str) or not 0 < len(text) <= MAX_STATE_HEX:
        raise SegmentError(f"no emulator state of at most {MAX_STATE_HEX // 2:,} bytes in its meta")
    try:
        data = bytes.fromhex(text)
    except ValueError:
        raise SegmentError("its emulator state is not hex") from None
    try:
        check_state(data)
    except ValueError as e:
        raise SegmentError(f"its emulator state is not one this ale-py saves of SeaQuest: {e}") from None
    return data


# What the screen and the finder can give (lib.atari.seaquest's readers: -1 where the gauge or the sub is
# not drawn): a fact outside is a damaged or crafted file.
FACTS = {"level": (-1, 63), "divers": (0, 6), "row": (-1, 209), "game": (0, 10**8), "life": (0, 10**9)}


def load_states(db: Path, env: int = STATE_ENV) -> list[SavedState]:
    """The saved states (``env`` = STATE_ENV) or samples (SAMPLE_ENV, ``ale`` empty) of ``db``;
    a broken file, a fact out of its range (``FACTS``) or an emulator state not laid out as this
    ale-py lays out a SeaQuest state (``check_state``) is skipped with one warning."""
    if env == STATE_ENV:
        seaquest_layout()  # an ale-py whose states cannot be checked refuses the DB in one line
    out = []
    for rel in list_segments(db):
        if not rel.startswith(f"{env:02d}/"):
            continue
        try:
            seg = read_segment(db, rel)
            if seg.frames.shape != (STACK, 210, 160, 3):
                raise SegmentError(f"frames {seg.frames.shape}, not {STACK} SeaQuest frames")
            ale = _ale_bytes(seg.meta) if env == STATE_ENV else b""
            facts = [_int_meta(seg.meta, k, *FACTS[k]) for k in ("level", "divers", "row", "game")]
            facts.append(_int_meta(seg.meta, "life", *FACTS["life"]) if env == STATE_ENV else 0)
        except (SegmentError, ValueError) as e:
            warn(f"{db / rel}: skipped ({e})")
            continue
        out.append(SavedState(rel, seg.frames, ale, *facts))
    return out


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
