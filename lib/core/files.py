"""Files a user hands over are untrusted; files we write must survive a crash. One owner for both:
``read_regular`` reads only a regular file of bounded size (checked by ``fstat``, so a FIFO or a
symlink to ``/dev/zero`` is refused, and a FIFO never hangs the reader); ``open_append`` never
writes through a symlink; ``atomic_write`` writes a unique temp file, fsyncs and renames it, with
the permissions the user's umask gives (``mkstemp`` alone makes 0600 files, which another account
sharing a DB cannot read); ``hold_lock`` keeps a second process out of what one process writes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


class UnsafeFileError(OSError):
    """A path that is not a regular file, leaves its directory, is a symlink where none is allowed,
    or is larger than allowed. The message says which."""


def _read_umask() -> int:
    # /proc/self/status has it without changing it (os.umask can only be read by setting it).
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


UMASK = _read_umask()
# When this process started (near enough: when lib.core.files was first imported). A temp file older
# than this cannot be one this process is writing.
STARTED = time.time()


def read_regular(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; UnsafeFileError otherwise (OSError
    when it cannot be opened at all)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise UnsafeFileError(f"{path}: {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
        data = read_at_most(lambda n: os.read(fd, n), max_bytes)  # the size may change under us
        if data is None:
            raise UnsafeFileError(f"{path}: grew past the {max_bytes:,} bytes allowed while read")
        return data
    finally:
        os.close(fd)


def read_at_most(read: Callable[[int], bytes], limit: int) -> bytes | None:
    """All that ``read(n)`` gives until it gives nothing, in chunks of at most 1 MB; None as soon as
    more than ``limit`` bytes came (never more than ``limit + 1`` are held)."""
    chunks, total = [], 0
    while chunk := read(min(1 << 20, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None
    return b"".join(chunks)


def inside(root: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` (symlinks resolved) is ``root`` or lies under it (also resolved)."""
    r = os.path.realpath(root)
    p = os.path.realpath(path)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def open_append(path: str | os.PathLike) -> BinaryIO:
    """Open ``path`` for reading and appending (created if missing, with the umask's permissions).
    UnsafeFileError when it is a symlink or not a regular file: never writes through a link. The
    caller closes the returned file."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = _open_regular(path, flags, ": refusing to write through it", ": refusing to write to it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+b")


def _open_regular(path: str | os.PathLike, flags: int, link_note: str = "", other_note: str = "") -> int:
    """``os.open(path, flags)`` with ``O_NOFOLLOW`` in ``flags``, created with the umask's
    permissions, kept only if it is a regular file: UnsafeFileError when it is a symlink or anything
    else (``link_note`` / ``other_note`` end those messages); OSError for what else fails."""
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path} is a symlink{link_note}") from None
        if e.errno == errno.ENXIO:  # a FIFO without a reader
            raise UnsafeFileError(f"{path} is not a regular file{other_note}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{path} is not a regular file{other_note}")
    return fd


class LockHeld(OSError):
    """Another process holds the lock; ``holder`` is the line it wrote (pid, host, command, since)."""

    def __init__(self, path: str | os.PathLike, holder: str) -> None:
        super().__init__(errno.EWOULDBLOCK, f"held by {holder}", str(path))
        self.holder = holder


def hold_lock(path: str | os.PathLike) -> int:
    """Take an exclusive ``flock`` on the file ``path`` (created with the umask's permissions, never
    through a symlink), which then names this process: pid, host, command line, time. Returns the
    open descriptor: the lock lasts until it is closed or the process ends, so a killed holder leaves
    none behind. LockHeld, naming the holder, when another process has it; UnsafeFileError when
    ``path`` is a symlink or not a regular file; OSError when it cannot be opened or locked."""
    fd = _open_regular(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 300, 0).decode("utf-8", "replace").strip().splitlines()
            raise LockHeld(path, holder[0] if holder else "unknown") from None
        cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:160]
        line = f"pid {os.getpid()} on {socket.gethostname()}, {cmd!r}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, line.encode("utf-8", "replace"), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


def file_state(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """What a follower compares between two looks at a file: (mtime_ns, size, inode) from one
    ``stat``, None when it cannot be stat'ed. An atomic install (temp + rename) always gives a new
    inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def new_temp_beside(path: Path) -> tuple[int, str]:
    """A new empty file with a unique name beside ``path`` (parents created): ``(fd, name)``, made
    by ``mkstemp`` (never a file or link that was there before), with the umask's permissions. The
    caller closes ``fd``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~UMASK)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def temp_beside(path: Path, data: bytes | Callable[[BinaryIO], None], fsync: bool = True) -> str:
    """``data`` written to a new unique temp file beside ``path`` (parents created), flushed and
    fsynced; returns its name. Nothing is left behind when writing fails."""
    fd, tmp = new_temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes | bytearray | memoryview):
                f.write(data)
            else:
                data(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], None], fsync: bool = True) -> None:
    """Write ``data`` (bytes, or a function that writes to a binary file) to ``path`` atomically:
    a unique temp file beside it, flushed and fsynced, renamed over ``path``. A crash leaves
    either the old file or the new one, never half of one. Parent directories are created."""
    path = Path(path)
    install(temp_beside(path, data, fsync), path, fsync)


def install(tmp: str | os.PathLike, path: str | os.PathLike, fsync: bool = True) -> None:
    """Rename the finished temp file ``tmp`` (from ``new_temp_beside``) over ``path``, then fsync
    the directory; ``tmp`` is removed when the rename fails."""
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        _fsync_dir(Path(path).parent)


def create_exclusive(path: str | os.PathLike, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to a NEW file ``path``, atomically: a temp file beside it, flushed, then
    hard-linked to ``path`` (which fails if ``path`` exists: an existing file is never replaced)
    and removed. FileExistsError when ``path`` exists; a crash leaves no half file."""
    path = Path(path)
    tmp = temp_beside(path, data, fsync)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            # a file system without hard links: rename, after a check (the DB's lock keeps other
            # recorders out, so nobody creates the name in between)
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
            os.rename(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if fsync:
        _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    # The rename is durable only once the directory entry is: fsync the directory (POSIX).
    with contextlib.suppress(OSError):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def remove_stale_temps(
    directory: str | os.PathLike,
    prefix: str,
    suffix: str,
    started: float | None = None,
    pattern: re.Pattern[str] | None = None,
) -> int:
    """Remove the temp files a killed writer left in ``directory``: regular files named
    ``<prefix>*<suffix>`` (and matching ``pattern``) last modified before ``started`` (default: this
    process's start). Returns how many; never raises."""
    started = STARTED if started is None else started
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for e in entries:
        if not (e.name.startswith(prefix) and e.name.endswith(suffix)) or len(e.name) <= len(prefix) + len(suffix):
            continue
        if pattern is not None and not pattern.fullmatch(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mtime < started:
                os.unlink(e.path)
                removed += 1
        except OSError:
            continue
    return removed
