"""``03_reward_train.py --follow``: retrain the reward model as labels arrive and install each
version the agent should switch to (``01_a2c.py --reward-reload`` reads it), as Christiano et al.
2017 fit the reward model while the agent trains. ``Follower.run`` polls the DBs' label files; once
``--retrain-every`` labels changed the training set, it trains the next version warm from the
installed one, on a split by pair hash (a held-out label stays held out), and installs it when its
held-out loss is not higher. Every candidate is kept as ``reward-NAME-vK.pt`` with a line in
``reward-NAME-versions.jsonl``. Ctrl-C and SIGTERM abandon a training in progress, finish a version
being written, and exit 130."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lib.core.errors import UserError
from lib.core.errors import warn as warn_line
from lib.core.files import UnsafeFileError, file_state, install, open_append, read_regular
from lib.core.signals import SignalStop
from lib.core.stats import finite
from lib.models.reward import AnyRewardModel, load_reward_models, save_reward_checkpoint
from lib.reward.config import FollowConfig, TrainConfig
from lib.reward.data import Log, PreferenceData, load_preferences
from lib.reward.train import (
    Diverged,
    _build_fit,
    _checkpoint_meta,
    _fmt,
    _run_epochs,
    best_epoch_checkpoint,
    held_out,
    split_by_pair,
)
from lib.store.checkpoints import stage_torch_save
from lib.store.labels import (
    LABELS_FILE,
    LEGACY_LABELS_FILE,
    Label,
    LabelTail,
    Warn,
    is_control,
    pair_key,
    read_label_log,
)

SPLIT = "pair-hash"  # metrics["split"] of a version: lib.reward.train.held_out
MAX_VERSIONS_BYTES = 64 << 20
MAX_VERSION = 10**9 - 1  # a version's number fits reward-NAME-vK.pt's \\d{1,9}

# (DB as given on the command line, first, second of the order-free pair key)
LabelKey = tuple[str, str, str]


def version_path(out_dir: Path, name: str, k: int) -> Path:
    return out_dir / f"reward-{name}-v{k}.pt"


def versions_log(out_dir: Path, name: str) -> Path:
    return out_dir / f"reward-{name}-versions.jsonl"


def oriented(sample1: str, sample2: str, mu: float) -> tuple[str, str, float]:
    """A label as (first, second, P(first better)) of its order-free pair key: (a, b, 1.0) and
    (b, a, 0.0) are the same answer."""
    a, b = pair_key(sample1, sample2)
    return a, b, (mu if sample1 == a else 1.0 - mu)


class OnceWarn:
    """A ``warn`` that says each line once: the same bad label line is read at every poll."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            warn_line(message)


def _label_files(db: str) -> list[Path]:
    return [Path(db) / LEGACY_LABELS_FILE, Path(db) / LABELS_FILE]


def has_labels(db: str) -> bool:
    return any(p.is_file() for p in _label_files(db))


class LabelWatch:
    """The DBs' current training labels, kept in step with their label files. ``read()`` -> {(db,
    first, second): (P(first better), label time or None)}: the last answer per pair, "can't tell"
    and retracted pairs left out. Unchanged files are not read; a change to the append-only
    ``labels.jsonl`` reads only the whole lines appended since. A file replaced, truncated or
    rewritten, or any change of the legacy ``labels.json``, reads everything again."""

    def __init__(self, dbs: Sequence[str], warn: Warn) -> None:
        self.dbs, self.warn = list(dbs), warn
        self._seen: dict[str, _Followed] = {}

    def read(self) -> dict[LabelKey, tuple[float, float | None]]:
        out: dict[LabelKey, tuple[float, float | None]] = {}
        for db in self.dbs:
            stamp = tuple(file_state(p) for p in _label_files(db))
            got = self._seen.get(db)
            if got is None or got.stamp != stamp:
                new = None if got is None or got.stamp[0] != stamp[0] else got.tail.read_new(self.warn)
                if new is None:  # the first look, labels.json changed, or labels.jsonl is another file
                    got = self._seen[db] = _Followed(db, stamp, LabelTail(Path(db) / LABELS_FILE))
                    new = read_label_log(db, self.warn, names=(LEGACY_LABELS_FILE,))
                    new += got.tail.read_new(self.warn) or []
                got.stamp = stamp
                for lab in new:
                    got.feed(lab)
            out.update(got.labels)
        return out


@dataclass
class _Followed:
    """One DB's training labels as ``LabelWatch`` last read them."""

    db: str
    stamp: tuple[Any, ...]  # file_state of each label file
    tail: LabelTail  # where the read of labels.jsonl stands
    labels: dict[LabelKey, tuple[float, float | None]] = field(default_factory=dict)

    def feed(self, lab: Label) -> None:
        """One label line, ``lib.store.labels.load_labels``'s rule: the last answer per pair wins, a
        retraction or a "can't tell" takes the pair out, a control answer changes nothing."""
        if is_control(lab):
            return
        self.labels.pop((self.db, *lab.key), None)  # in the order of each pair's last answer
        if lab.preference is not None:
            a, b, mu = oriented(lab.sample1, lab.sample2, lab.preference)
            self.labels[(self.db, a, b)] = (mu, lab.time)


def answers(labels: dict[LabelKey, tuple[float, float | None]]) -> dict[LabelKey, float]:
    """The answers of ``LabelWatch.read``'s labels, without their times: what a version saw."""
    return {k: mu for k, (mu, _) in labels.items()}


def count_new(
    now: dict[LabelKey, float], seen: dict[LabelKey, float], usable: Callable[[LabelKey], bool] | None = None
) -> int:
    """Labels of ``now`` that change the training set ``seen`` was: a new pair's answer or an edited
    one; with ``usable``, only those it accepts (asked of the new labels only)."""
    return sum(1 for k, mu in now.items() if seen.get(k) != mu and (usable is None or usable(k)))


def segments_exist(key: LabelKey) -> bool:
    """Whether both segments of a label are regular files in its DB: a label line may name any path
    (a typo, a deleted clip, a hand-written line); whether they read is for ``load_preferences``."""
    db, a, b = key
    return all(os.path.isfile(os.path.join(db, rel)) and not os.path.islink(os.path.join(db, rel)) for rel in (a, b))


def shortfall(labels: Iterable[tuple[str, str, float]], cfg: TrainConfig) -> str | None:
    """Why labels ((first, second, mu) each) are too few to train a version on, or None: it needs a
    held-out label and a training label that is not a tie."""
    n = n_test = n_order = 0
    for a, b, mu in labels:
        n += 1
        if held_out(a, b, cfg.seed, cfg.test_ratio):
            n_test += 1
        elif mu != 0.5:
            n_order += 1
    if n == 0:
        return "no labels yet"
    if n_test == 0:
        return f"{n} label(s), none held out yet (about {cfg.test_ratio:.0%} are, chosen by pair)"
    if n_order == 0:
        return f"{n} label(s), no training label that is not a tie yet"
    return None


@dataclass
class Installed:
    """The model at ``OUTDIR/reward-NAME.pt`` and what it was made with: ``version`` (None for a
    model this loop did not make), ``models`` (on the training device), ``seen`` (the answers it was
    made with; held-out labels not among them are its fresh evidence) and ``same_split`` (made by
    --follow with this seed and test ratio, so it never trained on a held-out label and is compared
    on all of them; otherwise on the fresh ones only)."""

    version: int | None
    models: list[AnyRewardModel]
    seen: dict[LabelKey, float]
    same_split: bool

    @property
    def label(self) -> str:
        return f"v{self.version}" if self.version is not None else "the starting model"


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and finite(v) else None


def check_warm_start(models: Sequence[AnyRewardModel], cfg: TrainConfig, path: Path) -> None:
    """The installed model must be the network the flags ask for: a warm start copies its weights."""
    m = models[0]
    if m.downscale != 1:
        raise UserError(f"{path} was trained on frames shrunk {m.downscale}x (--input half, retired): give another -n")
    have = {"--arch": m.arch, "--ensemble": len(models)}
    want: dict[str, Any] = {"--arch": cfg.arch, "--ensemble": cfg.ensemble}
    if m.arch != "book":
        have["--diff-block"] = "x".join(map(str, m.block))  # type: ignore[union-attr]
        want["--diff-block"] = "x".join(map(str, cfg.diff_block))
        have["--mask-rows"], want["--mask-rows"] = int(m.mask_rows), cfg.mask_rows  # type: ignore[union-attr]
        have["--diff-flow"], want["--diff-flow"] = m.flow, cfg.diff_flow  # type: ignore[union-attr]
        have["--diff-flow-scene"], want["--diff-flow-scene"] = m.flow_scene, cfg.diff_flow_scene  # type: ignore[union-attr]
    for flag in have:
        if have[flag] != want[flag]:
            raise UserError(
                f"{path} was trained with {flag} {have[flag]}, this run has "
                f"{flag} {want[flag]}: --follow starts each version from the installed "
                f"model, so pass its settings (or give another -n)"
            )


def check_fits_data(models: Sequence[AnyRewardModel], ck: dict[str, Any], data: PreferenceData, path: Path) -> None:
    """The installed model is for the labelled segments' game, frame size and actions."""
    m = models[0]
    if ck.get("game") not in (None, data.game):
        raise UserError(
            f"{path} is a reward model for {ck.get('env_id') or ck.get('game')}, the DBs hold {data.env_id}: "
            f"give another -n"
        )
    if tuple(m.frame_shape) != tuple(data.frame_shape) or m.n_actions != data.n_actions:
        raise UserError(
            f"{path} takes frames {tuple(m.frame_shape)} and {m.n_actions} actions, the DBs' segments have "
            f"{tuple(data.frame_shape)} and {data.n_actions}: give another -n"
        )


def next_version(out_dir: Path, name: str) -> int:
    """1 + the highest version among ``reward-NAME-vK.pt`` files and the versions log's lines."""
    top = 0
    pat = re.compile(rf"reward-{re.escape(name)}-v(\d{{1,9}})\.pt")
    with contextlib.suppress(OSError):
        for e in os.scandir(out_dir):
            if m := pat.fullmatch(e.name):
                top = max(top, int(m.group(1)))
    for rec in read_versions(versions_log(out_dir, name)):
        top = max(top, rec["version"])
    return top + 1


def read_versions(path: Path) -> list[dict[str, Any]]:
    """The versions log's records; a missing file is none, a bad line (not a JSON object, or whose
    "version" is not an int in 1..``MAX_VERSION``: a 400-digit one too) is skipped."""
    try:
        data = read_regular(path, MAX_VERSIONS_BYTES)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    out = []
    for line in data.splitlines():
        with contextlib.suppress(ValueError, RecursionError):
            rec = json.loads(line)
            v = rec.get("version") if isinstance(rec, dict) else None
            if type(v) is int and 1 <= v <= MAX_VERSION:
                out.append(rec)
    return out


def _json_value(v: Any) -> Any:
    """A figure for a JSON line: NaN is null (JSON has no NaN)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Follower:
    """One ``--follow`` run: the label watch, the installed model, the versions made so far."""

    def __init__(
        self,
        dbs: Sequence[str],
        cfg: TrainConfig,
        fcfg: FollowConfig,
        out_dir: Path,
        name: str,
        env: str | None = None,
        writer: Any | None = None,
        progress: bool = True,
        log: Log = print,
    ) -> None:
        self.dbs, self.cfg, self.fcfg = [str(d) for d in dbs], cfg, fcfg
        self.out_dir, self.name, self.env = out_dir, name, env
        self.writer, self.progress, self.log = writer, progress, log
        self.warn = OnceWarn()
        self.watch = LabelWatch(self.dbs, self.warn)
        self.stable = out_dir / f"reward-{name}.pt"
        self.installed: Installed | None = None
        self.installed_ck: dict[str, Any] = {}
        self.trained_on: dict[LabelKey, float] | None = None  # the answers of the last version made
        self.failed_on: dict[LabelKey, float] | None = None  # answers a version could not be made from
        self.k = next_version(out_dir, name)
        self.training: int | None = None  # the version in training, for the stop line
        self.stop = SignalStop(at_once=True)
        self._said = ""
        self._lock: int | None = None  # the output directory's flock (claim)

    # --- start ------------------------------------------------------------------------------

    def claim(self) -> None:
        """Before anything is written: the versions log must be a regular file or absent, and this
        the only --follow trainer of the output directory (an exclusive ``flock`` on it, held until
        the process ends; two would both make "v2"). UserError with one line otherwise."""
        path = versions_log(self.out_dir, self.name)
        if path.is_symlink():
            raise UserError(f"{path} is a symlink: refusing to write through it (remove it, or give another -o)")
        if os.path.lexists(path) and not path.is_file():
            raise UserError(f"{path} is not a regular file: refusing to write to it (remove it, or give another -o)")
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise UserError(f"cannot use the output directory {self.out_dir}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if isinstance(e, BlockingIOError):
                raise UserError(
                    f"{self.out_dir} is followed by another --follow trainer: stop it, or give another -o"
                ) from None
            raise UserError(f"cannot lock the output directory {self.out_dir}: {e.strerror or e}") from None
        self._lock = fd  # closed when the process ends: the lock goes with it

    def adopt(self) -> None:
        """Take the model at ``reward-NAME.pt`` (if any) as the installed one: its settings must be
        the flags', and the labels it was made with are those older than it (its ``labels_read_at``,
        else the file's time)."""
        if not os.path.lexists(self.stable):
            return
        from lib.models.policy import resolve_device

        models, ck = load_reward_models(self.stable)
        check_warm_start(models, self.cfg, self.stable)
        device = resolve_device(self.cfg.device)
        for m in models:
            m.to(device)
        metrics = ck.get("metrics") or {}
        version = metrics.get("version") if type(metrics.get("version")) is int else None
        made_at = _number(metrics.get("labels_read_at")) or self.stable.stat().st_mtime
        labels = self.watch.read()
        seen = {k: mu for k, (mu, t) in labels.items() if t is None or t <= made_at}
        same = (
            metrics.get("split") == SPLIT
            and metrics.get("split_seed") == self.cfg.seed
            and metrics.get("split_test_ratio") == self.cfg.test_ratio
        )
        self.installed, self.installed_ck, self.trained_on = Installed(version, models, seen, same), ck, seen
        how = "all held-out labels" if same else "the held-out labels newer than it (not made with this split)"
        self.log(
            f"installed: {self.installed.label} ({self.stable}); {len(seen)} labels are as old as it; "
            f"each version starts from its weights and is compared with it on {how}"
        )

    # --- the loop ---------------------------------------------------------------------------

    def say(self, line: str) -> None:
        """A waiting line, printed when it changes (not at every poll)."""
        if line != self._said:
            self._said = line
            self.log(line)

    def step(self) -> bool:
        """One look at the labels; trains a version when they call for one. True when it did."""
        t_read = time.time()
        labels = self.watch.read()
        now = answers(labels)
        if now == self.failed_on:
            return False
        if self.trained_on is None:
            why = shortfall(((a, b, mu) for (_, a, b), mu in now.items()), self.cfg)
            if why is not None:
                self.say(f"waiting: {why}")
                return False
        else:
            new = count_new(now, self.trained_on, segments_exist)
            if new < self.fcfg.retrain_every:
                self.say(f"waiting: {new}/{self.fcfg.retrain_every} new labels")
                return False
        self._said = ""
        return self.train_version(now, t_read)

    def run(self) -> int:
        """Follow the labels until Ctrl-C / SIGTERM; returns the exit code (130: stopped)."""
        from lib.core.errors import EXIT_INTERRUPTED

        f = self.fcfg
        self.log(
            f"following {len(self.dbs)} DB(s): a new version every {f.retrain_every} new labels, "
            f"looking every {f.poll:g} s; versions in {self.out_dir}/reward-{self.name}-vK.pt, "
            f"the installed one at {self.stable} (Ctrl-C stops)"
        )
        with self.stop:
            try:
                self.claim()
                self.adopt()
                while True:
                    if not self.step():
                        time.sleep(f.poll)
            except KeyboardInterrupt:
                self.log(self.stop_line(self.stop.signal or "SIGINT"))
                return EXIT_INTERRUPTED

    def stop_line(self, signame: str) -> str:
        what = f"{self.installed.label} is installed at {self.stable}" if self.installed else "no version installed"
        abandoned = f"; v{self.training}'s training abandoned, nothing of it written" if self.training else ""
        return f"stopped by {signame}: {what}{abandoned}"

    # --- one version ------------------------------------------------------------------------

    def train_version(self, now: dict[LabelKey, float], t_read: float) -> bool:
        """Train version ``self.k`` on the labels, measure it against the installed model on the
        held-out labels, write it, install it when it is not worse. False (nothing made) when the
        labels whose segments read are too few, or the same as the last version's."""
        k, cfg, inst = self.k, self.cfg, self.installed
        dbs = [d for d in self.dbs if has_labels(d)]
        data = load_preferences(dbs, env=self.env, log=self.log, warn=self.warn)
        pairs = zip(data.pair_labels, data.mu.tolist(), strict=True)
        keys = [(data.dbs[di], *oriented(a, b, mu)) for (di, a, b), mu in pairs]  # (db, first, second, mu)
        why = shortfall(((a, b, mu) for _, a, b, mu in keys), cfg)
        if why is not None:  # labels whose segments are missing or unreadable: wait for more
            self.say(f"waiting: of the labels with readable segments, {why}")
            self.failed_on = now
            return False
        usable = {(db, a, b): mu for db, a, b, mu in keys}
        if self.trained_on is not None and not count_new(usable, self.trained_on):
            # the new labels' segments do not read: the same training set, no version for nothing
            self.say(f"waiting: the new labels' segments are not readable, {len(usable)} usable labels as before")
            self.failed_on = now
            return False
        train, test = split_by_pair(data.pair_labels, cfg.seed, cfg.test_ratio)
        if inst is not None:
            check_fits_data(inst.models, self.installed_ck, data, self.stable)
            fresh = np.array([i for i in test if inst.seen.get(keys[i][:3]) != keys[i][3]], dtype=np.int64)
        else:
            fresh = test
        self.training, t0 = k, time.perf_counter()
        try:
            record, ck, fit_models = self._fit(k, data, train, test, fresh, inst)
        except Diverged as e:
            record, ck, fit_models = (
                {"installed": False, "why": f"training diverged in epoch {e.epoch}: {e.what}"},
                None,
                None,
            )
        seconds = time.perf_counter() - t0
        record = {
            "version": k,
            "time": time.time(),
            "labels": data.n_pairs,
            "train_pairs": int(len(train)),
            "heldout_pairs": int(len(test)),
            "fresh_pairs": int(len(fresh)) if inst is not None else 0,
            "installed_before": inst.version if inst is not None else None,
            "seconds": round(seconds, 2),
            **record,
            "file": version_path(self.out_dir, self.name, k).name if ck is not None else None,
        }
        if ck is not None:
            ck["metrics"].update(
                {key: _json_value(record[key]) for key in record if key not in ("time", "file")},
                split=SPLIT,
                split_seed=cfg.seed,
                split_test_ratio=cfg.test_ratio,
                labels_read_at=t_read,
            )
        with self.stop.critical():  # a stop signal waits until the version is written
            self._write_version(k, ck, record)
            self.k, self.trained_on, self.training, self.failed_on = k + 1, now, None, None
            if record["installed"] and fit_models is not None:
                self.installed = Installed(k, fit_models, now, True)
                self.installed_ck = ck or {}
            self._tensorboard(record, data)
        self.log(self.version_line(record, inst))
        return True

    def _fit(
        self,
        k: int,
        data: PreferenceData,
        train: np.ndarray,
        test: np.ndarray,
        fresh: np.ndarray,
        inst: Installed | None,
    ) -> tuple[dict[str, Any], dict[str, Any], list[AnyRewardModel]]:
        """Train candidate ``k`` (warm from ``inst``) and decide: install it when its held-out loss
        is not higher than the installed model's. Loss, not accuracy: it counts ties and how sure
        each answer is, and moves with every label. A model not made with this split is compared on
        the held-out labels newer than it only. Returns (the version's figures and decision,
        checkpoint, models)."""
        from lib.reward.eval import pair_metrics

        cfg = self.cfg
        init = [{n: v.detach().clone() for n, v in m.state_dict().items()} for m in inst.models] if inst else None
        fit = _build_fit(data, cfg, (train, test), init=init)
        meta = _checkpoint_meta(fit)
        vlog: Log = lambda line: self.log(f"v{k} {line}")  # noqa: E731
        vlog(
            f"training on {fit.n_train} labels, {len(test)} held out"
            + (f", warm from {inst.label}" if inst else ", from scratch (no model installed yet)")
        )
        run = _run_epochs(fit, meta, None, None, self.progress, vlog, keep_on_interrupt=False)
        assert run.best is not None  # --epochs >= 1
        ck, _, _ = best_epoch_checkpoint(
            fit, run.best, run.best_states, {**meta, "finished": True, "stopped": run.stopped}
        )
        b = run.best
        rec: dict[str, Any] = {
            "best_epoch": b.epoch,
            "heldout_loss": b.test_loss,
            "heldout_accuracy": b.test_accuracy,
            "oracle_agreement": b.oracle_agreement,
        }
        if inst is None:
            rec.update(installed=True, why="no model installed yet")
            return rec, ck, fit.models
        noise = fit.noise
        if len(fresh):
            old = pair_metrics(inst.models, data, fresh, fit.device, noise)
            new = pair_metrics(fit.models, data, fresh, fit.device, noise)
            rec.update(fresh_accuracy=old["accuracy"], fresh_loss=old["loss"], fresh_accuracy_new=new["accuracy"])
        cmp = test if inst.same_split else fresh
        if not len(cmp):
            rec.update(installed=True, why=f"no held-out label {inst.label} did not see: nothing says it is better")
            return rec, ck, fit.models
        old = pair_metrics(inst.models, data, cmp, fit.device, noise)
        new = pair_metrics(fit.models, data, cmp, fit.device, noise) if not inst.same_split else None
        cand_loss, cand_acc = (b.test_loss, b.test_accuracy) if new is None else (new["loss"], new["accuracy"])
        rec.update(
            compared_pairs=int(len(cmp)),
            candidate_loss=cand_loss,
            candidate_accuracy=cand_acc,
            installed_heldout_loss=old["loss"],
            installed_heldout_accuracy=old["accuracy"],
        )
        better = cand_loss <= old["loss"]
        sign = "<=" if better else ">"
        rec["installed"] = better
        rec["why"] = f"held-out loss {cand_loss:.4f} {sign} {old['loss']:.4f} of {inst.label} on {len(cmp)} pairs"
        return rec, ck, fit.models

    def _write_version(self, k: int, ck: dict[str, Any] | None, record: dict[str, Any]) -> None:
        """Version ``k``'s file, its install at ``reward-NAME.pt`` and its log line: all or none (a
        full disk is a UserError, the previous model still installed). The install is staged to a
        temp file and renamed over the stable file only once the log line is written."""
        vpath = version_path(self.out_dir, self.name, k)
        staged: str | None = None
        try:
            if ck is not None:
                save_reward_checkpoint(ck, vpath)
                if record["installed"]:
                    staged = stage_torch_save(ck, self.stable, "reward model")
            self._append_version(record)
        except BaseException:
            for path in (staged, vpath if ck is not None else None):
                if path is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            raise
        if staged is not None:
            install(staged, self.stable)

    def _append_version(self, record: dict[str, Any]) -> None:
        """One line, whole or not at all: a failed write is cut back off (a torn line would swallow
        the next one)."""
        path = versions_log(self.out_dir, self.name)
        line = json.dumps({k: _json_value(v) for k, v in record.items()}) + "\n"
        try:
            with open_append(path) as f:
                fd, data = f.fileno(), memoryview(line.encode())
                size = os.fstat(fd).st_size
                try:  # os.write, not f.write: a buffer left after a failed flush is written again at close
                    while data:
                        data = data[os.write(fd, data) :]
                    os.fsync(fd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.ftruncate(f.fileno(), size)
                    raise
        except UnsafeFileError as e:
            raise UserError(str(e)) from None
        except OSError as e:
            raise UserError(f"cannot append to {path}: {e.strerror or e} (v{record['version']} not made)") from None

    def version_line(self, r: dict[str, Any], inst: Installed | None) -> str:
        """ "v3: trained on 120 labels in 14 s, held-out acc 81.0% vs v2's 78.0% (...): installed"."""
        k = r["version"]
        if "heldout_loss" not in r:
            return f"v{k}: {r['why']}: not installed, nothing written"
        line = f"v{k}: trained on {r['train_pairs']} labels in {r['seconds']:.0f} s, "
        acc = _fmt(r["heldout_accuracy"], True)
        if "installed_heldout_loss" in r:
            line += (
                f"held-out acc {_fmt(r['candidate_accuracy'], True)} vs {inst.label if inst else ''}'s "
                f"{_fmt(r['installed_heldout_accuracy'], True)} ({r['why']})"
            )
        else:
            line += f"held-out acc {acc} on {r['heldout_pairs']} pairs ({r['why']})"
        if "fresh_accuracy" in r and inst is not None:
            fresh = _fmt(r["fresh_accuracy"], True)
            line += f"; fresh: {inst.label}'s acc {fresh} on {r['fresh_pairs']} held-out labels newer than it"
        line += ": installed" if r["installed"] else ": kept as " + str(r["file"]) + ", not installed"
        return line

    def _tensorboard(self, r: dict[str, Any], data: PreferenceData) -> None:
        """Per version, against the label count: ``follow/...``."""
        w = self.writer
        if w is None:
            return
        step = data.n_pairs
        figures = {
            "follow/version": r["version"],
            "follow/installed_version": self.installed.version if self.installed else None,
            "follow/heldout_loss": r.get("heldout_loss"),
            "follow/heldout_accuracy": r.get("heldout_accuracy"),
            "follow/installed_heldout_loss": r.get("installed_heldout_loss"),
            "follow/installed_heldout_accuracy": r.get("installed_heldout_accuracy"),
            "follow/fresh_accuracy": r.get("fresh_accuracy"),
            "follow/fresh_pairs": r.get("fresh_pairs"),
            "follow/heldout_pairs": r.get("heldout_pairs"),
            "follow/seconds": r.get("seconds"),
        }
        if data.has_true_returns:
            figures["follow/oracle_agreement"] = r.get("oracle_agreement")
        for tag, v in figures.items():
            if _number(v) is not None:
                w.add_scalar(tag, v, step)
        w.flush()
