"""What the label server knows (``AppState``, one per server, handed to the pages in closures) and
what one browser tab knows (``TabSession``). ``AppState`` holds the DBs, their current labels and
the pairs some tab has in its list (``reserved``), so two tabs are never given the same pair.
``TabSession`` is plain Python (no NiceGUI), so its rules are easy to test: never offer a pair
twice, skip pairs labeled elsewhere meanwhile, undo."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lib.label_ui.sampling import (
    MODEL_MODES,
    SegmentBeliefs,
    SegmentLooks,
    SegmentView,
    choose_pairs,
    pairs_within,
    preference,
    recent_segments,
)
from lib.store.labels import (
    CANT_TELL,
    EQUAL,
    FIRST_BETTER,
    LABELS_FILE,
    LEGACY_LABELS_FILE,
    RETRACTED,
    SECOND_BETTER,
    VALID_LABELS,
    ConsistencyTracker,
    Label,
    LabelTail,
    append_labels,
    pair_key,
    read_label_log,
)
from lib.store.segments import SegmentWatch, segment_path

PairKey = tuple[str, str]
SAMPLE_TRIES = 4  # AppState.sample draws again for pairs another tab claimed meanwhile, this often


def _when(lab: Label) -> float:
    return lab.time or 0.0  # a label without a time (the book's labels.json) is the oldest


class LabelTallies:
    """Counts and newest-first order of a DB's current labels, changed label by label so that no
    page walks them all (a walk over 300,000 labels holds the interpreter lock for a second).
    ``kinds`` counts labels by (answer, source); ``touched`` counts per segment the labels that name
    it; ``order`` holds ``(time, -seq, label)`` ascending, ``seq`` the order the labels came in, so
    equal times list in file order."""

    def __init__(self, current: dict[PairKey, Label]) -> None:
        self.kinds: Counter[tuple[int, str]] = Counter()
        self.touched: Counter[str] = Counter()
        self.seq: dict[PairKey, int] = {}
        for seq, lab in enumerate(current.values()):  # a dict keeps the order the labels came in
            self.seq[lab.key] = seq
            self._count(lab, 1)
        self.order = sorted((_when(lab), -self.seq[lab.key], lab) for lab in current.values())
        self.next_seq = len(current)

    def _count(self, lab: Label, n: int) -> None:
        for counter, k in (
            (self.kinds, (lab.label, lab.source)),
            (self.touched, lab.sample1),
            (self.touched, lab.sample2),
        ):
            counter[k] += n
            if not counter[k]:  # what no label has any more is not listed (a source in the filter)
                del counter[k]

    def add(self, lab: Label) -> None:
        self.seq[lab.key] = seq = self.next_seq
        self.next_seq += 1
        bisect.insort(self.order, (_when(lab), -seq, lab))  # at the end, but for a hand-set older time
        self._count(lab, 1)

    def remove(self, lab: Label) -> None:
        i = bisect.bisect_left(self.order, (_when(lab), -self.seq.pop(lab.key)))
        assert self.order[i][2] is lab, "label order out of step"
        del self.order[i]
        self._count(lab, -1)


class LabelIndex:
    """The current labels of one DB, kept in step with ``<db>/labels.jsonl``. Loaded once (the last
    line for a pair wins; a torn last line is skipped, its warning kept in ``warnings``); then
    ``refresh`` reads only the new bytes at the end, so labels appended by other tabs or processes
    (``--oracle``) show up, with the labelers' consistency. Reading blocks: pages call ``refresh``
    off the event loop; what the loop reads (``snapshot``, ``consistency``, ``kinds``,
    ``untouched``, ``newest_first``) is memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / LABELS_FILE
        self.tracker = ConsistencyTracker()
        self.labels: dict[PairKey, Label] = self.tracker.current
        self.warnings: list[str] = []
        self.tail = LabelTail(self.path)
        self.version = 0  # changes whenever the current labels do
        self._lock = threading.Lock()  # guards the labels while they change
        self._read_lock = threading.Lock()  # one reader of the file at a time
        self.load()

    def load(self) -> None:
        """(Re-)read every label file of the DB."""
        with self._read_lock:
            self._load()

    def _load(self) -> None:
        tracker = ConsistencyTracker()
        self.tail.reset()
        for lab in read_label_log(self.root, warn=self.warnings.append, names=(LEGACY_LABELS_FILE,)):
            tracker.feed(lab)
        for lab in self.tail.read_new(self.warnings.append, torn_too=True) or []:
            tracker.feed(lab)
        tallies = LabelTallies(tracker.current)
        with self._lock:
            self.tracker, self.labels, self.tallies = tracker, tracker.current, tallies
            self.version += 1

    def _feed(self, lab: Label) -> None:
        """One new line (under ``_lock``): the current labels, the consistency and the tallies."""
        before = self.labels.get(lab.key)
        self.tracker.feed(lab)
        after = self.labels.get(lab.key)
        self.version += 1
        if after is not before:
            if before is not None:
                self.tallies.remove(before)
            if after is not None:
                self.tallies.add(after)

    def refresh(self) -> int:
        """Apply whole lines appended since the last read; returns how many were read."""
        with self._read_lock:
            new = self.tail.read_new(self.warnings.append)  # a line still being written is read next time
            if new is None:  # replaced, truncated or rewritten: start over
                self._load()
                return len(self.labels)
            with self._lock:
                for lab in new:
                    self._feed(lab)
            return len(new)

    def append(self, label: Label) -> None:
        """Write one label durably (lock, append, flush, fsync) and apply it. Blocking: run in a thread."""
        append_labels(self.root, [label])
        self.refresh()

    def get(self, key: PairKey) -> Label | None:
        return self.labels.get(key)

    def snapshot(self) -> list[Label]:
        """The current labels, oldest answer first (a copy: safe while other threads append)."""
        with self._lock:
            return list(self.labels.values())

    def consistency(self) -> dict[str, tuple[int, int]]:
        """The labelers' consistency (``lib.store.labels.ConsistencyTracker``) over what was read so far."""
        with self._lock:
            return self.tracker.result()

    def kinds(self) -> Counter[tuple[int, str]]:
        """How many current labels there are of each (answer, source)."""
        with self._lock:
            return Counter(self.tallies.kinds)

    def untouched(self, segments: list[str]) -> int:
        """How many of ``segments`` no current label names."""
        with self._lock:
            return sum(1 for s in segments if s not in self.tallies.touched)

    def count_within(self, segments: list[str]) -> int:
        """How many current labels are of pairs of two of ``segments`` (``pairs_within``)."""
        return len(self.pairs_within(segments))

    def pairs_within(self, segments: list[str]) -> set[PairKey]:
        """The labelled pairs of two of ``segments``: a walk over the labels or over the pairs of
        ``segments``, whichever is shorter."""
        inside = set(segments)
        with self._lock:
            if len(self.labels) <= len(inside) * (len(inside) - 1) // 2:
                return {(a, b) for a, b in self.labels if a in inside and b in inside}
            ordered = sorted(inside)
            return {k for i, a in enumerate(ordered) for b in ordered[i + 1 :] if (k := pair_key(a, b)) in self.labels}

    def keys(self) -> set[PairKey]:
        """The labelled pairs (a copy: safe while other threads append)."""
        with self._lock:
            return set(self.labels)

    def newest_first(self) -> Iterator[tuple[float, int, Label]]:
        """The current labels as ``(time, -seq, label)``, newest first, as they were when called."""
        with self._lock:
            order = list(self.tallies.order)  # pointers copied: no new objects for the collector
        return reversed(order)


@dataclass
class DbState:
    """One segment DB served by the page."""

    index: int
    path: Path  # as the user gave it (shown in the page)
    root: Path  # resolved
    watch: SegmentWatch  # its segment names, kept current as a recorder adds to the DB
    labels: LabelIndex
    bad: dict[str, str] = field(default_factory=dict)  # unreadable segment -> reason
    recent: int = 0  # --recent: pairs from the newest N segments only (0: all)
    _segment_set: set[str] = field(default_factory=set, init=False, repr=False)
    _free: tuple[tuple[int, ...], int] | None = field(default=None, init=False, repr=False)
    _scans: int = field(default=0, init=False, repr=False)
    # (segments, unreadable count, --recent's window of them, whether it is a part): sorted once
    # per change, not per list
    _window: tuple[list[str], int, list[str], bool] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.segments = self.watch.segments
        self._segment_set = set(self.segments)
        self.window()

    @classmethod
    def open(cls, index: int, path: Path, recent: int = 0) -> DbState:
        root = path.resolve()
        return cls(index=index, path=path, root=root, watch=SegmentWatch(root), labels=LabelIndex(root), recent=recent)

    @property
    def name(self) -> str:
        return str(self.path)

    def rescan(self) -> list[str]:
        """Pick up segments written since the last look, listing only changed env directories and
        opening no segment; returns the new ones. Blocking: pages call it off the event loop."""
        new = self.watch.refresh()  # what it ignores it says once (on stderr)
        segments = self.watch.segments
        if segments is not self.segments:
            self._segment_set = set(segments)
            self.segments = segments  # one assignment: the event loop sees the old list or the new one
            self._scans += 1
        self.window()  # here, off the event loop
        return new

    def has_segment(self, rel: str) -> bool:
        """Whether ``rel`` is one of this DB's segments: the only files the server makes clips of."""
        return rel in self._segment_set

    def segment_path(self, rel: str) -> Path:
        """The file of one of this DB's segments; SegmentError if the name or the file is not a
        segment inside the DB (``lib.store.segments.segment_path``)."""
        return segment_path(self.root, rel)

    def usable_segments(self) -> list[str]:
        return [s for s in self.segments if s not in self.bad] if self.bad else self.segments

    def window(self) -> list[str]:
        """The readable segments pairs are drawn from: with ``recent``, the ``recent`` newest
        (picked again only when the segments or the unreadable ones changed); all of them without."""
        segments, bad, kept = self.segments, len(self.bad), self._window
        if kept is not None and kept[0] is segments and kept[1] == bad:
            return kept[2]
        usable = self.usable_segments()
        window = recent_segments(usable, self.recent) if self.recent else usable
        self._window = (segments, bad, window, len(window) < len(usable))
        return window

    def windowed(self) -> bool:
        """Whether pairs come from a part of the readable segments (``recent``)."""
        self.window()
        return self._window is not None and self._window[3]

    def free_pairs(self) -> int:
        """Pairs of readable segments without a current label (approximate: labels of pairs with
        unreadable segments are still subtracted). With ``recent``: pairs of the newest ``recent``
        segments less their labels, counted again only when those changed."""
        window = self.window()
        if not self.windowed():
            n = len(window)
            return max(n * (n - 1) // 2 - len(self.labels.labels), 0)
        key = (self._scans, len(self.bad), self.labels.version)
        if self._free is None or self._free[0] != key:
            n = len(window)
            self._free = (key, n * (n - 1) // 2 - self.labels.count_within(window))
        return max(self._free[1], 0)

    def why_no_pairs(self) -> str:
        """A sentence for the page when this DB offers no pair."""
        n, bad = len(self.segments), len(self.bad)
        if n == 0:
            return f"{self.name} has no segments yet: record some with 01_a2c.py --db-path {self.name}."
        if n - bad < 2:
            extra = f" ({bad} unreadable)" if bad else ""
            return f"{self.name} has {n} segment(s){extra}: at least 2 readable ones are needed to make a pair."
        if 0 < self.recent < n - bad:
            return (
                f"every pair of the {self.recent} newest segments of {self.name} (--recent) is labeled already: "
                "new clips bring new pairs (Resample)."
            )
        return f"every pair of the {n - bad} segments of {self.name} is labeled already."

    def stats(self) -> dict[str, object]:
        """Counts for the Overview page, from the tallies: no walk over the labels."""
        kinds = self.labels.kinds()
        by_answer: Counter[int] = Counter()
        by_source: Counter[str] = Counter()
        for (answer, source), n in kinds.items():
            by_answer[answer] += n
            by_source[source] += n
        return {
            "segments": len(self.segments),
            "unreadable": len(self.bad),
            "labels": kinds.total(),
            "by_answer": by_answer,
            "by_source": by_source,
            "untouched": self.labels.untouched(self.segments),
            "free_pairs": self.free_pairs(),
            "consistency": self.labels.consistency(),
            "recent": min(self.recent, len(self.segments)) if self.recent else 0,
        }


@dataclass
class PairItem:
    """One pair in a tab's list. status: open, answered, skipped (unreadable), taken (labeled elsewhere)."""

    db: int
    a: str
    b: str
    status: str = "open"
    answer: int | None = None
    note: str = ""
    control: bool = False  # an answered pair shown again, order swapped (--control-rate)

    @property
    def key(self) -> PairKey:
        return pair_key(self.a, self.b)


class AppState:
    """Server-wide state shared by all tabs: DBs, clip store, pairs reserved by tabs."""

    def __init__(
        self,
        dbs: list[DbState],
        pairs: int = 20,
        seed: int | None = None,
        labeler: str | None = None,
        sampling: str = "random",
        beliefs: list[SegmentBeliefs] | None = None,
        pool: int | None = None,
        control_rate: float = 0.0,
        looks: list[SegmentLooks] | None = None,
    ):
        self.dbs = dbs
        self.pairs = pairs
        self.sampling = sampling  # lib.label_ui.sampling mode; beliefs: the reward model's view of each DB
        self.beliefs = beliefs
        self.looks = looks  # --sampling rare: each DB's segment looks
        self.pool = pool
        self.control_rate = control_rate
        self.labeler = labeler
        self.seed_rng = np.random.default_rng(seed)
        self.reserved: dict[tuple[int, PairKey], str] = {}  # (db, pair) -> tab id
        self.lock = threading.Lock()  # guards ``reserved``: tabs pick their lists off the event loop
        self.notices: list[str] = []  # server-wide, e.g. unreadable segments
        self.generation = 0  # grows when a rescan finds new segments: lists prepared before are stale
        self.clips = None  # set by the server: a lib.label_ui.clips.ClipStore

    def new_rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed_rng.integers(2**63))

    def rescan(self) -> None:
        """Every DB's new segments (``DbState.rescan``), folded into the rare looks and the model's
        views at once, so picking the next list never waits on them. Blocking: run off the event
        loop."""
        for d in self.dbs:
            new = d.rescan()
            if not new:
                continue
            self.generation += 1
            if self.looks is not None:
                self.looks[d.index].fold(new)
            if self.beliefs is not None and self.sampling in MODEL_MODES:
                self.beliefs[d.index].all(new)

    def mark_bad(self, db: int, rel: str, reason: str) -> None:
        d = self.dbs[db]
        if rel not in d.bad:
            d.bad[rel] = reason
            self.notices.append(f"skipped unreadable segment {d.name}/{rel}: {reason}")

    def why_no_pairs(self) -> list[str]:
        return [d.why_no_pairs() for d in self.dbs]

    def sample(
        self,
        count: int,
        rng: np.random.Generator,
        tab_id: str,
        exclude: set[tuple[int, PairKey]],
        is_open: Callable[[], bool] = lambda: True,
    ) -> list[PairItem]:
        """Up to ``count`` new pairs, both segments from one DB, none labeled, in another tab's list
        or in ``exclude``; reserved for ``tab_id``. Never hangs: fewer (or none) when the DBs run
        out. Blocking: the page calls it off the event loop. Pairs another tab claimed meanwhile are
        drawn again, so two tabs that open at once both get full lists. Returns nothing, and
        reserves nothing, when ``is_open()`` (read under ``lock``) says the tab was closed
        meanwhile."""
        out: list[PairItem] = []
        for _ in range(SAMPLE_TRIES):
            picked = self._pick(count - len(out), rng, exclude | {(item.db, item.key) for item in out})
            with self.lock:
                if not is_open():
                    return []
                mine = [item for item in picked if (item.db, item.key) not in self.reserved]
                for item in mine:
                    self.reserved[(item.db, item.key)] = tab_id
            out += mine
            if len(out) >= count or len(mine) == len(picked):  # full, or the DBs ran out
                break
        return self._with_controls(out, rng, exclude)

    def _pick(self, count: int, rng: np.random.Generator, exclude: set[tuple[int, PairKey]]) -> list[PairItem]:
        """Up to ``count`` pairs for ``sample``, none labeled, reserved (as ``reserved`` was when
        read) or in ``exclude``; not reserved yet."""
        free = np.array([d.free_pairs() for d in self.dbs], dtype=np.float64)
        if count <= 0 or free.sum() <= 0:
            return []
        # Split the list over the DBs in proportion to what each has left to label.
        want = rng.multinomial(count, free / free.sum())
        with self.lock:
            reserved = list(self.reserved)
        out: list[PairItem] = []
        for d, k in zip(self.dbs, want, strict=True):
            if k == 0:
                continue
            segs = d.window()
            taken = d.labels.pairs_within(segs) if d.windowed() else d.labels.keys()
            others = [key for (i, key) in (*reserved, *exclude) if i == d.index]
            # only pairs of the window: what is left is counted as its pairs less these
            taken.update(pairs_within(set(others), segs) if d.windowed() else others)
            beliefs = self.beliefs[d.index] if self.beliefs is not None else None
            looks = self.looks[d.index] if self.looks is not None else None
            for a, b in choose_pairs(segs, taken, int(k), rng, self.sampling, beliefs, self.pool, looks):
                out.append(PairItem(d.index, a, b))
        if self.sampling == "random":  # the model's modes keep their order: most informative first
            order = rng.permutation(len(out))
            out = [out[i] for i in order]
        return out

    def _with_controls(
        self, items: list[PairItem], rng: np.random.Generator, exclude: set[tuple[int, PairKey]]
    ) -> list[PairItem]:
        """Each new pair brings, with probability ``control_rate``, a control: a pair answered
        before (by this labeler, else by a person), order swapped, at a random place, not marked.
        ``exclude`` (the tab's pairs so far) keeps a control from coming twice."""
        n = int(rng.binomial(len(items), self.control_rate)) if items and self.control_rate > 0 else 0
        if n == 0:
            return items
        pool = [
            (d.index, lab)
            for d in self.dbs
            for lab in d.labels.snapshot()
            if lab.label in (FIRST_BETTER, SECOND_BETTER, EQUAL)
            and (lab.extra.get("labeler") == self.labeler if self.labeler else lab.source == "human")
            and (d.index, lab.key) not in exclude
        ]
        out = list(items)
        for k in rng.permutation(len(pool))[:n]:
            db, lab = pool[k]
            control = PairItem(db, lab.sample2, lab.sample1, control=True)
            out.insert(int(rng.integers(len(out) + 1)), control)
        return out

    def model_views(self, db: int, a: str, b: str) -> tuple[SegmentView, SegmentView, float] | None:
        """With --reward: the model's views of two segments and its P(a better than b) (the
        members' mean); None without a model or when a segment is unreadable."""
        if self.beliefs is None:
            return None
        va, vb = self.beliefs[db].get(a), self.beliefs[db].get(b)
        if va is None or vb is None:
            return None
        return va, vb, float(preference(va, vb).mean())

    def release(self, tab_id: str, items: list[PairItem]) -> None:
        with self.lock:
            for item in items:
                if self.reserved.get((item.db, item.key)) == tab_id:
                    del self.reserved[(item.db, item.key)]

    def release_all(self, tab_id: str) -> None:
        """Every pair reserved for ``tab_id`` goes back to the pool (under ``lock``: the caller's too)."""
        for key in [key for key, tab in self.reserved.items() if tab == tab_id]:
            del self.reserved[key]

    def reserve(self, tab_id: str, item: PairItem) -> None:
        with self.lock:
            self.reserved[(item.db, item.key)] = tab_id

    def make_label(self, item: PairItem, value: int, **extra: object) -> Label:
        if self.labeler:
            extra.setdefault("labeler", self.labeler)
        return Label(item.a, item.b, value, time=time.time(), source="human", extra=dict(extra))


@dataclass
class Answer:
    """An entry of a tab's undo history: the pair and its label before this tab's answer."""

    item: PairItem
    before: Label | None


class TabSession:
    """One browser tab: its list of pairs, the selected one, its answers and undo history."""

    def __init__(self, app: AppState, tab_id: str, rng: np.random.Generator | None = None) -> None:
        self.app = app
        self.tab_id = tab_id
        self.rng = rng if rng is not None else app.new_rng()
        self.items: list[PairItem] = []
        self.current: int | None = None
        self.history: list[Answer] = []
        self.prepared: list[PairItem] | None = None  # the next list, made near the end of this one
        self.prepared_at = 0  # ``app.generation`` when it was made
        self.seen: set[tuple[int, PairKey]] = set()  # every pair this tab was given
        self.show_seq = 0
        self.closed = False  # set (under ``app.lock``) when the tab is gone: nothing is reserved for it after
        self._drawing = threading.Lock()  # one list picked at a time (``draw``, ``prepare``), in a thread

    # --- the list ---------------------------------------------------------------------------

    def resample(self) -> int:
        """A new list of ``app.pairs`` pairs; the open pairs of the old list go back to the pool:
        ``use(draw())``. The page runs ``draw`` off the event loop and ``use`` on it."""
        return self.use(self.draw())

    def draw(self) -> list[PairItem]:
        """The next list, its pairs reserved: the one ``upcoming`` prepared, if no segment came
        since, else a new one. Blocking: the page runs it off the event loop; the list on show is
        not touched."""
        with self._drawing:
            prepared, self.prepared = self.prepared, None
            if prepared is not None and (self.prepared_at != self.app.generation or not prepared):
                # made before new segments came, or when none was left: pick again
                self.app.release(self.tab_id, prepared)
                self.seen.difference_update((it.db, it.key) for it in prepared)
                prepared = None
            return prepared if prepared is not None else self._sample()

    def use(self, items: list[PairItem]) -> int:
        """Put ``items`` (``draw``'s) on show as the tab's list, the first open pair selected; the
        open pairs of the old list go back to the pool. Returns the list's length."""
        self.app.release(self.tab_id, [it for it in self.items if it.status == "open"])
        self.items = items
        self.current = None
        self.select_next(start=0)
        return len(items)

    def prepare(self) -> None:
        """Pick the next list now, if none is prepared (``upcoming``). Blocking: run off the event
        loop."""
        with self._drawing:
            if self.prepared is None:
                at = self.app.generation  # before the pick: a rescan meanwhile makes it stale
                self.prepared, self.prepared_at = self._sample(), at

    def _sample(self) -> list[PairItem]:
        items = self.app.sample(self.app.pairs, self.rng, self.tab_id, self.seen, lambda: not self.closed)
        self.seen.update((it.db, it.key) for it in items)
        return items

    def close(self) -> None:
        """The tab is gone: every pair it holds goes back to the pool, and a list still being drawn
        for it (in a thread) reserves nothing when it ends (``AppState.sample``)."""
        with self.app.lock:
            self.closed = True
            self.app.release_all(self.tab_id)

    @property
    def answered(self) -> int:
        """Pairs answered in this tab (and not taken back)."""
        return len({(e.item.db, e.item.key) for e in self.history})

    @property
    def item(self) -> PairItem | None:
        return None if self.current is None else self.items[self.current]

    def still_open(self, item: PairItem) -> bool:
        """Whether a pair can still be offered; marks it taken/skipped when it can't."""
        if item.status != "open":
            return False
        db = self.app.dbs[item.db]
        if not item.control and db.labels.get(item.key) is not None:
            item.status, item.note = "taken", "labeled elsewhere"
            self.app.release(self.tab_id, [item])
            return False
        bad = [s for s in (item.a, item.b) if s in db.bad]
        if bad:
            item.status, item.note = "skipped", f"unreadable: {', '.join(bad)}"
            self.app.release(self.tab_id, [item])
            return False
        return True

    def select_next(self, start: int | None = None) -> PairItem | None:
        """Select the next open pair after the current one (wrapping around); None when none is left."""
        n = len(self.items)
        first = start if start is not None else (0 if self.current is None else self.current + 1)
        for k in range(n):
            i = (first + k) % n
            if self.still_open(self.items[i]):
                self.current = i
                return self.items[i]
        self.current = None
        return None

    def select(self, index: int) -> PairItem | None:
        """Select a pair of the list by position (clicking it); answered pairs can be re-answered."""
        if 0 <= index < len(self.items):
            item = self.items[index]
            if item.status in ("open", "answered"):
                self.current = index
                return item
        return None

    def upcoming(self, n: int = 2, prepare: bool = True) -> list[PairItem]:
        """The next ``n`` open pairs after the current one, to prefetch. Near the end of the list
        they come from the next list, prepared here if ``prepare`` (else only if the page prepared
        it)."""
        out: list[PairItem] = []
        items, current = self.items, self.current
        if current is None:
            return out
        for k in range(1, len(items)):
            it = items[(current + k) % len(items)]
            if it.status == "open" and it is not items[current]:
                out.append(it)
                if len(out) == n:
                    return out
        if prepare:
            self.prepare()
        return out + (self.prepared or [])[: n - len(out)]

    # --- answers ----------------------------------------------------------------------------

    def answer(self, value: int) -> tuple[PairItem, Label] | None:
        """Answer the selected pair and select the next open one. Returns the pair and the label
        to write, or None when nothing is selected."""
        if value not in VALID_LABELS:
            raise ValueError(f"answer must be one of {VALID_LABELS}, got {value}")
        item = self.item
        if item is None:
            return None
        before = None if item.control else self.app.dbs[item.db].labels.get(item.key)
        label = self.app.make_label(item, value, **({"control": True} if item.control else {}))
        item.status, item.answer, item.note = "answered", value, ""
        self.history.append(Answer(item, before))
        self.select_next()
        return item, label

    def saved(self, item: PairItem) -> None:
        """The answer's label is in the index: let the pair go. Until then it stays reserved, so
        that no list drawn meanwhile holds it."""
        self.app.release(self.tab_id, [item])

    def answer_failed(self, item: PairItem) -> None:
        """Saving the answer failed: the pair is open again and selected (still reserved for this tab)."""
        for k in range(len(self.history) - 1, -1, -1):
            if self.history[k].item is item:
                del self.history[k]
                break
        item.status, item.answer = "open", None
        self.current = next(i for i, it in enumerate(self.items) if it is item)

    def undo(self) -> tuple[PairItem, Label] | None:
        """Take this tab's last answer back: the pair is open and selected again, and the label to
        write restores what the pair had before (usually nothing: a RETRACTED line)."""
        if not self.history:
            return None
        entry = self.history.pop()
        item, before = entry.item, entry.before
        if before is None:
            control = {"control": True} if item.control else {}
            label = self.app.make_label(item, RETRACTED, undo=True, **control)
        else:
            label = Label(
                before.sample1,
                before.sample2,
                before.label,
                time=time.time(),
                source=before.source,
                extra={**before.extra, "undo": True},
            )
        if before is None:
            item.status, item.answer, item.note = "open", None, ""
            if not item.control:
                self.app.reserve(self.tab_id, item)
        else:  # an answer that replaced an earlier one: the earlier one is back
            mine = any(e.item is item for e in self.history)
            item.status, item.answer = ("answered", before.label) if mine else ("taken", before.label)
            item.note = "" if mine else "labeled elsewhere"
        if not any(it is item for it in self.items):  # the list was resampled since: bring it back
            self.items.insert(self.current or 0, item)
        self.current = next(i for i, it in enumerate(self.items) if it is item)
        return item, label


ANSWER_KEYS = {"1": 1, "2": 2, "0": 0, "x": CANT_TELL, "X": CANT_TELL}
