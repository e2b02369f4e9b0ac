"""Writing the segment DB (read by ``lib/store/segments.py``): ``save_segment`` writes a segment
atomically, never replacing one; ``SegmentWriter`` does it on a background thread for the recorder;
``claim_db`` checks a DB's game and writes its ``db.json`` before anything is recorded."""

from __future__ import annotations

import json
import os
import pickle
import queue
import re
import threading
from pathlib import Path
from typing import Any

import zstandard

from lib.core.errors import UserError
from lib.core.files import atomic_write, create_exclusive, remove_stale_temps
from lib.store.segments import DB_INFO_FILE, ZSTD_LEVEL, DbInfo, Segment, db_game, read_db_info


def encode_segment(segment: Segment, level: int = ZSTD_LEVEL) -> bytes:
    raw = pickle.dumps(segment.to_record(), protocol=5)
    # The frame carries its content size (one-call decode within the bound) and a checksum: a
    # flipped bit anywhere in the file is a SegmentError, not silently altered frames.
    return zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True).compress(raw)


def segment_relpath(env_index: int, step: int) -> str:
    """Path of a segment relative to the DB root: ``NN/SSSSSSSS.dat``."""
    return f"{env_index:02d}/{step:08d}.dat"


def save_segment(db_root: str | os.PathLike, segment: Segment, fsync: bool = True) -> Path:
    """Write a segment atomically to ``<db>/<env:02d>/<step:08d>.dat`` and return its path."""
    if segment.env_index is None or segment.step is None:
        raise ValueError("segment needs env_index and step to be saved in a DB")
    path = Path(db_root) / segment_relpath(segment.env_index, segment.step)
    create_exclusive(path, encode_segment(segment), fsync=fsync)  # never replaces a segment
    return path


_SEGMENT_TEMP = re.compile(r"\.[0-9]{8,12}\.dat\..+\.tmp")


def remove_stale_segment_temps(
    db_root: str | os.PathLike, env_indices: Any = None, started: float | None = None
) -> int:
    """Remove the temp files a killed recorder left: of segments (in the directories of
    ``env_indices``, default all) and of ``db.json``, regular files older than ``started``. Call it
    only while holding those directories' recorder locks. Returns how many were removed."""
    root = Path(db_root)
    n = remove_stale_temps(root, f".{DB_INFO_FILE}.", ".tmp", started)
    try:
        dirs = [d for d in os.scandir(root) if re.fullmatch(r"[0-9]{2,3}", d.name) and d.is_dir(follow_symlinks=False)]
    except OSError:
        return n
    mine = None if env_indices is None else {segment_relpath(int(i), 0).split("/")[0] for i in env_indices}
    for d in dirs:
        if mine is None or d.name in mine:
            n += remove_stale_temps(d.path, ".", ".tmp", started, pattern=_SEGMENT_TEMP)
    return n


def write_db_info(db_root: str | os.PathLike, info: DbInfo) -> None:
    atomic_write(Path(db_root) / DB_INFO_FILE, (json.dumps(info.to_json(), indent=1) + "\n").encode())


def check_db_game(db_root: str | os.PathLike, env_id: str) -> None:
    """Before recording into a DB: UserError naming both games when it holds another game."""
    from lib.atari.envs import game_of

    got = db_game(db_root) if Path(db_root).is_dir() else None
    if got is not None and got[0] != game_of(env_id):
        raise UserError(f"DB {db_root} holds {got[1]} segments, this run plays {env_id}: record into another --db-path")


def claim_db(db_root: str | os.PathLike, env_id: str, action_meanings: tuple[str, ...]) -> None:
    """Before recording into a DB: ``check_db_game``, then write its ``db.json`` if it has none."""
    from lib.atari.envs import game_of

    check_db_game(db_root, env_id)
    if read_db_info(db_root, warn=None) is None:
        path = Path(db_root) / DB_INFO_FILE
        if os.path.lexists(path):
            raise UserError(
                f"{path} is not a readable DB description (a directory, a symlink or broken JSON): "
                f"move it away or record into another --db-path"
            )
        game = game_of(env_id)
        write_db_info(db_root, DbInfo(game, env_id, tuple(action_meanings)))


class SegmentWriter:
    """Compresses and writes segments on a background thread (zstd releases the GIL) so the training
    loop never waits. ``close()`` returns once every segment handed over before it is on disk."""

    def __init__(self, db_root: str | os.PathLike, max_queue: int = 64):
        self.db_root = Path(db_root)
        self.written = 0
        self.failed = 0  # segments that could not be written (disk full, a name taken)
        self.first_error: str | None = None
        # the first few reasons; after close(), one line that sums them up (what a run reports)
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
                save_segment(self.db_root, seg)
                self.written += 1
            except Exception as e:  # disk full, a name already taken...: count it, never stop the thread
                self.failed += 1
                if len(self.errors) < 3:
                    rel = segment_relpath(seg.env_index or 0, seg.step or 0)
                    why = "exists already, not replaced" if isinstance(e, FileExistsError) else str(e)[:200]
                    self.errors.append(f"{rel}: {why}")
                    self.first_error = self.first_error or self.errors[0]

    def put(self, segment: Segment) -> None:
        self._q.put(segment)

    def summary(self) -> str | None:
        """One line on the segments that could not be written (None when all were)."""
        if not self.failed:
            return None
        return (
            f"{self.failed:,} segment(s) could not be written into {self.db_root} "
            f"({self.written:,} were; first: {self.first_error})"
        )

    def close(self) -> None:
        """Wait until every queued segment is written or counted as failed; then ``errors`` is
        the one ``summary`` line (empty when all were written)."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
        line = self.summary()
        self.errors = [line] if line else []
