"""The segment DB: the contract between the stages.

Layout: ``<db>/<env:02d>/<step:08d>.dat``, one file per segment of consecutive agent steps.
A file is a zstd-compressed pickle of a plain dict (numpy arrays and builtins only, see
``Segment.to_record``), written atomically (temp file + rename), so a crash or Ctrl-C never
leaves half a segment behind.

Reading never uses plain ``pickle.loads``: a DB may come from someone else and pickle runs
code. ``load_segment`` goes through ``_SafeUnpickler``, which allows only numpy arrays and
dtypes, a few builtins and the book's legacy ``EpisodeStep`` class. The book's (Lapan, ch. 19)
uncompressed segments -- a list of ``lib.rlhf.EpisodeStep(obs, act)`` -- load too; they carry
no rewards, so ``Segment.rewards`` is ``None`` for them.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import queue
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

FORMAT_NAME = "rlhf-atari-segment"
FORMAT_VERSION = 1
ZSTD_LEVEL = 3
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class SegmentError(Exception):
    """A segment file that cannot be read: the message names the file and the reason."""


@dataclass(frozen=True)
class EpisodeStep:
    """The book's legacy per-step record (``lib.rlhf.EpisodeStep``): obs (H, W, 3) uint8, act."""

    obs: np.ndarray
    act: int


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
            raise ValueError(
                f"frames must be (T, H, W, 3) uint8, got {self.frames.shape} {self.frames.dtype}"
            )
        t = len(self.frames)
        for name in ("actions", "rewards", "dones", "game_over", "lives"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (t,):
                raise ValueError(f"{name} must have shape ({t},), got {arr.shape}")

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def has_rewards(self) -> bool:
        return self.rewards is not None

    @property
    def true_return(self) -> float:
        """Sum of the true game rewards; raises ValueError for a legacy segment."""
        if self.rewards is None:
            raise ValueError("this segment has no true rewards (legacy DB from the book)")
        return float(self.rewards.sum())

    def to_record(self) -> dict[str, Any]:
        """The plain dict that is pickled: only numpy arrays and builtins."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "frames": self.frames,
            "actions": self.actions,
            "rewards": self.rewards,
            "dones": self.dones,
            "game_over": self.game_over,
            "lives": self.lives,
            "env_id": self.env_id,
            "action_meanings": list(self.action_meanings) if self.action_meanings else None,
            "env_index": self.env_index,
            "step": self.step,
            "checkpoint": self.checkpoint,
            "time": self.time,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Segment:
        meanings = rec.get("action_meanings")
        return cls(
            frames=np.asarray(rec["frames"], dtype=np.uint8),
            actions=np.asarray(rec["actions"], dtype=np.int64),
            rewards=None if rec.get("rewards") is None else np.asarray(rec["rewards"], dtype=np.float32),
            dones=None if rec.get("dones") is None else np.asarray(rec["dones"], dtype=bool),
            game_over=None if rec.get("game_over") is None else np.asarray(rec["game_over"], dtype=bool),
            lives=None if rec.get("lives") is None else np.asarray(rec["lives"], dtype=np.int32),
            env_id=rec.get("env_id"),
            action_meanings=tuple(meanings) if meanings else None,
            env_index=rec.get("env_index"),
            step=rec.get("step"),
            checkpoint=rec.get("checkpoint"),
            time=rec.get("time"),
            meta=dict(rec.get("meta") or {}),
        )


# --- safe loading -------------------------------------------------------------------------

_ALLOWED_BUILTINS = {
    "list", "dict", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes",
    "bytearray", "bool", "slice", "range",
}  # fmt: skip

_NUMPY_ALLOWED = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


def _numpy_global(module: str, name: str) -> Any:
    # numpy < 2 pickles as numpy.core.*, numpy >= 2 as numpy._core.*: accept both, but only
    # the array reconstruction helpers and the dtype classes (numpy.dtypes.UInt8DType, ...).
    if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in ("_reconstruct", "scalar"):
        from numpy._core import multiarray

        return getattr(multiarray, name)
    if module in ("numpy.core.numeric", "numpy._core.numeric") and name == "_frombuffer":
        from numpy._core import numeric

        return numeric._frombuffer
    if module == "numpy.dtypes" and name.endswith("DType"):
        import numpy.dtypes

        return getattr(numpy.dtypes, name)
    if (module, name) in _NUMPY_ALLOWED:
        return _NUMPY_ALLOWED[(module, name)]
    return None


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _ALLOWED_BUILTINS:
            import builtins

            return getattr(builtins, name)
        if module.startswith("numpy"):
            obj = _numpy_global(module, name)
            if obj is not None:
                return obj
        if name == "EpisodeStep" and module.endswith("rlhf"):
            return EpisodeStep
        if module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        raise pickle.UnpicklingError(f"refusing to load '{module}.{name}' (not allowed in a segment)")


def safe_loads(data: bytes) -> Any:
    """Unpickle bytes allowing only what segments contain; anything else raises UnpicklingError."""
    return _SafeUnpickler(io.BytesIO(data)).load()


def decode_segment(data: bytes, name: str = "<bytes>") -> Segment:
    """Decode a segment file's bytes (ours: zstd pickle of a dict; legacy: pickle of steps)."""
    try:
        if data[:4] == _ZSTD_MAGIC:
            data = zstandard.ZstdDecompressor().decompress(data)
        obj = safe_loads(data)
    except pickle.UnpicklingError as e:
        raise SegmentError(f"{name}: not a valid segment ({e})") from None
    except (EOFError, zstandard.ZstdError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise SegmentError(f"{name}: truncated or corrupt segment ({type(e).__name__}: {e})") from None
    try:
        if isinstance(obj, dict) and obj.get("format") == FORMAT_NAME:
            return Segment.from_record(obj)
        if isinstance(obj, list) and obj and all(isinstance(s, EpisodeStep) for s in obj):
            frames = np.stack([np.asarray(s.obs, dtype=np.uint8) for s in obj])
            actions = np.array([int(s.act) for s in obj], dtype=np.int64)
            return Segment(frames=frames, actions=actions, meta={"legacy": True})
    except (ValueError, TypeError, KeyError) as e:
        raise SegmentError(f"{name}: malformed segment ({e})") from None
    raise SegmentError(f"{name}: not a segment (unexpected content {type(obj).__name__})")


def load_segment(path: str | os.PathLike) -> Segment:
    """Read one segment file; raises SegmentError (naming the file) when it can't be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SegmentError(f"{path}: cannot read ({e.strerror})") from None
    return decode_segment(data, str(path))


def encode_segment(segment: Segment, level: int = ZSTD_LEVEL) -> bytes:
    raw = pickle.dumps(segment.to_record(), protocol=pickle.HIGHEST_PROTOCOL)
    return zstandard.ZstdCompressor(level=level).compress(raw)


def _atomic_write(path: Path, data: bytes, fsync: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def segment_relpath(env_index: int, step: int) -> str:
    """Path of a segment relative to the DB root: ``NN/SSSSSSSS.dat``."""
    return f"{env_index:02d}/{step:08d}.dat"


def save_segment(db_root: str | os.PathLike, segment: Segment, fsync: bool = True) -> Path:
    """Write a segment atomically to ``<db>/<env:02d>/<step:08d>.dat`` and return its path."""
    if segment.env_index is None or segment.step is None:
        raise ValueError("segment needs env_index and step to be saved in a DB")
    path = Path(db_root) / segment_relpath(segment.env_index, segment.step)
    _atomic_write(path, encode_segment(segment), fsync=fsync)
    return path


def list_segments(db_root: str | os.PathLike) -> list[str]:
    """All segment paths of a DB, relative to its root (``NN/SSSSSSSS.dat``), sorted."""
    root = Path(db_root)
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_dir() and d.name.isdigit():
            out.extend(
                f"{d.name}/{f.name}"
                for f in sorted(d.iterdir())
                if f.suffix == ".dat" and not f.name.startswith(".")
            )
    return out


def resolve_in_db(db_root: str | os.PathLike, rel: str) -> Path:
    """The absolute path of ``rel`` inside the DB; ValueError if it would leave the DB."""
    root = Path(db_root).resolve()
    p = (root / rel).resolve()
    if root != p and root not in p.parents:
        raise ValueError(f"path {rel!r} is outside the DB {root}")
    return p


class SegmentWriter:
    """Compresses and writes segments on a background thread so the training loop never waits.

    zstd releases the GIL, so compression overlaps with env stepping. ``close()`` drains the
    queue: every segment handed over before it is on disk when it returns.
    """

    def __init__(self, db_root: str | os.PathLike, max_queue: int = 64):
        self.db_root = Path(db_root)
        self.written = 0
        self.bytes_written = 0
        self.errors: list[str] = []
        self._q: queue.Queue[Segment | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="segment-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            seg = self._q.get()
            if seg is None:
                return
            try:
                path = save_segment(self.db_root, seg)
                self.written += 1
                self.bytes_written += path.stat().st_size
            except OSError as e:
                self.errors.append(f"cannot write segment into {self.db_root}: {e}")

    def put(self, segment: Segment) -> None:
        self._q.put(segment)

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
