"""Preference labels: ``<db>/labels.jsonl``, one JSON object a line, append-only:

``{"sample1": "03/00012345.dat", "sample2": "11/00067890.dat", "label": 1, "time": ..., "source": "human"}``

Label 1: first better, 2: second better, 0: equal, -1 (``CANT_TELL``): kept so the pair is not
offered again, never trained on; -2 (``RETRACTED``, the page's undo) makes the pair unlabeled again.
The last line for a pair wins and (a, b), (b, a) are one pair; a torn last line is skipped with a
warning. The book's ``labels.json`` is read too."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.core.errors import UserError, warn
from lib.core.files import UnsafeFileError, open_append, read_regular
from lib.core.stats import finite

LABELS_FILE = "labels.jsonl"
LEGACY_LABELS_FILE = "labels.json"
LOCK_FILE = ".labels.lock"
MAX_LABELS_BYTES = 1 << 30  # ~5 million labels; a larger file is not a label file
Warn = Callable[[str], None]

FIRST_BETTER = 1
SECOND_BETTER = 2
EQUAL = 0
CANT_TELL = -1
VALID_LABELS = (FIRST_BETTER, SECOND_BETTER, EQUAL, CANT_TELL)
RETRACTED = -2  # not an answer: a line that takes the pair's last answer back (undo)
LABEL_NAMES = {FIRST_BETTER: "#1 better", SECOND_BETTER: "#2 better", EQUAL: "equal", CANT_TELL: "can't tell"}

_write_lock = threading.Lock()  # one process, many tabs / threads; fcntl covers other processes


@dataclass(frozen=True)
class Label:
    """One answer about a pair of segments (paths relative to the DB root)."""

    sample1: str
    sample2: str
    label: int
    time: float | None = None
    source: str = "human"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return pair_key(self.sample1, self.sample2)

    @property
    def preference(self) -> float | None:
        """P(sample1 better): 1.0, 0.0, 0.5 for a tie, None for can't tell."""
        return {FIRST_BETTER: 1.0, SECOND_BETTER: 0.0, EQUAL: 0.5}.get(self.label)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.extra)
        d.update(sample1=self.sample1, sample2=self.sample2, label=self.label, source=self.source)
        d["time"] = self.time if self.time is not None else time.time()
        return d


def pair_key(a: str, b: str) -> tuple[str, str]:
    """Order-free key of a pair: (a, b) and (b, a) are the same pair."""
    return (a, b) if a <= b else (b, a)


def check_relpath(rel: str) -> str:
    """A label path must be relative and stay inside the DB; returns it normalised."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"label path {rel!r} must be relative to the DB root and stay inside it")
    return p.as_posix()


def check_pair(a: str, b: str) -> tuple[str, str]:
    """Both paths of a pair, normalised (``check_relpath``); ValueError for a segment paired with
    itself: its R1 - R2 is 0 whatever the model says, so its answer only adds noise."""
    a, b = check_relpath(a), check_relpath(b)
    if a == b:
        raise ValueError(f"segment {a!r} is paired with itself")
    return a, b


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not finite(x):  # 10**400: not finite
        raise ValueError(f"{what} must be a finite number, got {str(x)[:40]}")
    return float(x)


def parse_label_line(raw: bytes | str) -> Label:
    """One line of a label file -> Label; ValueError saying why for anything but a UTF-8 JSON
    object with string paths inside the DB, a known label value, a finite numeric time and a
    string source. The one check every reader of label files uses."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    d = json.loads(raw, parse_constant=_no_constants)
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    a, b, value = d.get("sample1"), d.get("sample2"), d.get("label")
    if not isinstance(a, str) or not isinstance(b, str):
        raise ValueError("sample1 and sample2 must be strings")
    if type(value) is not int or (value not in VALID_LABELS and value != RETRACTED):
        raise ValueError(f"unknown label value {str(value)[:40]}")
    when = d.get("time")
    source = d.get("source", "human")
    if not isinstance(source, str):
        raise ValueError("source must be a string")
    a, b = check_pair(a, b)
    return Label(
        sample1=a,
        sample2=b,
        label=value,
        time=None if when is None else _finite(when, "time"),
        source=source,
        extra={k: v for k, v in d.items() if k not in _KNOWN},
    )


_KNOWN = {"sample1", "sample2", "label", "time", "source"}


def parse_label_lines(data: bytes, where: str, warn: Warn = warn, first_line: int = 1) -> list[Label]:
    """Every good line of a label file's bytes; a bad line is skipped with a warning naming its
    line number (a torn last line after a crash says so). ``first_line``: the number in the file of
    ``data``'s first line (``LabelTail`` reads only what was appended)."""
    out: list[Label] = []
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(parse_label_line(line))
        except (ValueError, RecursionError) as e:
            torn = i == len(lines) - 1  # no newline after it: a write cut short
            what = "a torn last line" if torn else "a bad line"
            warn(f"{where}:{first_line + i}: skipping {what} ({type(e).__name__}: {str(e)[:120]})")
    return out


def read_label_log(
    db_root: str | os.PathLike, warn: Warn = warn, names: tuple[str, ...] = (LEGACY_LABELS_FILE, LABELS_FILE)
) -> list[Label]:
    """Every line of the DB's label files (``names``) in order (legacy ``labels.json`` first). A
    label file that is a symlink or not a regular file is not read (one warning)."""
    root = Path(db_root)
    out: list[Label] = []
    for name in names:
        p = root / name
        if not os.path.lexists(p):
            continue
        try:
            if p.is_symlink():
                raise UnsafeFileError(f"{p} is a symlink")
            data = read_regular(p, MAX_LABELS_BYTES)
        except OSError as e:
            warn(f"{p}: not read ({e.strerror or e})")
            continue
        out.extend(parse_label_lines(data, str(p), warn))
    return out


TAIL_CHECK = 256  # LabelTail: the last bytes read, compared again before reading on


class LabelTail:
    """Follows one append-only label file: ``read_new`` parses only the whole lines appended since
    its last call (a line still being written is read at the next). It notices when the file is no
    longer the one it read (another inode, shorter, other bytes where its last read ended, or the
    same size with another mtime); ``read_new`` then returns None and the caller reads everything
    again (``reset``). An edit that keeps the size within one clock tick of the last look goes
    unseen. Not thread-safe: one reader at a time."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.said: str | None = None  # why the file was last not read: said once, not at every call
        self.reset()

    def reset(self) -> None:
        self.ino: int | None = None  # the file read so far; None: nothing read yet
        self.offset = 0  # bytes read, whole lines only
        self.lines = 0  # lines in them
        self.tail = b""  # their last TAIL_CHECK bytes
        self.seen = (-1, -1)  # the file's (size, mtime_ns) at the last read

    def read_new(self, warn: Warn = warn, torn_too: bool = False) -> list[Label] | None:
        """The labels of the whole lines appended since the last call: [] when none, or when the
        file is missing or unsafe before anything was read (said once); None when the file is not
        the one read before. ``torn_too``: also read a last line with no newline when no writer is
        finishing it (``_cut_short``; a torn line is skipped with a warning)."""
        fresh = self.ino is None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return [] if fresh else None
        except OSError as e:  # a symlink (ELOOP), a permission
            if fresh:
                why = "a symlink" if os.path.islink(self.path) else (e.strerror or str(e))
                return self._not_read(why, warn)
            return None
        try:
            st = os.fstat(fd)
            if fresh and (not stat.S_ISREG(st.st_mode) or st.st_size > MAX_LABELS_BYTES):
                return self._not_read(f"not a regular file of at most {MAX_LABELS_BYTES:,} bytes", warn)
            start = self.offset - len(self.tail)
            if not fresh and (
                not stat.S_ISREG(st.st_mode)
                or st.st_ino != self.ino
                or not self.offset <= st.st_size <= MAX_LABELS_BYTES
                or (st.st_size == self.seen[0] and st.st_mtime_ns != self.seen[1])
                or os.pread(fd, len(self.tail), start) != self.tail
            ):
                return None
            chunks, at = [], self.offset
            while at < st.st_size and (chunk := os.pread(fd, min(1 << 20, st.st_size - at), at)):
                chunks.append(chunk)
                at += len(chunk)
            data = b"".join(chunks)
            whole = data[: data.rfind(b"\n") + 1]
            if torn_too and len(whole) < len(data) and _cut_short(fd, at):
                whole = data
        except OSError:
            return [] if fresh else None
        finally:
            os.close(fd)
        labels = parse_label_lines(whole, str(self.path), warn, first_line=self.lines + 1)
        self.ino, self.said, self.seen = st.st_ino, None, (st.st_size, st.st_mtime_ns)
        self.offset += len(whole)
        self.lines += whole.count(b"\n")
        self.tail = (self.tail + whole)[-TAIL_CHECK:]
        return labels

    def _not_read(self, why: str, warn: Warn) -> list[Label]:
        if why != self.said:
            warn(f"{self.path}: not read ({why})")
            self.said = why
        return []


def _cut_short(fd: int, size: int) -> bool:
    """Whether the label file open as ``fd``, read up to ``size`` bytes and ending without a
    newline, was cut short by a crash: writers append under an exclusive ``flock``, so a shared lock
    taken at once while the file is still ``size`` bytes means no writer is finishing that line."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: an append is under way
        return False
    try:
        return os.fstat(fd).st_size == size
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def is_control(lab: Label) -> bool:
    """A control answer: the label page showed an answered pair again (order swapped) to check
    the labeler's consistency. It never changes the pair's label and is never trained on."""
    return lab.extra.get("control") is True


def load_labels(db_root: str | os.PathLike, warn: Warn = warn) -> dict[tuple[str, str], Label]:
    """The current label of every pair: the last line for a pair wins, (a,b) == (b,a); control
    answers (``is_control``) are left out."""
    current: dict[tuple[str, str], Label] = {}
    for lab in read_label_log(db_root, warn):
        if is_control(lab):
            continue
        current.pop(lab.key, None)  # keep insertion order = order of last answer
        if lab.label != RETRACTED:
            current[lab.key] = lab
    return current


def _winner(lab: Label) -> str | None:
    """The segment a label prefers, "" for equal, None when it has no answer to compare."""
    return {FIRST_BETTER: lab.sample1, SECOND_BETTER: lab.sample2, EQUAL: ""}.get(lab.label)


class ConsistencyTracker:
    """Per labeler (``labeler`` field, else the source): (control answers that agree with the pair's
    label at the time, control answers compared), fed one line at a time so a reader of a growing
    file keeps it current. Compared only when both say #1, #2 or equal; an undone control answer
    does not count."""

    def __init__(self) -> None:
        self.current: dict[tuple[str, str], Label] = {}
        self.checks: dict[tuple[str, tuple[str, str]], bool | None] = {}

    def feed(self, lab: Label) -> None:
        if is_control(lab):
            who = str(lab.extra.get("labeler") or lab.source)
            before = self.current.get(lab.key)
            mine, theirs = _winner(lab), _winner(before) if before is not None else None
            self.checks[(who, lab.key)] = None if mine is None or theirs is None else mine == theirs
            return
        self.current.pop(lab.key, None)
        if lab.label != RETRACTED:
            self.current[lab.key] = lab

    def result(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for (who, _), ok in list(self.checks.items()):
            if ok is not None:
                agree, n = out.get(who, (0, 0))
                out[who] = (agree + int(ok), n + 1)
        return out


def append_labels(db_root: str | os.PathLike, labels: Iterable[Label]) -> None:
    """Append labels durably: one write of whole lines under a thread lock and ``fcntl.flock``,
    fsynced, all or none. A torn last line from an earlier crash is terminated first; a failed write
    (disk full) cuts the file back and raises OSError naming the path. UserError for a labels file
    that is a symlink, not a regular file, or hard-linked (the append would change the other name)."""
    root = Path(db_root)
    payload = ""
    for lab in labels:
        check_pair(lab.sample1, lab.sample2)
        if lab.label not in VALID_LABELS and lab.label != RETRACTED:
            raise ValueError(f"label must be one of {VALID_LABELS} (or RETRACTED), got {lab.label}")
        payload += json.dumps(lab.to_json(), sort_keys=True) + "\n"
    if not payload:
        return
    path = root / LABELS_FILE
    try:
        f = open_append(path)
    except UnsafeFileError as e:
        raise UserError(f"{e} (labels.jsonl of a DB must be a regular file)") from None
    with _write_lock, f:
        fd = f.fileno()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = os.fstat(fd)
            if st.st_nlink > 1:
                raise UserError(
                    f"{path} has {st.st_nlink} hard links: refusing to append labels to a file with another name "
                    "(copy it: cp labels.jsonl x && mv x labels.jsonl)"
                )
            size = st.st_size
            data = payload.encode("utf-8")
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # close a torn line from a crash
            _write_whole(fd, data, size, path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _write_whole(fd: int, data: bytes, size: int, path: Path) -> None:
    """Append ``data`` (one ``os.write``, more only if the kernel takes part of it) and fsync; on
    any OSError cut the file back to ``size`` and raise the OSError naming ``path``."""
    try:
        done = 0
        while done < len(data):
            done += _os_write(fd, data[done:])
        os.fsync(fd)
    except OSError as e:
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError:
            pass
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None


_os_write = os.write  # tests replace it to play a full disk


@contextlib.contextmanager
def labeling_lock(db_root: str | os.PathLike, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``<db>/.labels.lock`` (``fcntl.flock``, exclusive): a labeler that picks pairs from the
    labels on disk (``--oracle``) reads, picks and appends under it, so two of them never pick the
    same pair. ``on_wait`` is called once when another holder makes it wait."""
    path = Path(db_root) / LOCK_FILE
    try:
        f = open_append(path)
    except UnsafeFileError as e:
        raise UserError(f"{e} (the DB's label lock must be a regular file)") from None
    except OSError as e:
        raise UserError(f"cannot open {path} ({e.strerror or e}): labels are written into the DB") from None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def sample_unlabeled_pairs(
    segments: list[str],
    taken: set[tuple[str, str]],
    count: int,
    rng: np.random.Generator,
    max_tries: int | None = None,
) -> list[tuple[str, str]]:
    """Up to ``count`` random pairs of distinct segments, none of them in ``taken`` (order-free)
    and none twice. Returns fewer when the DB runs out of unlabeled pairs -- never hangs."""
    n = len(segments)
    total = n * (n - 1) // 2
    free = total - len(taken)
    count = min(count, max(free, 0))
    out: list[tuple[str, str]] = []
    seen = set(taken)
    if count <= 0:
        return out
    if (free <= 4 * count or total <= 50_000) and total <= 200_000:
        # Small DB or nearly exhausted: enumerate what is left, then sample from it.
        left = [(segments[i], segments[j]) for i in range(n) for j in range(i + 1, n)]
        left = [p for p in left if pair_key(*p) not in seen]
        idx = rng.permutation(len(left))[:count]
        return [left[i] if rng.random() < 0.5 else left[i][::-1] for i in idx]
    tries = max_tries or 50 * count + 1000
    while len(out) < count and tries > 0:
        tries -= 1
        i, j = rng.choice(n, size=2, replace=False)
        key = pair_key(segments[i], segments[j])
        if key in seen:
            continue
        seen.add(key)
        out.append((segments[i], segments[j]))
    return out
