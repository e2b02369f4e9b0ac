"""Which pairs to ask about: ``02_label_ui.py --sampling`` (the page and ``--oracle`` alike).
``random`` draws uniformly from the unlabeled pairs (the book's way, the default). ``uncertain`` and
``disagree`` take, from a pool of random pairs (``--pool``), those whose predicted preference is
closest to 50/50, or varies most across an ensemble's members (Christiano et al. 2017). ``exploits``
puts first the segments the model pays most above their true return. ``rare`` (no model) puts first
the segments that look least like the others: what random pairs seldom show is where a label is
worth most. ``--recent N`` draws only from the N newest segments by the step counter in their names
(no file is opened, and it survives a copy of the DB)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lib.core.errors import UserError, warn
from lib.store.labels import pair_key, sample_unlabeled_pairs
from lib.store.segments import SegmentError, read_segment, segment_env_step

if TYPE_CHECKING:  # torch is imported only where a model is loaded
    from lib.models.reward import RewardPredictor

SAMPLING_MODES = ("random", "uncertain", "disagree", "exploits", "rare")
# Modes the measurements retired: each refused in one line that says why (lib.core.settings ``retired``).
RETIRED_SAMPLING_MODES = {
    "gauge": "was retired after commit 4c43ee0: held-out agreement below rare's wherever both ran, "
    "5-91% on held-out diver-climb pairs, the per-step climb gap unmoved (docs/results.md); give rare"
}
MODEL_MODES = ("uncertain", "disagree", "exploits")  # the modes that need --reward
POOL_FACTOR = 10  # default pool of candidate pairs: 10x the pairs wanted
LOOK_BLOCK = 6  # rare: a look averages blocks of 6x6 pixels (210x160 -> 35x26)
RARE_NEIGHBOURS = 5  # rare: rarity is the mean distance to this many nearest looks

Pair = tuple[str, str]


@dataclass
class SegmentView:
    """What the reward model believes about one segment."""

    member_returns: np.ndarray  # (K,) each member's predicted return (sum of its per-step rewards)
    steps: np.ndarray  # (T,) the per-step prediction (the members' mean), for the page's plot
    true_return: float | None  # None: a DB without true rewards (the book's)


def preference(a: SegmentView, b: SegmentView) -> np.ndarray:
    """Each member's probability that ``a`` is better than ``b``: (K,)."""
    d = np.clip(a.member_returns - b.member_returns, -60.0, 60.0)
    return 1.0 / (1.0 + np.exp(-d))


class SegmentBeliefs:
    """The reward model's view of one DB's segments, each computed once, on demand. An unreadable
    segment warns once and has no view (None); a DB whose frames do not fit the model is a
    UserError."""

    def __init__(self, rm: RewardPredictor, root: str | os.PathLike, warn: Callable[[str], None] = warn):
        self.rm = rm
        self.root = Path(root)
        self.warn = warn
        self.views: dict[str, SegmentView | None] = {}

    def get(self, rel: str) -> SegmentView | None:
        if rel not in self.views:
            self.views[rel] = self._compute(rel)
        return self.views[rel]

    def _compute(self, rel: str) -> SegmentView | None:
        try:
            seg = read_segment(self.root, rel)
        except SegmentError as e:
            self.warn(f"skipped: {e}")
            return None
        if tuple(seg.frames.shape[1:]) != tuple(self.rm.frame_shape):
            raise UserError(
                f"reward model {self.rm.path} reads {'x'.join(map(str, self.rm.frame_shape))} frames, "
                f"DB {self.root} holds {'x'.join(map(str, seg.frames.shape[1:]))}: "
                "use a model trained on this kind of DB"
            )
        if seg.actions.size and int(seg.actions.max()) >= self.rm.n_actions:
            raise UserError(
                f"reward model {self.rm.path} knows {self.rm.n_actions} actions, {self.root}/{rel} uses "
                f"action {int(seg.actions.max())}: a model of another game"
            )
        members = self.rm.predict_clip(seg, members=True).double().cpu().numpy()
        true = None if seg.rewards is None else float(np.sum(seg.rewards, dtype=np.float64))
        return SegmentView(members.sum(1), members.mean(0).astype(np.float32), true)

    def all(self, segments: list[str], log: Callable[[str], None] | None = None) -> None:
        """Compute every segment's view now (the page does this before serving)."""
        todo = [s for s in segments if s not in self.views]
        for n, rel in enumerate(todo, 1):
            self.get(rel)
            if log is not None and (n % 200 == 0 or n == len(todo)):
                log(f"... reward model view: {n}/{len(todo)} segments of {self.root}")


def exploit_ranking(views: dict[str, SegmentView]) -> list[tuple[str, float]]:
    """Segments with true rewards, most exploit-like first: z(predicted return) - z(true return),
    both standardised over the given segments."""
    rels = [r for r, v in views.items() if v is not None and v.true_return is not None]
    if not rels:
        return []
    pred = np.array([views[r].member_returns.mean() for r in rels])
    true = np.array([views[r].true_return for r in rels], dtype=np.float64)

    def z(x: np.ndarray) -> np.ndarray:
        sd = x.std()
        return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)

    gap = z(pred) - z(true)
    order = np.argsort(-gap, kind="stable")
    return [(rels[i], float(gap[i])) for i in order]


class SegmentLooks:
    """``rare``'s view of one DB: each readable segment's look (its mean frame over ``LOOK_BLOCK``
    pixel blocks, colour kept) and rarity (mean distance to its ``RARE_NEIGHBOURS`` nearest looks).
    ``fold`` adds each segment once, so a new segment costs one read and one row of distances.
    Thread-safe (a page folds new segments off its event loop)."""

    def __init__(self, root: str | os.PathLike, warn: Callable[[str], None] = warn):
        self.root = Path(root)
        self.warn = warn
        self.looks: dict[str, np.ndarray | None] = {}
        self._groups: dict[tuple[int, ...], _Neighbours] = {}  # by the look's shape
        self._folded: set[str] = set()
        self._lock = threading.RLock()

    def look(self, rel: str) -> np.ndarray | None:
        with self._lock:
            if rel not in self.looks:
                try:
                    frames = read_segment(self.root, rel).frames
                except SegmentError as e:
                    self.warn(f"skipped: {e}")
                    frames = None
                self.looks[rel] = None if frames is None else block_mean(frames.mean(0, dtype=np.float32))
            return self.looks[rel]

    def fold(self, segments: list[str]) -> None:
        """Read the looks of the segments not seen yet and fold them into the nearest distances."""
        with self._lock:
            new: dict[tuple[int, ...], list[str]] = {}
            for rel in segments:
                if rel in self._folded:
                    continue
                self._folded.add(rel)
                if (v := self.look(rel)) is not None:
                    new.setdefault(v.shape, []).append(rel)
            for shape, rels in new.items():
                group = self._groups.setdefault(shape, _Neighbours())
                group.add(rels, np.stack([self.looks[r].ravel() for r in rels]))

    def rarity(self, segments: list[str]) -> dict[str, float]:
        """Each readable segment's mean distance to its nearest looks (of the same shape) among
        ``segments``: larger is rarer. Every segment folded in so far: from the kept distances;
        a part of them (``--recent``): computed over that part."""
        with self._lock:
            self.fold(segments)
            asked = {rel for rel in segments if self.looks.get(rel) is not None}
            if sum(len(g.rels) for g in self._groups.values()) == len(asked):
                return {rel: r for g in self._groups.values() for rel, r in g.rarity().items()}
            by_shape: dict[tuple[int, ...], list[str]] = {}
            for rel in sorted(asked):
                by_shape.setdefault(self.looks[rel].shape, []).append(rel)
            out: dict[str, float] = {}
            for rels in by_shape.values():
                part = _Neighbours()
                part.add(rels, np.stack([self.looks[r].ravel() for r in rels]))
                out.update(part.rarity())
            return out


class _Neighbours:
    """Looks of one shape and, for each, its ``RARE_NEIGHBOURS`` smallest distances to the others,
    kept as looks are added in chunks (never a 1000 x n matrix at once)."""

    CHUNK = 256

    def __init__(self) -> None:
        self.rels: list[str] = []
        self.x = np.zeros((0, 0), dtype=np.float64)  # (n, d) the looks, one per row
        self.sq = np.zeros(0, dtype=np.float64)  # (n,) their squared norms
        self.near = np.zeros((0, RARE_NEIGHBOURS), dtype=np.float64)  # (n, k) ascending, inf-padded

    def add(self, rels: list[str], looks: np.ndarray) -> None:
        """Add ``looks`` (m, d) of segments ``rels``."""
        for i in range(0, len(rels), self.CHUNK):
            self._add(rels[i : i + self.CHUNK], looks[i : i + self.CHUNK].astype(np.float64))

    def _add(self, rels: list[str], x: np.ndarray) -> None:
        n, m = len(self.rels), len(rels)
        self.x = x if n == 0 else np.concatenate([self.x, x])
        sq = (x * x).sum(1)
        self.sq = np.concatenate([self.sq, sq])
        # distances of the new looks to every look, themselves included: (m, n + m)
        d = np.sqrt(np.maximum(sq[:, None] + self.sq[None, :] - 2 * x @ self.x.T, 0.0))
        d[np.arange(m), n + np.arange(m)] = np.inf
        k = RARE_NEIGHBOURS
        old = np.sort(np.concatenate([self.near, d[:, :n].T], axis=1), axis=1)[:, :k]
        new = np.sort(d, axis=1)[:, :k]
        if new.shape[1] < k:
            new = np.pad(new, ((0, 0), (0, k - new.shape[1])), constant_values=np.inf)
        self.near = np.concatenate([old, new])
        self.rels += rels

    def rarity(self) -> dict[str, float]:
        """Mean of each look's nearest distances (as many as there are others, at most k)."""
        k = min(RARE_NEIGHBOURS, len(self.rels) - 1)
        near = self.near[:, :k].mean(1) if k > 0 else np.zeros(len(self.rels))
        return dict(zip(self.rels, near.tolist(), strict=True))


def block_mean(frame: np.ndarray, block: int = LOOK_BLOCK) -> np.ndarray:
    """(H, W[, C]) -> (H // block, W // block[, C]) block averages (the edge rows and columns that
    do not fill a block are left out)."""
    h, w = frame.shape[0] // block * block, frame.shape[1] // block * block
    x = frame[:h, :w].reshape(h // block, block, w // block, block, *frame.shape[2:])
    return x.mean(axis=(1, 3))


def choose_pairs(
    segments: list[str],
    taken: set[tuple[str, str]],
    count: int,
    rng: np.random.Generator,
    mode: str = "random",
    beliefs: SegmentBeliefs | None = None,
    pool: int | None = None,
    looks: SegmentLooks | None = None,
    recent: int | None = None,
) -> list[Pair]:
    """Up to ``count`` unlabeled pairs of ``segments`` (none in ``taken``), picked by ``mode``;
    the order within a pair is random. ``beliefs`` is needed for the model modes, ``looks`` for
    rare. ``recent``: only pairs of the ``recent`` newest segments (``recent_segments``)."""
    if mode not in SAMPLING_MODES:
        raise ValueError(f"unknown sampling mode {mode!r}")
    if recent and recent < len(segments):
        segments = recent_segments(segments, recent)
        taken = pairs_within(taken, segments)
    if mode == "random" or count <= 0:
        return sample_unlabeled_pairs(segments, taken, count, rng)
    if mode == "rare":
        if looks is None:
            raise ValueError("sampling 'rare' needs the segments' looks")
        return _rare_pairs(segments, taken, count, rng, looks)
    if beliefs is None:
        raise ValueError(f"sampling {mode!r} needs the reward model's beliefs")
    if mode == "exploits":
        return _exploit_pairs(segments, taken, count, rng, beliefs)
    if mode == "disagree" and beliefs.rm.ensemble < 2:
        raise UserError("--sampling disagree needs an ensemble reward model (03_reward_train.py --ensemble K, K >= 2)")
    size = max(count, pool if pool is not None else POOL_FACTOR * count)
    scored: list[tuple[float, Pair]] = []
    for a, b in sample_unlabeled_pairs(segments, taken, size, rng):
        va, vb = beliefs.get(a), beliefs.get(b)
        if va is None or vb is None:
            continue
        p = preference(va, vb)
        # lower comes first: closest to 50/50, or the largest spread of the members
        key = abs(float(p.mean()) - 0.5) if mode == "uncertain" else -float(p.var())
        scored.append((key, (a, b)))
    scored.sort(key=lambda kv: kv[0])  # stable: equal keys keep the pool's random order
    return [pair for _, pair in scored[:count]]


def recent_segments(segments: list[str], n: int | None) -> list[str]:
    """The ``n`` newest of ``segments`` (names ``NN/SSSSSSSS.dat``), newest by the step counter
    SSSSSSSS, ties by env index, in the order given; all of them when ``n`` is 0 or None."""
    if not n or n >= len(segments):
        return segments
    newest = set(sorted(segments, key=lambda rel: segment_env_step(rel)[::-1])[-n:])
    return [rel for rel in segments if rel in newest]


def pairs_within(pairs: set[tuple[str, str]], segments: list[str]) -> set[tuple[str, str]]:
    """The pairs whose two segments are both in ``segments``."""
    inside = set(segments)
    return {p for p in pairs if p[0] in inside and p[1] in inside}


def _exploit_pairs(
    segments: list[str], taken: set[tuple[str, str]], count: int, rng: np.random.Generator, beliefs: SegmentBeliefs
) -> list[Pair]:
    views = {rel: beliefs.get(rel) for rel in segments}
    ranking = exploit_ranking(views)
    if not ranking and any(v is not None for v in views.values()):
        raise UserError(f"--sampling exploits needs true rewards; DB {beliefs.root} has none (the book's format)")
    readable = [r for r, v in views.items() if v is not None]
    return _paired_with_random([rel for rel, _ in ranking], readable, taken, count, rng)


def _rare_pairs(
    segments: list[str], taken: set[tuple[str, str]], count: int, rng: np.random.Generator, looks: SegmentLooks
) -> list[Pair]:
    """``rare_ranking``'s segments in order, each with a random partner."""
    ranking = rare_ranking(segments, taken, looks)
    return _paired_with_random(ranking, sorted(ranking), taken, count, rng)


def rare_ranking(segments: list[str], taken: set[tuple[str, str]], looks: SegmentLooks) -> list[str]:
    """The readable segments, the least-labelled (in ``taken``) first, the rarest first among
    equals."""
    rarity = looks.rarity(segments)
    labelled: dict[str, int] = {}
    for a, b in taken:
        labelled[a], labelled[b] = labelled.get(a, 0) + 1, labelled.get(b, 0) + 1
    return sorted(rarity, key=lambda rel: (labelled.get(rel, 0), -rarity[rel]))


def _paired_with_random(
    ranking: list[str], readable: list[str], taken: set[tuple[str, str]], count: int, rng: np.random.Generator
) -> list[Pair]:
    """Up to ``count`` pairs: the segments of ``ranking`` in order, each with a random readable
    partner it has no label with (in random order within the pair)."""
    seen = set(taken)
    out: list[Pair] = []
    for rel in ranking:
        if len(out) >= count:
            break
        partners = [p for p in readable if p != rel and pair_key(rel, p) not in seen]
        if not partners:
            continue
        other = partners[int(rng.integers(len(partners)))]
        seen.add(pair_key(rel, other))
        out.append((rel, other) if rng.random() < 0.5 else (other, rel))
    return out
