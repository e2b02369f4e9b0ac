"""Clips: a segment's colour frames as an H.264 MP4 the browser plays, encoded off the event loop.
MP4, not an animated GIF, because a ``<video>`` can be paused, sped up and restarted, so the page
loops a pair's two clips in step. ffmpeg runs as a subprocess (no GIL) at nice 10, in a thread from
``asyncio.to_thread``, not NiceGUI's ``run.io_bound``, which turns a cancellation into ``None``: a
shutdown during an encode must cancel cleanly. Clips are cached under ``cache_dir``, keyed by the
segment's path, size, mtime and the encoding settings."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from lib.atari.video import CRF, SCALE, encode_mp4
from lib.store.segments import SegmentError, load_segment

CLIP_VERSION = 1  # bump when the encoding changes: old cache entries are then ignored


def encode_clip_file(segment_path: Path, out_path: Path, fps: float) -> float:
    """Read a segment and write its clip atomically to ``out_path``; returns the encode seconds.
    SegmentError (naming the file) when the segment cannot be read."""
    seg = load_segment(segment_path)
    t0 = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_path.parent, prefix=".tmp-", suffix=".mp4")
    os.close(fd)
    try:
        encode_mp4(seg.frames, fps, Path(tmp))
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return time.perf_counter() - t0


class ClipStore:
    """Clips of segments on disk, made on first use; one encode per clip even when many ask at once.
    ``ensure`` is awaited on the event loop; encodes run in ``run_blocking``, ``max_parallel`` at
    most."""

    def __init__(
        self,
        cache_dir: Path,
        fps: float,
        run_blocking: Callable[..., Awaitable] = asyncio.to_thread,
        max_parallel: int | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.fps = fps
        self.run_blocking = run_blocking
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._inflight: dict[Path, asyncio.Future[Path]] = {}
        # Leave a core to the browser and the event loop: on 2 cores one encode at a time.
        self._sem = asyncio.Semaphore(max_parallel or max(1, min(2, (os.cpu_count() or 1) - 1)))

    def cache_path(self, segment_path: Path) -> Path:
        """Where the clip of this segment file (as it is now) is cached."""
        st = segment_path.stat()
        key = f"{segment_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.fps:g}|{SCALE}|{CRF}|{CLIP_VERSION}"
        digest = hashlib.sha1(key.encode()).hexdigest()
        return self.cache_dir / digest[:2] / f"{digest}.mp4"

    async def ensure(self, segment_path: Path) -> Path:
        """The cached clip of a segment, encoding it first if needed; SegmentError if unreadable."""
        try:
            out = self.cache_path(segment_path)
        except OSError as e:
            raise SegmentError(f"{segment_path}: cannot read ({e.strerror})") from None
        if out.is_file():
            return out
        task = self._inflight.get(out)
        if task is None:
            # A task of its own (held in _inflight until done): a tab that goes away while
            # waiting cancels only its wait, never an encode other tabs may be waiting for.
            task = asyncio.ensure_future(self._encode(segment_path, out))
            self._inflight[out] = task
            task.add_done_callback(lambda t: self._done(out, t))
        return await asyncio.shield(task)

    def _done(self, out: Path, task: asyncio.Future[Path]) -> None:
        self._inflight.pop(out, None)
        if not task.cancelled():
            task.exception()  # retrieved here: a failure is reported to the waiters, not logged

    async def _encode(self, segment_path: Path, out: Path) -> Path:
        async with self._sem:
            if not out.is_file():
                await self.run_blocking(encode_clip_file, segment_path, out, self.fps)
        return out


_CLIP_NAME = re.compile(r"[0-9a-f]{40}\.mp4")


def prune_cache(
    cache_dir: Path, max_bytes: int = 512 * 2**20, keep_bytes: int = 384 * 2**20, stale_s: float = 3600.0
) -> int:
    """Keep the clip cache bounded: over ``max_bytes``, delete the least recently used clips down to
    ``keep_bytes``. Temp files of a killed encode (untouched for ``stale_s``) go first. Returns the
    number of files deleted."""
    deleted = 0
    now = time.time()
    for p in Path(cache_dir).glob("[0-9a-f][0-9a-f]/.tmp-*.mp4"):
        try:
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > stale_s:
                p.unlink()
                deleted += 1
        except OSError:
            continue
    # Only the cache's own names (<2 hex>/<40 hex>.mp4): a --cache-dir given by mistake (a home
    # directory of videos) loses nothing of the user's.
    files = [
        (p.stat(), p)
        for p in Path(cache_dir).glob("[0-9a-f][0-9a-f]/*.mp4")
        if _CLIP_NAME.fullmatch(p.name) and p.name.startswith(p.parent.name) and p.is_file() and not p.is_symlink()
    ]
    total = sum(st.st_size for st, _ in files)
    if total <= max_bytes:
        return deleted
    for st, p in sorted(files, key=lambda x: max(x[0].st_atime, x[0].st_mtime)):
        if total <= keep_bytes:
            break
        p.unlink(missing_ok=True)
        total -= st.st_size
        deleted += 1
    return deleted
