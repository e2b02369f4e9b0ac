"""Training the reward model on the preference labels of one or more segment DBs.

Roles, one verb each:
- ``load_preferences``: read the labels of every DB (``_read_db_pairs``), each segment once
  (``_SegmentTable.row``), check that something is left to learn from (``_check_usable``) and
  which game it is (``_resolve_game``). "Can't tell" and labels whose segments are missing or
  unreadable are left out (counted). Segments stay COMPRESSED in memory (~20-50 KB instead of
  ~5 MB decoded: 1,000 labels touch up to 2,000 segments, 10 GB decoded).
- ``decode_segments``: decode the segments of one micro-batch (~1 ms each).
- ``train_reward_model``: Bradley-Terry training. ``_build_fit`` makes the seeded train/test split,
  the models and optimisers; ``train_epoch`` runs one epoch in micro-batches with gradient
  accumulation (activation memory is bounded by ``micro_frames``, not by ``--batch``);
  ``evaluate`` measures the test pairs in eval mode with the BatchNorm-folded net under inference
  mode; ``_run_epochs`` stops early on test loss and writes every new best aside
  (``<stem>.partial.pt``); ``_install_best`` replaces the model at the end (the old one is kept as
  ``<stem>.prev.pt``).

Metrics per epoch: train and test loss, test accuracy on non-tie labels, and where segments carry
true rewards the oracle agreement (``oracle_agreement``: share of test pairs with different true
returns the model orders the same way; a predicted tie counts as wrong) and the Pearson
correlation of predicted with true segment returns. Test pairs share segments with training pairs
(a pair is held out, not its segments); ``bench/quality.py`` measures agreement, by the same
function, on segments never trained on.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lib.envs import DEFAULT_ENV, game_of, grey84, rom_name
from lib.errors import UserError, warn
from lib.files import remove_stale_temps
from lib.labels import LABELS_FILE, LEGACY_LABELS_FILE, load_labels
from lib.model import state_is_finite
from lib.reward_model import (
    ARCHS,
    DIFF_BLOCK,
    INPUT_CHUNK,
    MAX_ENSEMBLE,
    NOISE_EPS,
    AnyRewardModel,
    DiffRewardModel,
    check_block,
    lean_net,
    load_encoder,
    new_reward_model,
    preference_loss,
    reward_checkpoint,
    save_reward_checkpoint,
)
from lib.segments import (
    _ZSTD_MAGIC,
    SegmentError,
    check_same_game,
    decode_segment,
    encode_segment,
    list_segments,
    read_segment_bytes,
)

Log = Callable[[str], None]


# --- the data --------------------------------------------------------------------------------


@dataclass
class PreferenceData:
    """Labeled pairs over compressed segments (S unique segments, P usable pairs).

    blobs:        S compressed segment files (decode with ``decode_segments``)
    names:        S "<db>/<NN/SSSSSSSS.dat>" names for messages
    lengths:      (S,) int64    steps per segment
    true_returns: (S,) float64  sum of true rewards; NaN where the segment has none (legacy DB)
    first/second: (P,) int64    segment index of a pair's sample1 / sample2
    mu:           (P,) float32  P(sample1 better): 1.0, 0.0 or 0.5 (tie)
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
    unlabeled: int = 0  # segments in no usable label (read for --pseudo-labels), the table's last rows
    # the diff net's input per segment, made on first use (``_grey_steps``): 350 KB a 50-step
    # segment, against decoding 5 MB and resizing it again every epoch
    grey_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    feature_cache: dict[tuple[Any, int], torch.Tensor] = field(default_factory=dict, repr=False)

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
        from lib.envs import AtariVec

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

    def row(self, di: int, root: Path, rel: str) -> int | str:
        """The row of segment ``rel`` of DB number ``di`` (read on first use), or "missing" /
        "unreadable"."""
        key = (di, rel)
        if key not in self.index:
            got = _read_segment(root, rel)
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
    counts: Counter[str] = field(default_factory=Counter)


def _read_db_pairs(di: int, root: Path, table: _SegmentTable, pairs: _Pairs, log: Log) -> None:
    """Add the usable labels of one DB to ``pairs`` and log one line about it."""
    if not (root / LABELS_FILE).is_file() and not (root / LEGACY_LABELS_FILE).is_file():
        raise UserError(f"DB {root} has no labels ({LABELS_FILE}): label pairs with 02_label_ui.py first")
    labels = load_labels(root)
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
    dbs: Sequence[str | os.PathLike], env: str | None = None, log: Log = print, unlabeled: bool = False
) -> PreferenceData:
    """Read the usable labels of every DB and their segments (kept compressed); with ``unlabeled``
    also every other readable segment of the DBs (``--pseudo-labels`` learns from pairs of them).

    ``env``: the game of segments that do not name one (legacy DBs from the book); default
    SeaQuest, the book's game. Segments that name their env must all be of one game (and of
    ``env`` when given). Raises UserError with one line when nothing usable is left.
    """
    if env is not None:
        rom_name(env)  # an unknown --env fails here, before any reading
    for db in dbs:
        if not Path(db).is_dir():
            raise UserError(f"DB not found: {db}")
    check_same_game(list(dbs), "training on")
    table, pairs = _SegmentTable(), _Pairs()
    for di, db in enumerate(dbs):
        _read_db_pairs(di, Path(db), table, pairs, log)
    _check_usable(pairs, table, ", ".join(str(d) for d in dbs))
    n_labeled = len(table.blobs)
    if unlabeled:
        for di, db in enumerate(dbs):
            for rel in list_segments(db, warn=None):
                table.row(di, Path(db), rel)
        log(f"{len(table.blobs) - n_labeled} segments in no label, for pseudo-labels")
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
        unlabeled=len(table.blobs) - n_labeled,
    )


def _read_segment(root: Path, rel: str) -> tuple[bytes, dict[str, Any]] | str:
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
    if data[:4] != _ZSTD_MAGIC:
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


def decode_segments(data: PreferenceData, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode segments ``ids``: frames (F, H, W, 3) uint8, actions (F,) int64, and owner (F,) int64,
    the position in ``ids`` each frame belongs to (F = total steps)."""
    total = int(data.lengths[list(ids)].sum())
    frames = np.empty((total, *data.frame_shape), dtype=np.uint8)
    actions = np.empty(total, dtype=np.int64)
    owner = np.empty(total, dtype=np.int64)
    pos = 0
    for j, i in enumerate(ids):
        seg = decode_segment(data.blobs[i], data.names[i])
        t = len(seg)
        frames[pos : pos + t] = seg.frames
        actions[pos : pos + t] = seg.actions
        owner[pos : pos + t] = j
        pos += t
    return frames, actions, owner


def _grey_steps(data: PreferenceData, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segment ``i`` in the diff net's terms: its grey 84x84 frames (T, 84, 84), per step the
    index of the frame the step led to (``segment_next_frames``' rule: the last step and a step
    that ended the game point at themselves), and its actions. Cached in ``data.grey_cache``."""
    got = data.grey_cache.get(i)
    if got is None:
        seg = decode_segment(data.blobs[i], data.names[i])
        t = len(seg)
        nxt = np.minimum(np.arange(t) + 1, t - 1)
        if seg.game_over is not None:
            nxt[seg.game_over] = np.flatnonzero(seg.game_over)
        got = data.grey_cache[i] = (grey84(seg.frames), nxt, seg.actions)
    return got


def model_inputs(data: PreferenceData, ids: Sequence[int], arch: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The network input of segments ``ids`` for a model of ``arch``: ``decode_segments``' frames
    for the book's net; (F, 2, 84, 84) uint8 (frame, next frame) for the diff net. Returns
    (input, actions, owner) as ``decode_segments`` does."""
    if arch == "book":
        return decode_segments(data, ids)
    total = int(data.lengths[list(ids)].sum())
    x = np.empty((total, 2, 84, 84), dtype=np.uint8)
    actions = np.empty(total, dtype=np.int64)
    owner = np.empty(total, dtype=np.int64)
    pos = 0
    for j, i in enumerate(ids):
        grey, nxt, acts = _grey_steps(data, int(i))
        t = len(grey)
        x[pos : pos + t, 0] = grey
        x[pos : pos + t, 1] = grey[nxt]
        actions[pos : pos + t] = acts
        owner[pos : pos + t] = j
        pos += t
    return x, actions, owner


def step_features(
    model: DiffRewardModel, data: PreferenceData, ids: Sequence[int], device: torch.device
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """A diff net's unscaled per-step features of segments ``ids``: (F, n) float32 on ``device``,
    with actions and owner as ``model_inputs`` gives them. They depend on no trained weight (block
    means, a frozen encoder), so each segment's are computed once and kept in ``data.feature_cache``
    under ``model.feature_key()``: epochs after the first, and the encoder, cost nothing."""
    key = model.feature_key()
    cache = data.feature_cache
    missing = [i for i in dict.fromkeys(int(i) for i in ids) if (key, i) not in cache]
    if missing:
        x, _, owner = model_inputs(data, missing, "diff")
        # plain tensors even when called under inference_mode (evaluation): training reuses them
        with torch.inference_mode(False), torch.no_grad():
            chunks = range(0, len(x), INPUT_CHUNK)
            f = torch.cat([model.features(torch.from_numpy(x[s : s + INPUT_CHUNK]).to(device)) for s in chunks])
            for j, i in enumerate(missing):
                cache[(key, i)] = f[torch.from_numpy(np.flatnonzero(owner == j)).to(device)]
    feats = torch.cat([cache[(key, int(i))] for i in ids])
    actions = np.concatenate([_grey_steps(data, int(i))[2] for i in ids]).astype(np.int64, copy=False)
    owner = np.repeat(np.arange(len(ids)), data.lengths[list(ids)])
    return feats, actions, owner


# --- training --------------------------------------------------------------------------------


# Epochs without a better test loss before training stops, per arch. 4 is the book's. The diff net's
# epochs cost ~nothing (cached features), and on bench/quality.py (300 labels, 3 splits) 20 agreed
# better on every DB and teacher measured: 86.4 -> 88.8% and 85.7 -> 88.7% (score), 83.9 -> 86.4%
# (oxygen); 40 and 100 gave exactly 20's models (the best epoch always came before 20 more).
PATIENCE = {"diff": 20, "book": 4}


@dataclass
class TrainConfig:
    """Hyper-parameters. Batch 16 and lr 3e-4 replace the book's 64 and 1e-4: on bench/quality.py
    (300 oracle labels, 3 splits) they agreed better with the true score on never-seen segments
    every time (+0.6 to +4.0 points) at the same cost per pair. ``patience`` None: the arch's
    (``PATIENCE``)."""

    epochs: int = 100
    batch: int = 16
    lr: float = 3e-4
    seed: int = 42
    test_ratio: float = 0.2
    patience: int | None = None
    noise: bool = False
    ensemble: int = 1
    micro_frames: int = 100
    downscale: int = 1
    augment: int = 0
    device: str = "cpu"
    arch: str = ARCHS[0]
    mask_rows: int = 0
    diff_block: tuple[int, int] = DIFF_BLOCK
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (0: plain Adam)
    pseudo_tau: float = 0.0  # SURF's confidence threshold for pseudo-labels on unlabeled pairs (0: off)
    pseudo_weight: float = 1.0  # SURF's lambda: weight of the pseudo-label loss
    crop: int = 0  # SURF's temporal cropping: a training segment's window is up to this many steps shorter
    encoder: str | None = None  # a policy checkpoint whose conv layers add frozen features (--arch diff)


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float
    test_loss: float
    test_accuracy: float  # NaN: no non-tie test labels
    oracle_agreement: float  # NaN: no test pair with two known, different true returns
    oracle_pairs: int
    return_corr: float  # NaN: n/a
    disagreement: float  # ensemble std of predicted test returns (0 for one model)
    train_seconds: float
    s_per_pair: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}

    @classmethod
    def of(cls, epoch: int, train_loss: float, ev: dict[str, float], seconds: float, n_seen: int) -> EpochMetrics:
        """An epoch's figures from its training loss and ``evaluate``'s test metrics."""
        return cls(
            epoch=epoch,
            train_loss=train_loss,
            test_loss=ev["loss"],
            test_accuracy=ev["accuracy"],
            oracle_agreement=ev["oracle_agreement"],
            oracle_pairs=int(ev["oracle_pairs"]),
            return_corr=ev["return_corr"],
            disagreement=ev["disagreement"],
            train_seconds=seconds,
            s_per_pair=seconds / max(n_seen, 1),
        )


@dataclass
class TrainResult:
    path: Path
    best: EpochMetrics
    history: list[EpochMetrics]
    n_train: int
    n_test: int
    norm_mean: float
    norm_std: float
    peak_rss_mb: float
    peak_cuda_mb: float | None
    stopped: str


def split_pairs(n: int, test_ratio: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of pair indices into (train, test); at least one of each."""
    if not 0.0 < test_ratio < 1.0:
        raise UserError(f"--test-ratio must be between 0 and 1, got {test_ratio}")
    perm = rng.permutation(n)
    n_test = min(max(1, round(n * test_ratio)), n - 1)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def micro_batches(data: PreferenceData, pairs: np.ndarray, micro_frames: int) -> list[np.ndarray]:
    """Split a batch of pair indices into micro-batches whose distinct segments hold at most
    ``micro_frames`` steps (always at least one pair)."""
    pairs = np.asarray(pairs)
    return [pairs[c] for c in _chunks(data.lengths, data.first[pairs], data.second[pairs], micro_frames)]


def _chunks(lengths: np.ndarray, a: np.ndarray, b: np.ndarray, micro_frames: int) -> list[np.ndarray]:
    """Positions of the pairs (a[i], b[i]) of segment rows, in runs whose distinct segments hold at
    most ``micro_frames`` steps (always at least one pair)."""
    out: list[np.ndarray] = []
    cur: list[int] = []
    segs: set[int] = set()
    frames = 0
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        new = {x, y} - segs
        add = int(sum(lengths[s] for s in new))
        if cur and frames + add > micro_frames:
            out.append(np.asarray(cur))
            cur, segs, frames = [], set(), 0
            new = {x, y}
            add = int(sum(lengths[s] for s in new))
        cur.append(i)
        segs |= new
        frames += add
    if cur:
        out.append(np.asarray(cur))
    return out


def random_shift(frames: np.ndarray, pad: int, rng: np.random.Generator) -> np.ndarray:
    """Training augmentation: each frame (F, H, W, 3) moved by up to ``pad`` pixels in x and y, the
    uncovered border filled with the edge pixels (random shifts, as in DrQ, Kostrikov et al. 2020)."""
    if pad <= 0:
        return frames
    n, h, w, _ = frames.shape
    padded = np.pad(frames, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    dy, dx = rng.integers(0, 2 * pad + 1, size=(2, n))
    out = np.empty_like(frames)
    for i in range(n):
        out[i] = padded[i, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
    return out


def _pair_returns(
    model: AnyRewardModel,
    data: PreferenceData,
    pairs: np.ndarray,
    device: torch.device,
    augment: int = 0,
    rng: np.random.Generator | None = None,
    crop: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted returns (R1, R2), each (P,), of labeled pairs ``pairs`` (``_returns_of``)."""
    return _returns_of(model, data, data.first[pairs], data.second[pairs], device, augment, rng, crop)


def _returns_of(
    model: AnyRewardModel,
    data: PreferenceData,
    a: np.ndarray,
    b: np.ndarray,
    device: torch.device,
    augment: int = 0,
    rng: np.random.Generator | None = None,
    crop: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted returns (R1, R2), each (P,), of the pairs of segment rows (a[i], b[i]): one forward
    over their distinct segments. Frames are randomly shifted by up to ``augment`` pixels when > 0
    (the book's net only). ``crop`` > 0: each segment's return sums a random window of its steps
    (``crop_weights``), as SURF's temporal cropping (Park et al. 2022)."""
    rng = rng if rng is not None else np.random.default_rng()
    segs, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    if isinstance(model, DiffRewardModel):
        f, actions, owner = step_features(model, data, segs, device)
        r = model.head(f, torch.from_numpy(actions).to(device))  # (F,)
    else:
        frames, actions, owner = model_inputs(data, segs, model.arch)
        if augment > 0:
            frames = random_shift(frames, augment, rng)
        r = model(torch.from_numpy(frames).to(device), torch.from_numpy(actions).to(device))  # (F,)
    if crop > 0:
        r = r * torch.from_numpy(crop_weights(data.lengths[segs], crop, rng)).to(device, r.dtype)
    returns = torch.zeros(len(segs), device=device, dtype=r.dtype).index_add(0, torch.from_numpy(owner).to(device), r)
    inv_t = torch.from_numpy(inv).to(device)
    return returns[inv_t[: len(a)]], returns[inv_t[len(a) :]]


def crop_weights(lengths: np.ndarray, crop: int, rng: np.random.Generator) -> np.ndarray:
    """SURF's temporal cropping as a 0/1 weight per step of segments of ``lengths`` laid end to end:
    one window length W, uniform in [T - crop, T] for the shortest segment's T (at least 1), shared
    by all of them (returns of one length stay comparable), and a random start in each segment."""
    t_min = int(lengths.min())
    w = int(rng.integers(max(1, t_min - crop), t_min + 1))
    out = np.zeros(int(lengths.sum()), dtype=np.float32)
    pos = 0
    for t in lengths.tolist():
        start = int(rng.integers(0, t - w + 1))
        out[pos + start : pos + start + w] = 1.0
        pos += t
    return out


def predict_segment_returns(
    nets: Sequence[torch.nn.Module],
    data: PreferenceData,
    segs: np.ndarray,
    device: torch.device,
    arch: str,
    chunk_frames: int = 64,
) -> tuple[np.ndarray, tuple[float, float, int]]:
    """Eval-mode returns of segments ``segs`` by each member: (K, S) float64, and the (sum, sum of
    squares, count) of the ensemble-mean per-step predictions (for normalisation stats)."""
    out = np.zeros((len(nets), len(segs)), dtype=np.float64)
    s1 = s2 = 0.0
    count = 0
    groups: list[list[int]] = [[]]
    frames_in = 0
    for j, s in enumerate(segs):
        if groups[-1] and frames_in + data.lengths[s] > chunk_frames:
            groups.append([])
            frames_in = 0
        groups[-1].append(j)
        frames_in += int(data.lengths[s])
    with torch.inference_mode():
        for g in groups:
            if not g:
                continue
            if isinstance(nets[0], DiffRewardModel):
                feats, actions, owner = step_features(nets[0], data, segs[g], device)
                a = torch.from_numpy(actions).to(device)
                per_step = torch.stack([net.head(feats, a) for net in nets])  # type: ignore[operator]
            else:
                frames, actions, owner = model_inputs(data, segs[g], arch)
                f = torch.from_numpy(frames).to(device)
                a = torch.from_numpy(actions).to(device)
                per_step = torch.stack([net(f, a) for net in nets])  # (K, F)
            o = torch.from_numpy(owner).to(device)
            rets = torch.zeros((len(nets), len(g)), device=device, dtype=per_step.dtype).index_add(1, o, per_step)
            out[:, g] = rets.double().cpu().numpy()
            m = per_step.mean(0).double()
            s1 += float(m.sum())
            s2 += float((m * m).sum())
            count += len(m)
    return out, (s1, s2, count)


def _lean(models: Sequence[AnyRewardModel], device: torch.device) -> list[torch.nn.Module]:
    nets = []
    for m in models:
        m.eval()
        nets.append(lean_net(m).to(device, memory_format=torch.channels_last))
        m.train()
    return nets


def oracle_agreement(pred1: np.ndarray, pred2: np.ndarray, true1: np.ndarray, true2: np.ndarray) -> tuple[float, int]:
    """(share, count) of the pairs whose true returns are known and differ that the predicted
    returns order the same way. A predicted tie counts as wrong: the model did not order the pair.
    Pairs whose true returns are equal or unknown (NaN: legacy segments) are left out. NaN share
    when no pair is left. The one rule for every agreement figure (trainer, bench/quality.py)."""
    p1, p2, t1, t2 = (np.asarray(x, dtype=np.float64) for x in (pred1, pred2, true1, true2))
    known = np.isfinite(t1) & np.isfinite(t2) & (t1 != t2)
    n = int(known.sum())
    if n == 0:
        return math.nan, 0
    return float(np.mean(np.sign(p1[known] - p2[known]) == np.sign(t1[known] - t2[known]))), n


def evaluate(
    models: Sequence[AnyRewardModel], data: PreferenceData, test: np.ndarray, device: torch.device, noise: float
) -> dict[str, float]:
    """Test metrics in eval mode: loss, accuracy on non-tie labels, oracle agreement, correlation of
    predicted with true returns, ensemble disagreement, and per-step prediction stats."""
    segs, inv = np.unique(np.concatenate([data.first[test], data.second[test]]), return_inverse=True)
    rets, (s1, s2, count) = predict_segment_returns(_lean(models, device), data, segs, device, models[0].arch)
    mean_ret = rets.mean(0)  # (S,) the ensemble's return
    r1 = torch.from_numpy(mean_ret[inv[: len(test)]]).float()
    r2 = torch.from_numpy(mean_ret[inv[len(test) :]]).float()
    _, m = preference_loss(r1, r2, torch.from_numpy(data.mu[test]), noise)
    agree, n_or = oracle_agreement(
        r1.numpy(), r2.numpy(), data.true_returns[data.first[test]], data.true_returns[data.second[test]]
    )
    t = data.true_returns[segs]
    ok = np.isfinite(t)
    corr = math.nan
    if ok.sum() >= 3 and np.std(t[ok]) > 0 and np.std(mean_ret[ok]) > 0:
        corr = float(np.corrcoef(mean_ret[ok], t[ok])[0, 1])
    mean = s1 / max(count, 1)
    std = math.sqrt(max(s2 / max(count, 1) - mean * mean, 0.0))
    return {
        "loss": m["loss"],
        "accuracy": m["accuracy"],
        "oracle_agreement": agree,
        "oracle_pairs": float(n_or),
        "return_corr": corr,
        "disagreement": float(rets.std(0).mean()) if len(models) > 1 else 0.0,
        "step_mean": mean,
        "step_std": std,
    }


def norm_stats(
    models: Sequence[AnyRewardModel], data: PreferenceData, segs: np.ndarray, device: torch.device
) -> tuple[float, float]:
    """Mean and std of the per-step predictions over segments ``segs`` (eval mode)."""
    _, (s1, s2, count) = predict_segment_returns(_lean(models, device), data, segs, device, models[0].arch)
    mean = s1 / max(count, 1)
    return mean, math.sqrt(max(s2 / max(count, 1) - mean * mean, 0.0))


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (Linux only; returns False elsewhere).

    Training allocates and frees the same ~20 MB activation tensors for every micro-batch. By
    default glibc gives such memory back to the OS and the next micro-batch page-faults it in
    again: measured 0.5-0.9 ms of system time a frame next to ~1.1 ms of compute. With the mmap
    threshold at its maximum (32 MB; every tensor of a 100-frame micro-batch is smaller) and no
    trimming, freed memory is reused; the cost is that RSS stays at its peak until exit.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        ok = libc.mallopt(m_mmap_threshold, 32 << 20) == 1
        ok &= libc.mallopt(m_trim_threshold, 1 << 30) == 1
        ok &= libc.mallopt(m_top_pad, 64 << 20) == 1
        return bool(ok)
    except (OSError, AttributeError):
        return False


def _fmt(v: float, pct: bool = False) -> str:
    """A metric for the log: "n/a" for NaN (not measurable), a percentage with ``pct``."""
    if math.isnan(v):
        return "n/a"
    return f"{100 * v:.1f}%" if pct else f"{v:.4f}"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


MAX_LR = 1.0
MAX_SEED = 2**63 - 1


def check_config(cfg: TrainConfig) -> None:
    """Every hyper-parameter in type and range; UserError with one line naming the flag. The CLI
    calls it before reading the DBs (bounds before work)."""
    _check_config(cfg)


def _check_config(cfg: TrainConfig) -> None:
    for name, v in (
        ("--epochs", cfg.epochs),
        ("--batch", cfg.batch),
        ("--patience", cfg.patience),
        ("--ensemble", cfg.ensemble),
        ("--micro-frames", cfg.micro_frames),
    ):
        if v is not None and v < 1:
            raise UserError(f"{name} must be at least 1, got {v}")
    if cfg.augment < 0:
        raise UserError(f"--augment must be 0 or more pixels, got {cfg.augment}")
    if cfg.ensemble > MAX_ENSEMBLE:
        raise UserError(f"--ensemble must be at most {MAX_ENSEMBLE}, got {cfg.ensemble}")
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UserError(f"--seed must be in 0..{MAX_SEED}, got {cfg.seed}")
    # every float flag finite and in range (NaN fails every comparison: checked as "not in range")
    if not 0 < cfg.lr <= MAX_LR:
        raise UserError(f"--lr must be positive and at most {MAX_LR:g}, got {cfg.lr}")
    if not 0 < cfg.test_ratio < 1:
        raise UserError(f"--test-ratio must be between 0 and 1, got {cfg.test_ratio}")
    for name, v, hi in (("--weight-decay", cfg.weight_decay, 100.0), ("--pseudo-weight", cfg.pseudo_weight, 1e3)):
        if not 0 <= v <= hi:
            raise UserError(f"{name} must be a number in 0..{hi:g}, got {v}")
    if cfg.pseudo_tau != 0 and not 0.5 <= cfg.pseudo_tau < 1.0:
        raise UserError(f"--pseudo-labels must be 0 (off) or a confidence in [0.5, 1), got {cfg.pseudo_tau}")
    if cfg.arch not in ARCHS:
        raise UserError(f"--arch must be one of {', '.join(ARCHS)}, got {cfg.arch!r}")
    if cfg.arch != "book" and (cfg.augment or cfg.downscale != 1):
        raise UserError(
            f"--augment and --input half apply to --arch book only (--arch {cfg.arch} reads grey 84x84 frames)"
        )
    if cfg.mask_rows and cfg.arch != "diff":
        raise UserError("--mask-rows applies to --arch diff only")
    if cfg.crop < 0:
        raise UserError(f"--crop must be 0 or more steps, got {cfg.crop}")
    if not 0 <= cfg.mask_rows < 84:
        raise UserError(f"--mask-rows must be in 0..83 (rows of the 84x84 input), got {cfg.mask_rows}")
    if cfg.encoder is not None and cfg.arch != "diff":
        raise UserError("--encoder applies to --arch diff only")
    if tuple(cfg.diff_block) != tuple(DIFF_BLOCK) and cfg.arch != "diff":
        raise UserError("--diff-block applies to --arch diff only")
    try:
        check_block(cfg.diff_block)
    except ValueError as e:
        raise UserError(f"--diff-block: {e}") from None


def _output_paths(out_path: str | os.PathLike) -> tuple[Path, Path]:
    """(the model's path, the side file for the best model so far). The model itself is replaced
    only when training ends, so a crash or kill mid-run never costs the model that was there."""
    out_path = Path(out_path)
    if out_path.parent.exists() and not out_path.parent.is_dir():
        raise UserError(f"output directory {out_path.parent} is a file: give a directory with -o")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output directory {out_path.parent}: {e.strerror or e}") from None
    return out_path, out_path.with_name(out_path.stem + ".partial.pt")


@dataclass
class _Fit:
    """What one training run works with: the models, their optimisers and training pairs (member k
    of an ensemble trains on its own bootstrap sample), and the held-out test pairs."""

    data: PreferenceData
    cfg: TrainConfig
    device: torch.device
    models: list[AnyRewardModel]
    opts: list[torch.optim.Optimizer]
    members: list[np.ndarray]
    test: np.ndarray
    noise: float
    rng: np.random.Generator

    @property
    def n_train(self) -> int:
        return len(self.members[0])


def _build_fit(data: PreferenceData, cfg: TrainConfig) -> _Fit:
    from lib.model import resolve_device

    device = resolve_device(cfg.device)
    if cfg.patience is None and cfg.arch in PATIENCE:
        cfg = replace(cfg, patience=PATIENCE[cfg.arch])
    _check_config(cfg)
    keep_freed_memory()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    train, test = split_pairs(data.n_pairs, cfg.test_ratio, rng)
    if (data.mu[train] == 0.5).all():
        raise UserError(
            f"all {len(train)} training labels are ties: nothing to learn an order from; "
            f"label more pairs where one segment is better"
        )
    encoder = None if cfg.encoder is None else load_encoder(cfg.encoder, data.game)
    models = [
        new_reward_model(
            cfg.arch,
            data.n_actions,
            data.frame_shape,
            cfg.downscale,
            cfg.mask_rows,
            cfg.diff_block,
            cfg.encoder is not None,
        )
        for _ in range(cfg.ensemble)
    ]
    for m in models:
        if encoder is not None:
            m.encoder.load_state_dict(encoder)  # type: ignore[union-attr]
        m.to(device, memory_format=torch.channels_last).train()
    _fit_input_scale(models, data, train, rng, device)
    members = [train] if cfg.ensemble == 1 else [rng.choice(train, size=len(train)) for _ in range(cfg.ensemble)]
    return _Fit(
        data,
        cfg,
        device,
        models,
        [_optimiser(m, cfg) for m in models],
        members,
        test,
        NOISE_EPS if cfg.noise else 0.0,
        rng,
    )


def _optimiser(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam, or with ``--weight-decay`` AdamW (decay decoupled from the gradient's scale, Loshchilov
    and Hutter 2019; the paper used an L2 penalty tuned to the validation loss)."""
    if cfg.weight_decay > 0:
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


SCALE_SEGMENTS = 64  # training segments the diff net's input scale is measured on


def _fit_input_scale(
    models: Sequence[AnyRewardModel],
    data: PreferenceData,
    train: np.ndarray,
    rng: np.random.Generator,
    device: torch.device,
) -> None:
    """Measure a diff net's per-feature input scale on up to SCALE_SEGMENTS segments of the
    training pairs (the book's net normalises with BatchNorm instead: nothing to do)."""
    if not isinstance(models[0], DiffRewardModel):
        return
    segs = np.unique(np.concatenate([data.first[train], data.second[train]]))
    sample = np.sort(rng.choice(segs, size=min(len(segs), SCALE_SEGMENTS), replace=False))
    x, _, _ = model_inputs(data, sample, "diff")
    with torch.no_grad():
        f = models[0].features(torch.from_numpy(x).to(device))  # the members share their features
    for m in models:
        m.scale_to(f)


class Diverged(Exception):
    """Training produced a non-finite loss, weight or statistic: it stops, and nothing of it is
    installed."""

    def __init__(self, epoch: int, what: str):
        super().__init__(what)
        self.epoch, self.what = epoch, what


def _check_finite_models(models: Sequence[AnyRewardModel], epoch: int) -> None:
    for k, m in enumerate(models):
        if not state_is_finite(m.state_dict()):
            raise Diverged(epoch, f"the weights{f' of member {k}' if len(models) > 1 else ''} are not finite")


def train_epoch(fit: _Fit, epoch: int, progress: bool) -> tuple[float, int, float]:
    """One pass over the training pairs in batches of ``cfg.batch``, each processed in micro-batches
    of at most ``cfg.micro_frames`` steps whose gradients accumulate to the batch-mean loss.
    Returns (mean train loss, pairs seen, seconds)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    cfg, data = fit.cfg, fit.data
    batches = []
    for k, idx in enumerate(fit.members):
        perm = fit.rng.permutation(idx)
        batches += [(k, perm[s : s + cfg.batch]) for s in range(0, len(perm), cfg.batch)]
    loss_sum, n_seen = 0.0, 0
    # disable=None: tqdm draws only on a terminal, so logs and pipes stay free of \r lines
    bar = tqdm(
        total=sum(len(b) for _, b in batches),
        desc=f"epoch {epoch}",
        unit="pair",
        disable=None if progress else True,
        leave=False,
        dynamic_ncols=True,
    )
    for k, batch in batches:
        model, opt = fit.models[k], fit.opts[k]
        opt.zero_grad(set_to_none=True)
        for mb in micro_batches(data, batch, cfg.micro_frames):
            r1, r2 = _pair_returns(model, data, mb, fit.device, cfg.augment, fit.rng, cfg.crop)
            loss, _ = preference_loss(r1, r2, torch.from_numpy(data.mu[mb]).to(fit.device), fit.noise)
            value = float(loss.detach())
            if not math.isfinite(value):
                bar.close()
                raise Diverged(epoch, f"the training loss is {value}")
            (loss * (len(mb) / len(batch))).backward()
            loss_sum += value * len(mb)
            n_seen += len(mb)
            bar.update(len(mb))
        if cfg.pseudo_tau:
            pseudo_step(fit, model, len(batch))
        opt.step()
        bar.set_postfix(loss=f"{loss_sum / max(n_seen, 1):.4f}")
    bar.close()
    return loss_sum / max(n_seen, 1), n_seen, time.perf_counter() - t0


def pseudo_step(fit: _Fit, model: AnyRewardModel, n_pairs: int) -> tuple[int, float]:
    """SURF's semi-supervised term (Park et al. 2022, eq. 5): ``n_pairs`` random pairs of the DBs'
    segments, labeled or not; where the model's P(first better) is at least ``--pseudo-labels`` τ
    or at most 1 − τ, its own hard answer is the label. Adds λ x the mean cross-entropy over the
    pairs (unconfident ones count as 0, as in FixMatch) to the gradients. Returns (pairs used, loss)."""
    cfg, data, rng = fit.cfg, fit.data, fit.rng
    if data.n_segments < 2:
        return 0, 0.0
    a = rng.integers(0, data.n_segments, size=n_pairs)
    b = rng.integers(0, data.n_segments - 1, size=n_pairs)
    b = b + (b >= a)  # never a segment with itself
    used, total = 0, 0.0
    for c in _chunks(data.lengths, a, b, cfg.micro_frames):
        r1, r2 = _returns_of(model, data, a[c], b[c], fit.device, cfg.augment, rng, cfg.crop)
        logit = r1 - r2
        p = torch.sigmoid(logit.detach())
        sure = (p >= cfg.pseudo_tau) | (p <= 1.0 - cfg.pseudo_tau)
        if not bool(sure.any()):
            continue
        target = (p > 0.5).to(logit.dtype)
        ce = F.binary_cross_entropy_with_logits(logit[sure], target[sure], reduction="sum")
        (cfg.pseudo_weight * ce / n_pairs).backward()
        used += int(sure.sum())
        total += float(ce.detach())
    return used, total / n_pairs


def train_reward_model(
    data: PreferenceData,
    cfg: TrainConfig,
    out_path: str | os.PathLike,
    writer: Any | None = None,
    progress: bool = True,
    log: Log = print,
) -> TrainResult:
    """Fit the reward model to ``data`` and write the best checkpoint (lowest test loss) to ``out_path``.

    Each optimiser step sees ``cfg.batch`` pairs. With ``cfg.ensemble`` K > 1, member k trains on
    its own bootstrap sample of the training pairs; the ensemble predicts the members' mean.
    Training stops after ``cfg.patience`` epochs without a better test loss, at ``cfg.epochs``, or
    at Ctrl-C (keeping the best model so far).
    """
    fit = _build_fit(data, cfg)
    out_path, partial_path = _output_paths(out_path)
    for p in (out_path, partial_path, out_path.with_name(out_path.stem + ".prev.pt")):
        remove_stale_temps(p.parent, f".{p.name}.", ".tmp")  # left by a killed run
    _log_start(fit, log)
    meta = _checkpoint_meta(fit)
    if fit.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(fit.device)
    try:
        run = _run_epochs(fit, meta, partial_path, writer, progress, log)
        if run.best is None:
            raise UserError("interrupted before the first epoch finished: no model saved")
        mean, std = _install_best(fit, run.best, run.best_states, meta, out_path, log)
    except UserError as e:
        if partial_path.exists():
            raise UserError(f"{e}; the best epoch's model is kept in {partial_path}") from None
        raise
    except Diverged as e:
        kept = f"{out_path} is unchanged" if out_path.exists() else "no model installed"
        if partial_path.exists():
            kept += f"; the last finite best epoch is in {partial_path}"
        raise UserError(f"training diverged in epoch {e.epoch}: {e.what} (--lr {cfg.lr:g} too high?); {kept}") from None
    partial_path.unlink(missing_ok=True)
    peak_cuda = torch.cuda.max_memory_allocated(fit.device) / 2**20 if fit.device.type == "cuda" else None
    return TrainResult(
        path=out_path,
        best=run.best,
        history=run.history,
        n_train=fit.n_train,
        n_test=len(fit.test),
        norm_mean=mean,
        norm_std=std,
        peak_rss_mb=_peak_rss_mb(),
        peak_cuda_mb=peak_cuda,
        stopped=run.stopped,
    )


def _log_start(fit: _Fit, log: Log) -> None:
    """One line on what is trained on what, and whether the oracle metrics can be measured."""
    data = fit.data
    log(
        f"training on {fit.n_train} pairs, testing on {len(fit.test)} ({data.n_segments} segments, "
        f"{data.compressed_bytes / 2**20:.1f} MB compressed), {data.env_id}, network {fit.cfg.arch}, "
        f"input {tuple(fit.models[0].input_shape)}, device {fit.device}"
        + (f", ensemble of {fit.cfg.ensemble}" if fit.cfg.ensemble > 1 else "")
    )
    if not data.has_true_returns:
        log("oracle agreement and return correlation: n/a (segments carry no true rewards)")


def _checkpoint_meta(fit: _Fit) -> dict[str, Any]:
    """What every checkpoint of the run carries besides the weights and metrics."""
    return {
        "env_id": fit.data.env_id,
        "game": fit.data.game,
        "action_meanings": fit.data.action_meanings,
        "dbs": fit.data.dbs,
        "n_train": fit.n_train,
        "n_test": int(len(fit.test)),
        "config": dict(fit.cfg.__dict__),
    }


@dataclass
class _Progress:
    """The training loop's running state: every epoch's figures, the best epoch so far and its
    weights (on the CPU), and why the loop ended."""

    history: list[EpochMetrics] = field(default_factory=list)
    best: EpochMetrics | None = None
    best_states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    stopped: str = "max epochs"

    def improves(self, em: EpochMetrics) -> bool:
        """Whether ``em``'s test loss is lower than the best so far (the first epoch's always is)."""
        return self.best is None or em.test_loss < self.best.test_loss

    def keep(self, em: EpochMetrics, models: Sequence[AnyRewardModel]) -> None:
        """Make ``em`` the best epoch, with a CPU copy of the weights. One assignment, so that a
        Ctrl-C never leaves one epoch's figures next to another epoch's weights."""
        self.best, self.best_states = (
            em,
            [{k: v.detach().cpu().clone() for k, v in m.state_dict().items()} for m in models],
        )


def _run_epochs(
    fit: _Fit, meta: dict[str, Any], partial_path: Path, writer: Any | None, progress: bool, log: Log
) -> _Progress:
    """Train up to ``cfg.epochs`` epochs, evaluating and logging each. Every new best (lowest test
    loss) is kept in memory and written to ``partial_path``, never over the model already installed.
    Stops early after ``cfg.patience`` epochs without a better test loss, and at Ctrl-C."""
    cfg, run = fit.cfg, _Progress()
    try:
        for epoch in range(cfg.epochs):
            train_loss, n_seen, seconds = train_epoch(fit, epoch, progress)
            _check_finite_models(fit.models, epoch)
            ev = evaluate(fit.models, fit.data, fit.test, fit.device, fit.noise)
            for key in ("loss", "step_mean", "step_std"):
                if not math.isfinite(ev[key]):
                    raise Diverged(epoch, f"the test {key.replace('_', ' ')} is {ev[key]}")
            em = EpochMetrics.of(epoch, train_loss, ev, seconds, n_seen)
            run.history.append(em)
            improved = run.improves(em)
            _report_epoch(fit, em, improved, writer, log)
            if improved:
                run.keep(em, fit.models)
                ck = reward_checkpoint(
                    fit.models,
                    norm_mean=ev["step_mean"],
                    norm_std=ev["step_std"],
                    metrics=em.as_dict(),
                    epoch=epoch,
                    **meta,
                )
                save_reward_checkpoint(ck, partial_path)
            elif epoch - run.best.epoch >= cfg.patience:
                run.stopped = f"early stop: test loss not better for {cfg.patience} epochs"
                break
    except KeyboardInterrupt:
        run.stopped = "interrupted"
        log("interrupted: keeping the best model so far")
    return run


def _report_epoch(fit: _Fit, em: EpochMetrics, improved: bool, writer: Any | None, log: Log) -> None:
    """An epoch's line in the log (``*``: a new best) and its scalars in TensorBoard."""
    ensemble = fit.cfg.ensemble > 1
    log(_epoch_line(em, ensemble, improved))
    if writer is not None:
        _log_epoch(writer, em, ensemble, fit.data.has_true_returns, em.epoch)


def _epoch_line(em: EpochMetrics, ensemble: bool, improved: bool) -> str:
    return (
        f"epoch {em.epoch}: train loss {em.train_loss:.4f}, test loss {em.test_loss:.4f}, "
        f"test acc {_fmt(em.test_accuracy, True)}, oracle agreement {_fmt(em.oracle_agreement, True)} "
        f"({em.oracle_pairs} pairs), return corr {_fmt(em.return_corr)}"
        + (f", disagreement {em.disagreement:.3f}" if ensemble else "")
        + f", {em.s_per_pair * 1000:.0f} ms/pair"
        + (" *" if improved else "")
    )


def _log_epoch(writer: Any, em: EpochMetrics, ensemble: bool, has_oracle: bool, step: int) -> None:
    """An epoch's scalars, in the tag scheme of every stage (``lib/tb.py``)."""
    writer.add_scalar("losses/train", em.train_loss, step)
    writer.add_scalar("losses/test", em.test_loss, step)
    if not math.isnan(em.test_accuracy):
        writer.add_scalar("eval/test_accuracy", em.test_accuracy, step)
    if has_oracle and not math.isnan(em.oracle_agreement):
        writer.add_scalar("eval/oracle_agreement", em.oracle_agreement, step)
    if has_oracle and not math.isnan(em.return_corr):
        writer.add_scalar("eval/return_corr", em.return_corr, step)
    if ensemble:
        writer.add_scalar("eval/ensemble_disagreement", em.disagreement, step)
    writer.add_scalar("charts/s_per_pair", em.s_per_pair, step)


def _install_best(
    fit: _Fit,
    best: EpochMetrics,
    states: list[dict[str, torch.Tensor]],
    meta: dict[str, Any],
    out_path: Path,
    log: Log,
) -> tuple[float, float]:
    """Put the best weights back, measure their per-step prediction stats over a sample of up to
    256 labeled segments (what the wrapper and 04_play.py normalise with until their own running
    window fills), and install the checkpoint. Returns (mean, std)."""
    for m, sd in zip(fit.models, states, strict=True):
        m.load_state_dict(sd)
    data = fit.data
    all_segs = np.unique(np.concatenate([data.first, data.second]))
    sample = np.sort(fit.rng.choice(all_segs, size=min(len(all_segs), 256), replace=False))
    mean, std = norm_stats(fit.models, data, sample, fit.device)
    if not (math.isfinite(mean) and math.isfinite(std)):
        raise Diverged(best.epoch, f"the per-step prediction mean {mean} / std {std} is not finite")
    ck = reward_checkpoint(fit.models, norm_mean=mean, norm_std=std, metrics=best.as_dict(), epoch=best.epoch, **meta)
    prev = install_checkpoint(ck, out_path)
    if prev is not None:
        log(f"the previous {out_path.name} is kept as {prev}")
    return mean, std


def install_checkpoint(ck: dict[str, Any], out_path: Path) -> Path | None:
    """Write ``ck`` to ``out_path``, keeping what was there as ``<stem>.prev.pt`` (returned). The old
    file is hard-linked before the new one is renamed over it: at no moment is there no model."""
    prev = None
    if out_path.is_file() and not out_path.is_symlink():
        prev = out_path.with_name(out_path.stem + ".prev.pt")
        tmp = prev.with_name(f".{prev.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            try:
                os.link(out_path, tmp)
            except OSError:  # a file system without hard links: copy
                tmp.write_bytes(out_path.read_bytes())
            os.replace(tmp, prev)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise UserError(
                f"cannot keep the previous model {out_path} as {prev}: {e.strerror or e} ({out_path} is unchanged)"
            ) from None
    save_reward_checkpoint(ck, out_path)
    return prev


def summary_lines(res: TrainResult) -> list[str]:
    """The lines that end a training run: the best model, its test figures, cost and norm stats."""
    b = res.best
    lines = [
        f"best model: {res.path} (epoch {b.epoch}; {res.stopped})",
        f"  test loss {b.test_loss:.4f}, test accuracy {_fmt(b.test_accuracy, True)} on non-tie labels, "
        f"oracle agreement {_fmt(b.oracle_agreement, True)} on {b.oracle_pairs} pairs, "
        f"return corr {_fmt(b.return_corr)}",
        f"  {res.n_train} train / {res.n_test} test pairs, {b.s_per_pair * 1000:.0f} ms per pair per epoch, "
        f"peak memory {res.peak_rss_mb:.0f} MB"
        + (f" (GPU {res.peak_cuda_mb:.0f} MB)" if res.peak_cuda_mb is not None else ""),
        f"  per-step prediction mean {res.norm_mean:.4f}, std {res.norm_std:.4f} (stored for normalisation)",
    ]
    return lines
