"""The preference data stage 3 trains on: labeled pairs over segments, and the networks' inputs made
from them. ``load_preferences`` reads every DB's labels and each segment once, keeping it compressed
(1,000 labels may touch 2,000 segments: 10 GB decoded). ``model_inputs`` makes a network's input
(``lib.models.reward.reward_input``); ``step_features`` caches the diff net's per-step features,
which hold no trained weight."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lib.atari.envs import DEFAULT_ENV, game_of, rom_name
from lib.core.errors import UserError, warn
from lib.models.reward import INPUT_CHUNK, DiffRewardModel, reward_input
from lib.store.labels import LABELS_FILE, LEGACY_LABELS_FILE, Warn, load_labels
from lib.store.segment_writer import encode_segment
from lib.store.segments import SegmentError, check_same_game, decode_segment, is_compressed, read_segment_bytes

Log = Callable[[str], None]


@dataclass
class PreferenceData:
    """Labeled pairs over compressed segments (S unique segments, P usable pairs).

    blobs:        S compressed segment files (``model_inputs`` decodes them)
    names:        S "<db>/<NN/SSSSSSSS.dat>" names for messages
    lengths:      (S,) int64    steps per segment
    true_returns: (S,) float64  sum of true rewards; NaN where the segment has none (legacy DB)
    first/second: (P,) int64    segment index of a pair's sample1 / sample2
    mu:           (P,) float32  P(sample1 better): 1.0, 0.0 or 0.5 (tie)
    pair_labels:  P (db index into ``dbs``, sample1, sample2) as labelled: which pair each is
    """

    blobs: list[bytes]
    names: list[str]
    lengths: np.ndarray
    true_returns: np.ndarray
    first: np.ndarray
    second: np.ndarray
    mu: np.ndarray
    env_id: str
    game: str
    n_actions: int
    action_meanings: tuple[str, ...] | None
    frame_shape: tuple[int, int, int]
    dbs: list[str]
    skipped: dict[str, int] = field(default_factory=dict)
    pair_labels: list[tuple[int, str, str]] = field(default_factory=list)
    # the diff net's features and actions per segment, made on first use (``step_features``): 60 KB
    # a 50-step segment, against decoding 5 MB and resizing it again every epoch
    feature_cache: dict[tuple[Any, int], torch.Tensor] = field(default_factory=dict, repr=False)
    step_actions: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def n_pairs(self) -> int:
        return len(self.mu)

    @property
    def n_segments(self) -> int:
        return len(self.blobs)

    @property
    def has_true_returns(self) -> bool:
        return bool(np.isfinite(self.true_returns).any())

    @property
    def compressed_bytes(self) -> int:
        return sum(len(b) for b in self.blobs)


_ACTIONS_CACHE: dict[str, tuple[int, tuple[str, ...]]] = {}


def game_actions(env_id: str) -> tuple[int, tuple[str, ...]]:
    """(action count, action meanings) of a game, from the ROM (for legacy segments that lack them)."""
    if env_id not in _ACTIONS_CACHE:
        from lib.atari.envs import AtariVec

        env = AtariVec(env_id, n_envs=1)
        _ACTIONS_CACHE[env_id] = (env.n_actions, tuple(env.action_meanings))
        env.close()
    return _ACTIONS_CACHE[env_id]


@dataclass
class _SegmentTable:
    """The segments the labels touch, each read once and kept compressed: the columns of
    ``PreferenceData`` being built, plus what the segments say about their game."""

    blobs: list[bytes] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    index: dict[tuple[int, str], int | str] = field(default_factory=dict)  # (db, rel) -> row, or why not
    games: dict[str, str] = field(default_factory=dict)  # game -> first env id seen
    meanings: tuple[str, ...] | None = None
    frame_shape: tuple[int, int, int] | None = None
    max_action: int = -1
    legacy: int = 0
    bad_files: dict[str, int] = field(default_factory=lambda: {"missing": 0, "unreadable": 0})
    warn: Warn = warn  # where a broken segment's one line goes

    def row(self, di: int, root: Path, rel: str) -> int | str:
        """The row of segment ``rel`` of DB number ``di`` (read on first use), or "missing" /
        "unreadable"."""
        key = (di, rel)
        if key not in self.index:
            got = _read_segment(root, rel, self.warn)
            if isinstance(got, str):
                self.bad_files[got] += 1
                self.index[key] = got
            else:
                self.index[key] = self._add(f"{root}/{rel}", *got)
        return self.index[key]

    def _add(self, name: str, blob: bytes, meta: dict[str, Any]) -> int:
        if self.frame_shape is not None and meta["frame_shape"] != self.frame_shape:
            raise UserError(
                f"segment {name} has frames {meta['frame_shape']}, others {self.frame_shape}: "
                f"train on DBs with one frame size"
            )
        self.frame_shape = meta["frame_shape"]
        self.blobs.append(blob)
        self.names.append(name)
        self.lengths.append(meta["length"])
        self.returns.append(meta["true_return"])
        self.legacy += meta["legacy"]
        if meta["env_id"]:
            self.games.setdefault(game_of(meta["env_id"]), meta["env_id"])
        self.meanings = self.meanings or meta["meanings"]
        self.max_action = max(self.max_action, meta["max_action"])
        return len(self.blobs) - 1


@dataclass
class _Pairs:
    """Usable labeled pairs (rows of ``_SegmentTable``) and how many labels were left out, why."""

    first: list[int] = field(default_factory=list)
    second: list[int] = field(default_factory=list)
    mu: list[float] = field(default_factory=list)
    labels: list[tuple[int, str, str]] = field(default_factory=list)  # (db index, sample1, sample2)
    counts: Counter[str] = field(default_factory=Counter)


def _read_db_pairs(di: int, root: Path, table: _SegmentTable, pairs: _Pairs, log: Log) -> None:
    """Add the usable labels of one DB to ``pairs`` and log one line about it."""
    if not (root / LABELS_FILE).is_file() and not (root / LEGACY_LABELS_FILE).is_file():
        raise UserError(f"DB {root} has no labels ({LABELS_FILE}): label pairs with 02_label_ui.py first")
    labels = load_labels(root, warn=table.warn)
    counts: Counter[str] = Counter(labels=len(labels))
    for lab in labels.values():
        pref = lab.preference
        if pref is None:
            counts["cant_tell"] += 1
            continue
        a, b = table.row(di, root, lab.sample1), table.row(di, root, lab.sample2)
        if isinstance(a, str) or isinstance(b, str):
            counts["missing" if "missing" in (a, b) else "unreadable"] += 1
            continue
        pairs.first.append(a)
        pairs.second.append(b)
        pairs.mu.append(pref)
        pairs.labels.append((di, lab.sample1, lab.sample2))
    pairs.counts.update(counts)
    left_out = {
        "cant_tell": "can't tell left out",
        "missing": "left out: segment file missing",
        "unreadable": "left out: segment file unreadable",
    }
    extra = [f"{counts[k]} {text}" for k, text in left_out.items() if counts[k]]
    used = counts["labels"] - sum(counts[k] for k in left_out)
    log(f"{root}: {counts['labels']} labels, {used} usable" + (f" ({'; '.join(extra)})" if extra else ""))


def _check_usable(pairs: _Pairs, table: _SegmentTable, where: str) -> None:
    """UserError with one line when the labels leave nothing to learn an order from."""
    total, n = pairs.counts, len(pairs.mu)
    if total["labels"] == 0:
        raise UserError(f"no labels in {where}: label pairs with 02_label_ui.py first")
    if n == 0:
        why = []
        if total["cant_tell"]:
            why.append(f'{total["cant_tell"]} are "can\'t tell"')
        if total["missing"]:
            why.append(f"{total['missing']} have missing segment files ({table.bad_files['missing']} files)")
        if total["unreadable"]:
            why.append(f"{total['unreadable']} have unreadable segment files")
        raise UserError(f"no usable labels in {where}: of {total['labels']}, {' and '.join(why)}")
    if all(m == 0.5 for m in pairs.mu):
        raise UserError(
            f'all {n} usable labels in {where} are ties ("equally good"): nothing to learn an order '
            f"from; label pairs where one segment is better"
        )
    if n < 2:
        raise UserError(f"only 1 usable label in {where}: at least 2 are needed (one to train, one to test)")


def _resolve_game(table: _SegmentTable, env: str | None, log: Log) -> tuple[str, str, tuple[str, ...]]:
    """(env id, game, action meanings) of the labeled segments; ``env`` for those that name none."""
    if len(table.games) > 1:
        raise UserError(f"the DBs mix games ({', '.join(sorted(table.games.values()))}): train one game at a time")
    if table.games:
        game, env_id = next(iter(table.games.items()))
        if env is not None and rom_name(env) != game:
            raise UserError(f"--env {env} does not match the DB's segments, which are from {env_id}")
    else:
        env_id = env or DEFAULT_ENV
        game = rom_name(env_id)
        log(f"segments name no game (legacy DB): assuming {env_id}" + ("" if env else " (pass --env to change)"))
    meanings = table.meanings or game_actions(env_id)[1]
    if table.max_action >= len(meanings):
        raise UserError(
            f"segments hold action {table.max_action} but {env_id} has only {len(meanings)} actions: wrong --env?"
        )
    return env_id, game, meanings


def load_preferences(
    dbs: Sequence[str | os.PathLike], env: str | None = None, log: Log = print, warn: Warn = warn
) -> PreferenceData:
    """Read the usable labels of every DB and their segments (kept compressed). ``env``: the game of
    segments that name none (the book's DBs; default SeaQuest); segments that name theirs must all
    be of one game (and of ``env`` when given). UserError with one line when nothing usable is left.
    ``warn`` takes each bad label line or broken segment skipped (a reader that loads the same DBs
    again and again passes one that says each once)."""
    if env is not None:
        rom_name(env)  # an unknown --env fails here, before any reading
    for db in dbs:
        if not Path(db).is_dir():
            raise UserError(f"DB not found: {db}")
    check_same_game(list(dbs), "training on")
    table, pairs = _SegmentTable(warn=warn), _Pairs()
    for di, db in enumerate(dbs):
        _read_db_pairs(di, Path(db), table, pairs, log)
    _check_usable(pairs, table, ", ".join(str(d) for d in dbs))
    env_id, game, meanings = _resolve_game(table, env, log)
    if table.legacy:
        log(f"{table.legacy} legacy segments without true rewards: oracle metrics are n/a for them")
    assert table.frame_shape is not None
    return PreferenceData(
        blobs=table.blobs,
        names=table.names,
        lengths=np.asarray(table.lengths, dtype=np.int64),
        true_returns=np.asarray(table.returns, dtype=np.float64),
        first=np.asarray(pairs.first, dtype=np.int64),
        second=np.asarray(pairs.second, dtype=np.int64),
        mu=np.asarray(pairs.mu, dtype=np.float32),
        env_id=env_id,
        game=game,
        n_actions=len(meanings),
        action_meanings=meanings,
        frame_shape=table.frame_shape,
        dbs=[str(d) for d in dbs],
        skipped={k: pairs.counts[k] for k in ("cant_tell", "missing", "unreadable")},
        pair_labels=pairs.labels,
    )


def _read_segment(root: Path, rel: str, warn: Warn = warn) -> tuple[bytes, dict[str, Any]] | str:
    """Read one segment file: (compressed bytes, metadata), or "missing" / "unreadable". Decodes it
    once to check it and read its metadata; keeps only the compressed bytes."""
    if not os.path.lexists(root / rel):
        return "missing"
    try:
        data = read_segment_bytes(root, rel)
        seg = decode_segment(data, f"{root}/{rel}")
    except SegmentError as e:
        warn(f"skipped: {e}")
        return "unreadable"
    if not is_compressed(data):
        data = encode_segment(seg, level=1)  # legacy: an uncompressed 5 MB pickle; keep it small
    meta = {
        "legacy": int(seg.rewards is None),
        "env_id": seg.env_id,
        "meanings": seg.action_meanings,
        "frame_shape": tuple(seg.frames.shape[1:]),
        "max_action": int(seg.actions.max()) if len(seg.actions) else -1,
        "length": len(seg),
        "true_return": float(seg.rewards.sum()) if seg.rewards is not None else math.nan,
    }
    return data, meta


def model_inputs(data: PreferenceData, ids: Sequence[int], arch: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The network input of segments ``ids`` for ``arch``, clip after clip, by ``reward_input``
    (book: (F, H, W, 3) uint8 frames; diff: (F, 2, 84, 84) uint8). Returns (input, actions (F,)
    int64, owner (F,) int64: the position in ``ids`` of each step), F the total steps."""
    total = int(data.lengths[list(ids)].sum())
    x: np.ndarray | None = None
    actions = np.empty(total, dtype=np.int64)
    owner = np.empty(total, dtype=np.int64)
    pos = 0
    for j, i in enumerate(ids):
        seg = decode_segment(data.blobs[i], data.names[i])
        t = len(seg)
        xi = np.asarray(reward_input(arch, seg.frames, None, seg.game_over))
        if x is None:
            x = np.empty((total, *xi.shape[1:]), dtype=xi.dtype)
        x[pos : pos + t] = xi
        actions[pos : pos + t] = seg.actions
        owner[pos : pos + t] = j
        pos += t
    if x is None:  # no segments
        x = np.asarray(reward_input(arch, np.empty((0, *data.frame_shape), dtype=np.uint8)))
    return x, actions, owner


def step_features(
    model: DiffRewardModel, data: PreferenceData, ids: Sequence[int], device: torch.device
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """A diff net's unscaled per-step features of segments ``ids``: (F, n) float32 on ``device``,
    with actions and owner as ``model_inputs`` gives them. Computed once per segment and cached in
    ``data.feature_cache`` under ``model.feature_key()``, so epochs after the first cost nothing."""
    key = model.feature_key()
    cache = data.feature_cache
    missing = [i for i in dict.fromkeys(int(i) for i in ids) if (key, i) not in cache]
    if missing:
        x, acts, owner = model_inputs(data, missing, "diff")
        # plain tensors even when called under inference_mode (evaluation): training reuses them
        with torch.inference_mode(False), torch.no_grad():
            chunks = range(0, len(x), INPUT_CHUNK)
            f = torch.cat([model.features(torch.from_numpy(x[s : s + INPUT_CHUNK]).to(device)) for s in chunks])
            for j, i in enumerate(missing):
                rows = np.flatnonzero(owner == j)
                cache[(key, i)] = f[torch.from_numpy(rows).to(device)]
                data.step_actions[i] = acts[rows]
    feats = torch.cat([cache[(key, int(i))] for i in ids])
    actions = np.concatenate([data.step_actions[int(i)] for i in ids]).astype(np.int64, copy=False)
    owner = np.repeat(np.arange(len(ids)), data.lengths[list(ids)])
    return feats, actions, owner
