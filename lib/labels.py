"""Preference labels: ``<db>/labels.jsonl``, one JSON object a line, append-only.

``{"sample1": "03/00012345.dat", "sample2": "11/00067890.dat", "label": 1, "time": ..., "source": "human"}``

label 1: first better, 2: second better, 0: equally good, -1 (``CANT_TELL``): the person could
not tell -- kept, so the pair is not offered again, but never trained on. The last line for a
pair wins (editing = appending) and (a, b) and (b, a) are one pair. A line with label -2
(``RETRACTED``, written by the label page's undo) takes a pair's answer back: the pair is
unlabeled again. A torn last line after a
crash is skipped with a warning. The book's ``labels.json`` (same line format) is read too.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LABELS_FILE = "labels.jsonl"
LEGACY_LABELS_FILE = "labels.json"

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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Label:
        known = {"sample1", "sample2", "label", "time", "source"}
        return cls(
            sample1=str(d["sample1"]),
            sample2=str(d["sample2"]),
            label=int(d["label"]),
            time=d.get("time"),
            source=str(d.get("source", "human")),
            extra={k: v for k, v in d.items() if k not in known},
        )


def pair_key(a: str, b: str) -> tuple[str, str]:
    """Order-free key of a pair: (a, b) and (b, a) are the same pair."""
    return (a, b) if a <= b else (b, a)


def check_relpath(rel: str) -> str:
    """A label path must be relative and stay inside the DB; returns it normalised."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"label path {rel!r} must be relative to the DB root and stay inside it")
    return p.as_posix()


def _parse_lines(path: Path) -> list[Label]:
    out: list[Label] = []
    data = path.read_text(encoding="utf-8")
    lines = data.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            lab = Label.from_json(json.loads(line))
            check_relpath(lab.sample1)
            check_relpath(lab.sample2)
            if lab.label not in VALID_LABELS and lab.label != RETRACTED:
                raise ValueError(f"unknown label value {lab.label}")
        except (json.JSONDecodeError, KeyError, ValueError, TypeError) as e:
            last = all(not rest.strip() for rest in lines[i + 1 :])
            if last:
                warnings.warn(f"{path}:{i + 1}: skipping a torn last line ({e})", stacklevel=3)
            else:
                warnings.warn(f"{path}:{i + 1}: skipping a bad line ({e})", stacklevel=3)
            continue
        out.append(lab)
    return out


def read_label_log(db_root: str | os.PathLike) -> list[Label]:
    """Every line of the DB's label files in order (legacy ``labels.json`` first)."""
    root = Path(db_root)
    out: list[Label] = []
    for name in (LEGACY_LABELS_FILE, LABELS_FILE):
        p = root / name
        if p.is_file():
            out.extend(_parse_lines(p))
    return out


def load_labels(db_root: str | os.PathLike) -> dict[tuple[str, str], Label]:
    """The current label of every pair: the last line for a pair wins, (a,b) == (b,a)."""
    current: dict[tuple[str, str], Label] = {}
    for lab in read_label_log(db_root):
        current.pop(lab.key, None)  # keep insertion order = order of last answer
        if lab.label != RETRACTED:
            current[lab.key] = lab
    return current


def append_labels(db_root: str | os.PathLike, labels: Iterable[Label]) -> None:
    """Append labels durably: one write under a lock, flushed and fsynced.

    Safe with several threads (a lock) and several processes (``fcntl.flock``); a torn last
    line left by an earlier crash is terminated first so the new line stays whole.
    """
    root = Path(db_root)
    payload = ""
    for lab in labels:
        check_relpath(lab.sample1)
        check_relpath(lab.sample2)
        if lab.label not in VALID_LABELS and lab.label != RETRACTED:
            raise ValueError(f"label must be one of {VALID_LABELS} (or RETRACTED), got {lab.label}")
        payload += json.dumps(lab.to_json(), sort_keys=True) + "\n"
    if not payload:
        return
    path = root / LABELS_FILE
    with _write_lock, open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    payload = "\n" + payload  # close a torn line from a crash
            f.write(payload.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def append_label(db_root: str | os.PathLike, label: Label) -> None:
    append_labels(db_root, [label])
