"""The segment DB, the contract between the stages: ``<db>/<env:02d>/<step:08d>.dat``, one
zstd-compressed pickle of plain data per clip of consecutive agent steps (``Segment.to_record``),
and ``<db>/db.json`` naming the game. Files are written atomically. A DB may come from a stranger,
so nothing in a file chooses code or memory layout: format 2 unpickles with no global allowed, and
format-1 and the book's legacy files go through ``_Strict``, which rebuilds each array from checked
parts. Sizes are bounded, and only regular files inside the DB named ``NN/SSSSSSSS.dat`` are read;
anything else is a ``SegmentError`` naming the file, which readers skip with a warning."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from lib.core.errors import UserError, warn
from lib.core.files import UnsafeFileError, inside, read_at_most, read_regular

FORMAT_NAME = "rlhf-atari-segment"
FORMAT_VERSION = 2
ZSTD_LEVEL = 3
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# A 50-step SeaQuest segment is ~5 MB decoded, 20-50 KB compressed; these bounds leave room for
# segments 20x longer and refuse files that would exhaust memory.
MAX_FILE_BYTES = 128 << 20
MAX_RAW_BYTES = 128 << 20
MAX_STEPS = 100_000
# The most steps a recorder may put in one segment: 1,000 full SeaQuest frames decode to 101 MB,
# within MAX_RAW_BYTES with room for the pickle. ``max_segment_steps`` gives the bound for other
# frame sizes.
MAX_SEGMENT_STEPS = 1000
MAX_FRAME_SIDE = 1024
MAX_ACTIONS = 256
# NN/SSSSSSSS.dat: ASCII digits only (str.isdigit would accept other scripts' digits).
SEGMENT_NAME = re.compile(r"[0-9]{2,3}/[0-9]{8,12}\.dat")
DB_INFO_FILE = "db.json"
DB_INFO_FORMAT = "rlhf-atari-db"

Warn = Callable[[str], None]


class SegmentError(Exception):
    """A segment file that cannot be read: the message names the file and the reason."""


@dataclass(frozen=True)
class Segment:
    """A clip of consecutive agent steps of one env.

    frames:  (T, H, W, 3) uint8  full-resolution RGB frame the agent acted on at step t
    actions: (T,) int64          action taken at step t
    rewards: (T,) float32        true (unclipped) game reward of step t; None in legacy DBs
    dones:   (T,) bool           step t ended an episode for the learner (life lost or game over)
    game_over: (T,) bool         step t ended the whole game
    lives:   (T,) int32          lives before step t
    """

    frames: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray | None = None
    dones: np.ndarray | None = None
    game_over: np.ndarray | None = None
    lives: np.ndarray | None = None
    env_id: str | None = None
    action_meanings: tuple[str, ...] | None = None
    env_index: int | None = None
    step: int | None = None
    checkpoint: str | None = None
    time: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.frames.ndim != 4 or self.frames.shape[-1] != 3 or self.frames.dtype != np.uint8:
            raise ValueError(f"frames must be (T, H, W, 3) uint8, got {self.frames.shape} {self.frames.dtype}")
        t = len(self.frames)
        for name in ("actions", "rewards", "dones", "game_over", "lives"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (t,):
                raise ValueError(f"{name} must have shape ({t},), got {arr.shape}")

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def true_return(self) -> float:
        """Sum of the true game rewards; raises ValueError for a legacy segment."""
        if self.rewards is None:
            raise ValueError("this segment has no true rewards (legacy DB from the book)")
        return float(self.rewards.sum())

    def to_record(self) -> dict[str, Any]:
        """The plain dict that is pickled (format 2): builtins only, arrays as dtype/shape/bytes."""
        rec: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
        for name, dtype in _ARRAY_FIELDS.items():
            arr = getattr(self, name)
            rec[name] = None if arr is None else _plain_array(arr, dtype)
        rec.update(
            env_id=self.env_id,
            action_meanings=list(self.action_meanings) if self.action_meanings else None,
            env_index=None if self.env_index is None else int(self.env_index),
            step=None if self.step is None else int(self.step),
            checkpoint=self.checkpoint,
            time=None if self.time is None else float(self.time),
            meta=_plain_meta(self.meta),
        )
        return rec


# Each array field and the dtype it is stored in (little-endian, whatever the machine).
_ARRAY_FIELDS = {
    "frames": np.dtype("|u1"),
    "actions": np.dtype("<i8"),
    "rewards": np.dtype("<f4"),
    "dones": np.dtype("|b1"),
    "game_over": np.dtype("|b1"),
    "lives": np.dtype("<i4"),
}
# The only dtypes a file may name: plain numbers. Looked up here, never built from file text.
_PLAIN_DTYPES = {
    d.str: d for d in map(np.dtype, ("|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", "<f8", "|b1"))
}


def _plain_array(arr: np.ndarray, dtype: np.dtype) -> dict[str, Any]:
    a = np.ascontiguousarray(np.asarray(arr).astype(dtype, copy=False))
    # PickleBuffer: the array's bytes go into the pickle as one BYTEARRAY8, without a copy.
    return {"dtype": dtype.str, "shape": list(a.shape), "data": pickle.PickleBuffer(a)}


def _plain_meta(meta: Any) -> dict[str, Any]:
    """Metadata kept from a record: string keys with str / int / float / bool / None values."""
    if not isinstance(meta, dict):
        return {}
    return {
        k: v
        for k, v in list(meta.items())[:64]
        if isinstance(k, str) and (v is None or isinstance(v, str | int | float | bool))
    }


# --- decoding ---------------------------------------------------------------------------------


class _Refuse(pickle.Unpickler):
    """Unpickles plain data only: any global (class or function) at all is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load '{module}.{name}' (a segment holds plain data only)")


class _Record:
    """An inert record of what a format-1 or legacy pickle asked numpy (or the book's class) to
    build: ``kind``, the call's arguments and the state later set on it. Nothing runs."""

    kind: str = ""
    args: tuple[Any, ...] = ()
    state: Any = None

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind, self.args = kind, args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _DtypeRecord(_Record):
    def __init__(self, *args: Any) -> None:
        super().__init__("dtype", args)


class _StepRecord(_Record):
    """The book's ``lib.rlhf.EpisodeStep``: a dataclass (class + instance dict) or a named tuple
    (class + arguments). Pickle's NEWOBJ calls ``__new__`` only, so the arguments are kept there."""

    def __new__(cls, *args: Any) -> _StepRecord:
        self = super().__new__(cls)
        self.kind, self.args = "step", args
        return self

    def __init__(self, *args: Any) -> None:
        pass


_NDARRAY = "numpy.ndarray"  # a plain string: calling it is a TypeError, i.e. a corrupt segment


def _recorder(kind: str) -> Callable[..., _Record]:
    return lambda *args: _Record(kind, args)


def _latin1(s: Any, encoding: Any = "latin1") -> bytes:
    # How protocol-2 pickles spell bytes: _codecs.encode(str, "latin1"). Pure and bounded.
    if not isinstance(s, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("unexpected _codecs.encode call")
    return s.encode("latin-1")


_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric")
_RECORDS = {
    "_reconstruct": _recorder("reconstruct"),
    "_frombuffer": _recorder("frombuffer"),
    "scalar": _recorder("scalar"),
}


class _Strict(pickle.Unpickler):
    """For format-1 and legacy files: the few globals they name become inert records, and our code
    rebuilds each array from a plain dtype, a shape and a payload of the exact length (``_build``).
    Handing numpy's own ``_reconstruct`` or ``ndarray`` to a file is not safe (object arrays over
    raw bytes, negative offsets)."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _NUMPY_CORE and name in _RECORDS:
            return _RECORDS[name]
        if (module, name) == ("numpy", "ndarray"):
            return _NDARRAY
        if (module, name) == ("numpy", "dtype"):
            return _DtypeRecord
        if name == "EpisodeStep" and module.split(".")[-1] == "rlhf":
            return _StepRecord
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        raise pickle.UnpicklingError(f"refusing to load '{module}.{name}' (not allowed in a segment)")


def _unpickle(cls: type[pickle.Unpickler], data: bytes) -> Any:
    return cls(io.BytesIO(data)).load()


def _dtype(spec: Any) -> np.dtype:
    """A plain numeric dtype from its name (format 2) or a numpy dtype record (format 1, legacy)."""
    if isinstance(spec, str) and spec in _PLAIN_DTYPES:
        return _PLAIN_DTYPES[spec]
    if isinstance(spec, _DtypeRecord) and spec.args and isinstance(spec.args[0], str):
        code, state = spec.args[0], spec.state
        order = "|"
        if state is not None:
            # numpy's dtype state: (version, byte order, subarray, names, fields, elsize, alignment, flags)
            if not (isinstance(state, tuple) and len(state) == 8 and state[2:5] == (None, None, None)):
                raise ValueError("a dtype with fields or a sub-array")
            order = state[1]
        if order not in ("<", "|", "="):
            raise ValueError(f"dtype byte order {order!r}")
        for prefix in ("|", "<"):
            if prefix + code in _PLAIN_DTYPES:
                return _PLAIN_DTYPES[prefix + code]
    raise ValueError(f"not a plain numeric dtype: {_describe(spec)}")


def _describe(x: Any) -> str:
    text = repr(x.args[:1]) if isinstance(x, _Record) else repr(x)
    return text[:60]


def _shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, tuple | list) or len(shape) > 4:
        raise ValueError(f"bad shape {_describe(shape)}")
    out = []
    for d in shape:
        if type(d) is not int or not 0 <= d <= MAX_STEPS:
            raise ValueError(f"bad shape {_describe(shape)}")
        out.append(d)
    return tuple(out)


def _build(dtype: np.dtype, shape: Any, data: Any, order: str = "C") -> np.ndarray:
    """The one place arrays are made from file content: exact byte count, our dtype, no offset."""
    shape = _shape(shape)
    if not isinstance(data, bytes | bytearray):
        raise ValueError("array payload is not bytes")
    if order not in ("C", "F"):
        raise ValueError(f"array order {order!r}")
    need = math.prod(shape) * dtype.itemsize
    if len(data) != need:
        raise ValueError(f"array payload has {len(data):,} bytes, its shape {shape} needs {need:,}")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order)


def _array(x: Any) -> np.ndarray | None:
    """An array field of any format: None, a format-2 dict, or a format-1 numpy record."""
    if x is None:
        return None
    if isinstance(x, dict):
        if set(x) != {"dtype", "shape", "data"}:
            raise ValueError("array record needs exactly dtype, shape and data")
        return _build(_dtype(x["dtype"]), x["shape"], x["data"])
    if isinstance(x, _Record) and x.kind == "frombuffer" and len(x.args) == 4:
        data, dtype, shape, order = x.args
        return _build(_dtype(dtype), shape, data, order)
    if isinstance(x, _Record) and x.kind == "reconstruct" and x.args[:1] == (_NDARRAY,):
        st = x.state
        if not (isinstance(st, tuple) and len(st) == 5 and isinstance(st[3], bool)):
            raise ValueError("bad array state")
        _, shape, dtype, fortran, data = st
        if isinstance(data, str):
            data = data.encode("latin-1")  # protocol 0/1 pickles of Python 2 era
        return _build(_dtype(dtype), shape, data, "F" if fortran else "C")
    raise ValueError(f"not an array: {_describe(x)}")


def _scalar(x: Any, kinds: tuple[type, ...]) -> Any:
    """A metadata value: a builtin of ``kinds`` (never bool for int), or a numpy scalar record."""
    if isinstance(x, _Record) and x.kind == "scalar" and len(x.args) == 2:
        x = _build(_dtype(x.args[0]), (), x.args[1]).item()
    if x is None or (isinstance(x, kinds) and not (isinstance(x, bool) and bool not in kinds)):
        return x
    raise ValueError(f"unexpected value {_describe(x)}")


def _text(x: Any, limit: int = 4096) -> str | None:
    x = _scalar(x, (str,))
    if x is not None and len(x) > limit:
        raise ValueError("a text field is too long")
    return x


def _checked(fields: dict[str, Any]) -> Segment:
    """A Segment from decoded parts, every shape, range and type checked."""
    frames = fields["frames"]
    if frames is None or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError("frames must be (T, H, W, 3) uint8")
    t, h, w = frames.shape[:3]
    if not (t >= 1 and 1 <= h <= MAX_FRAME_SIDE and 1 <= w <= MAX_FRAME_SIDE):
        raise ValueError(f"frames of shape {frames.shape}")
    arrays: dict[str, np.ndarray | None] = {"frames": frames}
    for key in ("actions", "rewards", "dones", "game_over", "lives"):
        a = fields.get(key)
        if a is not None and a.shape != (t,):
            raise ValueError(f"{key} has shape {a.shape}, frames {t} steps")
        arrays[key] = a
    if arrays["actions"] is None or arrays["actions"].dtype.kind not in "iub":
        raise ValueError("actions must be integers")
    meanings = fields.get("action_meanings")
    if meanings is not None:
        if not isinstance(meanings, list | tuple) or not 0 < len(meanings) <= MAX_ACTIONS:
            raise ValueError("action_meanings must be a list of names")
        meanings = tuple(_text(m, 64) for m in meanings)
    actions = arrays["actions"].astype(np.int64)
    if len(actions) and not (actions.min() >= 0 and actions.max() < MAX_ACTIONS):
        raise ValueError(f"actions outside 0..{MAX_ACTIONS - 1}")
    rewards = arrays["rewards"]
    if rewards is not None:
        rewards = rewards.astype(np.float32)
        if not np.isfinite(rewards).all():
            raise ValueError("rewards that are not finite numbers")
    lives = arrays["lives"]
    if lives is not None:
        if lives.dtype.kind not in "iu" or (len(lives) and not (lives.min() >= 0 and lives.max() < 1 << 16)):
            raise ValueError("lives must be small non-negative integers")
        lives = lives.astype(np.int32)
    flags = {k: None if arrays[k] is None else arrays[k] != 0 for k in ("dones", "game_over")}
    env_index = _scalar(fields.get("env_index"), (int,))
    step = _scalar(fields.get("step"), (int,))
    when = _scalar(fields.get("time"), (int, float))
    if when is not None and not math.isfinite(when):
        raise ValueError("time is not a finite number")
    return Segment(
        frames=frames,
        actions=actions,
        rewards=rewards,
        dones=flags["dones"],
        game_over=flags["game_over"],
        lives=lives,
        env_id=_text(fields.get("env_id"), 200),
        action_meanings=meanings,
        env_index=env_index,
        step=step,
        checkpoint=_text(fields.get("checkpoint")),
        time=None if when is None else float(when),
        meta=_plain_meta(fields.get("meta")),
    )


def _from_record(rec: Any, version: int) -> Segment:
    if not isinstance(rec, dict) or rec.get("format") != FORMAT_NAME or rec.get("version") != version:
        raise ValueError(f"not a format-{version} segment record")
    fields = {k: v for k, v in rec.items() if isinstance(k, str)}
    for key in _ARRAY_FIELDS:
        fields[key] = _array(rec.get(key))
    return _checked(fields)


def max_segment_steps(frame_shape: tuple[int, ...]) -> int:
    """The most steps of ``frame_shape`` (H, W, 3) uint8 frames a segment may hold so that every
    reader accepts it (its decoded size stays within MAX_RAW_BYTES, with a margin for the rest)."""
    per_step = math.prod(frame_shape) + 64  # the frame, the action, reward, flags and lives
    return max(1, min(MAX_SEGMENT_STEPS, (MAX_RAW_BYTES * 9 // 10) // per_step))


def _from_legacy(obj: Any) -> Segment:
    # The book: a list of EpisodeStep(obs=(210, 160, 3) uint8 array, act=int); no rewards.
    if not isinstance(obj, list) or not 0 < len(obj) <= MAX_STEPS:
        raise ValueError(f"not a segment (unexpected content {type(obj).__name__})")
    frames, actions = [], []
    for s in obj:
        st = s.state if isinstance(s, _StepRecord) else None
        if isinstance(st, tuple) and len(st) == 2 and st[0] is None:  # (None, slots) of a slotted dataclass
            st = st[1]
        if st is None and isinstance(s, _StepRecord) and len(s.args) == 2:  # a named tuple
            st = {"obs": s.args[0], "act": s.args[1]}
        if not isinstance(st, dict) or "obs" not in st or "act" not in st:
            raise ValueError("not a list of the book's EpisodeStep records")
        frames.append(_array(st["obs"]))
        actions.append(_scalar(st["act"], (int,)))
    if any(a is None for a in actions):
        raise ValueError("a step without an action")
    first = frames[0]
    if first is None or any(f is None or f.shape != first.shape or f.dtype != first.dtype for f in frames):
        raise ValueError("steps with different frame shapes")
    # A pickle can reference one frame many times: bound what np.stack would allocate, as the
    # decompressed size bounds a format-2 file.
    if len(frames) * first.nbytes > MAX_RAW_BYTES:
        raise ValueError(
            f"{len(frames):,} steps of {first.nbytes:,}-byte frames decode to more than {MAX_RAW_BYTES:,} bytes"
        )
    fields = {"frames": np.stack(frames), "actions": np.asarray(actions, dtype=np.int64)}
    seg = _checked(fields)
    return Segment(frames=seg.frames, actions=seg.actions, meta={"legacy": True})


def _decompress(data: bytes) -> bytes:
    """zstd, never past MAX_RAW_BYTES. Our files declare their size in the frame header: one call (a
    header that lies is a zstd error). Without a declared size, stream and stop at the bound."""
    size = zstandard.frame_content_size(data)
    if size > MAX_RAW_BYTES:
        raise ValueError(f"declares {size:,} decompressed bytes, more than {MAX_RAW_BYTES:,}")
    if size >= 0:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_RAW_BYTES)
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as r:
        raw = read_at_most(r.read, MAX_RAW_BYTES)
    if raw is None:
        raise ValueError(f"decompresses to more than {MAX_RAW_BYTES:,} bytes")
    return raw


def is_compressed(data: bytes) -> bool:
    """Whether a segment file's bytes are zstd-compressed (our formats 1 and 2); the book's legacy
    segments are raw ~5 MB pickles, which a reader keeping many segments may re-encode."""
    return data[:4] == _ZSTD_MAGIC


def decode_segment(data: bytes, name: str = "<bytes>") -> Segment:
    """Decode a segment file's bytes (format 2, format 1 or the book's legacy pickle); SegmentError
    naming ``name`` for anything else, whatever the bytes are."""
    try:
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"{len(data):,} bytes, more than {MAX_FILE_BYTES:,}")
        if data[:4] == _ZSTD_MAGIC:
            raw = _decompress(data)
            try:
                return _from_record(_unpickle(_Refuse, raw), FORMAT_VERSION)
            except pickle.UnpicklingError as e:
                if "refusing to load" not in str(e):
                    raise
            return _from_record(_unpickle(_Strict, raw), 1)  # format 1: numpy pickled its arrays
        return _from_legacy(_unpickle(_Strict, data))
    except pickle.UnpicklingError as e:
        raise SegmentError(f"{name}: not a valid segment ({e})") from None
    except RecursionError:
        raise SegmentError(f"{name}: corrupt segment (nested too deeply)") from None
    except MemoryError:
        raise SegmentError(f"{name}: corrupt segment (declares a size that does not fit in memory)") from None
    except Exception as e:  # any other error raised by bytes from a file is a corrupt file
        raise SegmentError(f"{name}: corrupt segment ({type(e).__name__}: {str(e)[:200]})") from None


def _read_file(path: str | os.PathLike) -> bytes:
    """A segment file's bytes (a regular file of bounded size); SegmentError naming it otherwise."""
    try:
        return read_regular(path, MAX_FILE_BYTES)
    except UnsafeFileError as e:
        raise SegmentError(str(e)) from None
    except OSError as e:
        raise SegmentError(f"{path}: cannot read ({e.strerror or e})") from None


def load_segment(path: str | os.PathLike) -> Segment:
    """Read one segment file (a regular file of bounded size); SegmentError naming it otherwise.
    Readers of a DB use ``read_segment``, which also keeps to the DB."""
    return decode_segment(_read_file(path), str(path))


def segment_path(db_root: str | os.PathLike, rel: str) -> Path:
    """The file of segment ``rel`` (``NN/SSSSSSSS.dat``) of a DB; SegmentError when the name is
    not a segment name or the file (symlinks resolved) lies outside the DB."""
    if not isinstance(rel, str) or not SEGMENT_NAME.fullmatch(rel):
        raise SegmentError(f"{str(rel)[:80]!r} is not a segment name (NN/SSSSSSSS.dat)")
    path = Path(db_root) / rel
    if not inside(db_root, path):
        raise SegmentError(f"{path}: leads outside the DB {db_root}")
    return path


def read_segment(db_root: str | os.PathLike, rel: str) -> Segment:
    """The one way readers (oracle, page, trainer, play) read a DB's segment: a name that matches
    ``NN/SSSSSSSS.dat``, a regular file inside the DB, bounded size. SegmentError otherwise."""
    return load_segment(segment_path(db_root, rel))


def read_segment_bytes(db_root: str | os.PathLike, rel: str) -> bytes:
    """The raw (still compressed) bytes of a DB's segment, with ``read_segment``'s checks."""
    return _read_file(segment_path(db_root, rel))


MAX_ENV_INDEX = 99  # NN: two digits
MAX_ENV_STEP = 10**8 - 1  # SSSSSSSS: eight digits of the env's step counter


# --- the DB's directory -----------------------------------------------------------------------


@dataclass
class DbListing:
    """What ``scan_db`` found: segment names (sorted), entries it ignored with the reason, and the
    file each name is (``files``: device, inode, whether the name goes through a symlink)."""

    segments: list[str]
    ignored: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[int, int, bool]] = field(default_factory=dict)

    def one_per_file(self) -> None:
        """One name per file: a name that is another's alias inside the DB (a symlink, a hard link,
        a linked env directory) moves to ``ignored``, so no pair compares a file with itself. The
        name that does not go through a symlink is kept, else the first."""
        keep: dict[tuple[int, int], str] = {}
        for rel in self.segments:
            dev, ino, linked = self.files[rel]
            first = keep.setdefault((dev, ino), rel)
            if first != rel and self.files[first][2] and not linked:
                keep[(dev, ino)] = rel
        if len(keep) == len(self.segments):
            return
        out = []
        for rel in self.segments:
            first = keep[self.files[rel][:2]]
            if first == rel:
                out.append(rel)
            else:
                self.ignored[rel] = f"the same file as {first}"
        self.segments = out

    def warning(self, root: str | os.PathLike) -> str | None:
        """One line about the ignored entries (None when there are none)."""
        if not self.ignored:
            return None
        shown = ", ".join(f"{k} ({v})" for k, v in list(self.ignored.items())[:3])
        more = f" and {len(self.ignored) - 3} more" if len(self.ignored) > 3 else ""
        return f"{root}: ignored {len(self.ignored)} entries that are not segments: {shown}{more}"


def scan_db(db_root: str | os.PathLike) -> DbListing:
    """The segments of a DB: regular files named ``NN/SSSSSSSS.dat`` that stay inside it. Other
    names, symlinks leading outside, FIFOs, devices, directories and a second name of one file
    (``DbListing.one_per_file``) go to ``ignored``. Nothing is opened."""
    root = Path(db_root)
    listing = DbListing([])
    if not root.is_dir():
        return listing
    real_root = os.path.realpath(root)
    for d in _env_dirs(root, listing):
        _scan_env_dir(d, real_root, listing)
    listing.one_per_file()
    return listing


def _env_dirs(root: Path, listing: DbListing) -> list[os.DirEntry]:
    """The DB's env directories (``NN``), sorted; a name ``NN`` that cannot be looked at is in
    ``listing.ignored``."""
    out = []
    for d in sorted(os.scandir(root), key=lambda e: e.name):
        if not re.fullmatch(r"[0-9]{2,3}", d.name):
            continue  # db.json, labels, other files of the DB: not segments, not worth a warning
        try:
            if d.is_dir():
                out.append(d)
        except OSError as e:  # a symlink loop (07 -> 07)
            listing.ignored[d.name] = e.strerror or "unreadable"
    return out


def _scan_env_dir(d: os.DirEntry, real_root: str, listing: DbListing) -> None:
    """``scan_db`` for one env directory: its segments appended to ``listing`` in name order."""
    try:
        entries = sorted(os.scandir(d.path), key=lambda e: e.name)
    except OSError as e:
        listing.ignored[d.name] = e.strerror or "unreadable directory"
        return
    for f in entries:
        rel = f"{d.name}/{f.name}"
        if f.name.startswith("."):
            continue  # a writer's temp file
        if not SEGMENT_NAME.fullmatch(rel):
            listing.ignored[rel.encode("utf-8", "backslashreplace").decode()] = "not named NN/SSSSSSSS.dat"
            continue
        try:
            linked = d.is_symlink() or f.is_symlink()
            if linked and not inside(real_root, f.path):
                listing.ignored[rel] = "symlink leading outside the DB"
                continue
            if not f.is_file():  # follows an inside symlink; FIFOs, devices, dirs are not files
                listing.ignored[rel] = "not a regular file"
                continue
            st = f.stat()  # the file itself (an alias's target): ``DbListing.one_per_file``
        except OSError as e:
            listing.ignored[rel] = e.strerror or "unreadable"
            continue
        listing.segments.append(rel)
        listing.files[rel] = (st.st_dev, st.st_ino, linked)


def segment_env_step(rel: str) -> tuple[int, int]:
    """(env index NN, step counter SSSSSSSS) of a segment name ``NN/SSSSSSSS.dat``."""
    env, step = rel.removesuffix(".dat").split("/")
    return int(env), int(step)


RACY_NS = 2_000_000_000  # a directory changed this close to a scan is listed again next time


class SegmentWatch:
    """A DB's segment names kept current, cheaply, while a recorder adds to it; thread-safe.
    ``refresh`` lists again only the env directories whose mtime changed (a segment is renamed into
    its directory) or that changed within ``RACY_NS`` of the last scan (a rename in the same clock
    tick keeps the time). It never opens a segment and says each ignored entry once. Temp files are
    never listed, so a segment shows once it is whole; aliases inside the DB are left out
    (``DbListing.one_per_file``). A segment ``agent_steps`` finds unreadable is said once and left
    out of ``segments`` (``unreadable``)."""

    def __init__(self, db_root: str | os.PathLike, warn: Warn | None = warn) -> None:
        self.root = Path(db_root)
        self.warn = warn
        self.segments: list[str] = []  # sorted, as ``list_segments``, less ``unreadable``
        self.unreadable: dict[str, str] = {}  # segment -> why, found by ``agent_steps``
        self._dirs: dict[str, tuple[int, bool, DbListing]] = {}  # NN -> (mtime_ns, racy, its listing)
        self._listed: list[str] = []  # every directory's names, one per file
        self._aliases: set[str] = set()  # names left out as another's alias
        self._said: set[str] = set()
        self._why_not_counted: dict[str, str | None] = {}  # segment -> why its counter is no step count
        self._env_steps: dict[str, tuple[list[str], int]] = {}  # NN -> (its names, their step count)
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> list[str]:
        """List again what changed; returns the names that are new since the last call (sorted)."""
        with self._lock:
            listing = DbListing([])
            dirs: dict[str, tuple[int, bool, DbListing]] = {}
            real_root = os.path.realpath(self.root)
            now = time.time_ns()
            try:
                found = _env_dirs(self.root, listing) if self.root.is_dir() else []
            except OSError as e:
                found = []
                listing.ignored[str(self.root)] = e.strerror or "unreadable"
            for d in found:
                try:
                    mtime = d.stat().st_mtime_ns
                except OSError:
                    mtime = -1
                kept = self._dirs.get(d.name)
                if kept is not None and kept[0] == mtime and not kept[1]:
                    dirs[d.name] = kept
                    continue
                one = DbListing([])
                _scan_env_dir(d, real_root, one)
                listing.ignored.update(one.ignored)
                dirs[d.name] = (mtime, mtime < 0 or now - mtime < RACY_NS, one)
            old = set(self.segments)
            if dirs.keys() != self._dirs.keys() or any(dirs[k] is not self._dirs[k] for k in dirs):
                whole = DbListing([rel for name in sorted(dirs) for rel in dirs[name][2].segments])
                for name in dirs:
                    whole.files.update(dirs[name][2].files)
                whole.one_per_file()
                listing.ignored.update(whole.ignored)
                self._listed, self._aliases = whole.segments, set(whole.ignored)
                self._env_steps = {}  # which names count may change with the aliases
            self._dirs = dirs
            self._list()
            fresh = {k: v for k, v in listing.ignored.items() if k not in self._said}
            self._said.update(fresh)
            line = DbListing([], fresh).warning(self.root)
            if line and self.warn is not None:
                self.warn(line)
            return [rel for rel in self.segments if rel not in old]

    def _list(self) -> None:
        self.segments = [rel for rel in self._listed if rel not in self.unreadable] if self.unreadable else self._listed

    def agent_steps(self) -> int:
        """The agent steps the DB's segments tell of: the sum over env directories of the largest
        step counter of a segment that counts (behind by what each env played since its newest
        segment). A segment counts when it reads and records the env index and step its name gives,
        within ``MAX_ENV_INDEX`` and ``MAX_ENV_STEP``: a name alone (a 1-byte
        ``08/999999999999.dat``) moves nothing, so the count never exceeds the steps a recorder
        took. Each directory's names are opened newest first until one counts, each once; what does
        not count is said once."""
        with self._lock:
            total = 0
            for name, (_, _, one) in self._dirs.items():
                rels = one.segments
                kept = self._env_steps.get(name)
                if kept is None or kept[0] is not rels:
                    kept = self._env_steps[name] = (rels, self._newest_counted(rels))
                total += kept[1]
            return total

    def _newest_counted(self, rels: list[str]) -> int:
        """The largest step counter among ``rels`` of a segment that counts (``agent_steps``); 0 when none."""
        for step, rel in sorted(((segment_env_step(r)[1], r) for r in rels if r not in self._aliases), reverse=True):
            if rel not in self._why_not_counted:
                why = self._why_not_counted[rel] = self._not_counted(rel)
                if why is not None and self.warn is not None:
                    self.warn(why)
            if self._why_not_counted[rel] is None:
                return step
        return 0

    def _not_counted(self, rel: str) -> str | None:
        """Why segment ``rel``'s step counter is not a count of agent steps, or None (it counts)."""
        env, step = segment_env_step(rel)
        where = f"{self.root / rel}: not counted toward the agent steps"
        if env > MAX_ENV_INDEX or step > MAX_ENV_STEP:
            return f"{where} (env {env}, step {step:,}: beyond what a recorder reaches, {MAX_ENV_STEP:,} steps per env)"
        try:
            seg = read_segment(self.root, rel)
        except SegmentError as e:
            self.unreadable[rel] = str(e)
            self._list()
            return f"skipped: {e}"
        if seg.env_index != env or seg.step != step or len(seg) > step:
            told = f"env {seg.env_index}, step {seg.step}, {len(seg)} steps"
            return f"{where} (it records {told}: not what its name says)"
        return None


def list_segments(db_root: str | os.PathLike, warn: Warn | None = warn) -> list[str]:
    """All segment names of a DB (``NN/SSSSSSSS.dat``), sorted; what ``scan_db`` ignored is said
    in one warning (``warn=None``: silently)."""
    listing = scan_db(db_root)
    line = listing.warning(db_root)
    if line and warn is not None:
        warn(line)
    return listing.segments


# --- db.json: the DB's game -------------------------------------------------------------------


@dataclass(frozen=True)
class DbInfo:
    """``<db>/db.json``: which game a DB holds (written by its first recording run)."""

    game: str
    env_id: str
    action_meanings: tuple[str, ...]
    version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": DB_INFO_FORMAT,
            "version": self.version,
            "game": self.game,
            "env_id": self.env_id,
            "action_meanings": list(self.action_meanings),
        }


def read_db_info(db_root: str | os.PathLike, warn: Warn | None = warn) -> DbInfo | None:
    """The DB's ``db.json``, or None when it has none (older DBs, the book's) or it is broken
    (then with a warning)."""
    path = Path(db_root) / DB_INFO_FILE
    if not os.path.lexists(path):
        return None
    try:
        if path.is_symlink():
            raise UnsafeFileError("a symlink")
        d = json.loads(read_regular(path, 1 << 16).decode("utf-8"))
        if not isinstance(d, dict):
            raise ValueError("not a DB description")
        meanings = d.get("action_meanings") or []
        version = d.get("version", 0)
        if not (
            type(version) is int
            and 0 <= version < 1000
            and d.get("format") == DB_INFO_FORMAT
            and isinstance(d.get("game"), str)
            and isinstance(d.get("env_id"), str)
            and isinstance(meanings, list)
            and all(isinstance(m, str) for m in meanings)
        ):
            raise ValueError("not a DB description")
        return DbInfo(d["game"], d["env_id"], tuple(meanings), version)
    except (OSError, ValueError, TypeError, AttributeError, OverflowError, RecursionError) as e:
        if warn is not None:
            warn(f"{path}: ignored ({type(e).__name__}: {str(e)[:120]})")
        return None


def db_game(db_root: str | os.PathLike, warn: Warn | None = warn) -> tuple[str, str] | None:
    """(game, env id) of a DB: from ``db.json``, else from the first readable segment that names
    its env, else None (the book's DBs name no game)."""
    from lib.atari.envs import game_of

    info = read_db_info(db_root, warn)
    if info is not None:
        return info.game, info.env_id
    for rel in list_segments(db_root, warn=None)[:20]:
        try:
            env_id = read_segment(db_root, rel).env_id
        except SegmentError:
            continue
        if env_id:
            return game_of(env_id), env_id
    return None


def check_same_game(dbs: list[str | os.PathLike], what: str) -> str | None:
    """UserError naming both games when ``dbs`` hold different games; returns the game (or None)."""
    seen: tuple[str, str, str] | None = None
    for db in dbs:
        g = db_game(db)
        if g is None:
            continue
        if seen is not None and g[0] != seen[0]:
            raise UserError(f"{what} DBs of different games: {seen[2]} holds {seen[1]}, {db} holds {g[1]}")
        seen = seen or (g[0], g[1], str(db))
    return seen[0] if seen else None
