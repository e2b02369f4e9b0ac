"""Training the reward model on the preference labels of one or more segment DBs
(``lib/reward/data.py`` reads them, ``lib/reward/eval.py`` measures the test pairs).
``train_reward_model`` fits by Bradley-Terry in micro-batches with gradient accumulation, so
activation memory is bounded by ``micro_frames``, not ``--batch``. It stops early on test loss,
writes every new best aside (``<stem>.partial.pt``) and installs the best at the end, keeping the
old model as ``<stem>.prev.pt``. ``held_out`` is ``--follow``'s split by pair hash."""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lib.core.errors import UserError
from lib.core.files import remove_stale_temps
from lib.models.reward import (
    NOISE_EPS,
    AnyRewardModel,
    DiffRewardModel,
    new_reward_model,
    preference_loss,
    reward_checkpoint,
    save_reward_checkpoint,
)
from lib.reward.config import PATIENCE, TrainConfig
from lib.reward.data import Log, PreferenceData, model_inputs, step_features
from lib.reward.eval import norm_stats, pair_metrics, true_step_stats
from lib.store.checkpoints import state_is_finite
from lib.store.labels import pair_key


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
        """An epoch's figures from its training loss and the test pairs' ``pair_metrics``."""
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
    stopped: str  # why training ended: max epochs, early stop, or STOPPED_BY_HAND
    finished: bool  # False: stopped by hand, the checkpoint says so and reusers retrain it


def split_pairs(n: int, test_ratio: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of pair indices into (train, test); at least one of each."""
    if not 0.0 < test_ratio < 1.0:
        raise UserError(f"--test-ratio must be between 0 and 1, got {test_ratio}")
    perm = rng.permutation(n)
    n_test = min(max(1, round(n * test_ratio)), n - 1)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def held_out(sample1: str, sample2: str, seed: int, test_ratio: float) -> bool:
    """Whether the pair is a test pair of ``--follow``'s split: a seeded hash of the order-free pair
    key below ``test_ratio``. It depends on the pair alone, so a held-out label stays held out
    however many labels arrive. About ``test_ratio`` of the pairs, not exactly."""
    a, b = pair_key(sample1, sample2)
    h = hashlib.blake2b(f"{seed}\n{a}\n{b}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") < test_ratio * 2**64


def split_by_pair(
    labels: Sequence[tuple[int, str, str]], seed: int, test_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of labelled pairs ``labels`` ((db, sample1, sample2) each, as
    ``PreferenceData.pair_labels``) by ``held_out``; either side may be empty."""
    test = np.array([held_out(a, b, seed, test_ratio) for _, a, b in labels], dtype=bool)
    return np.flatnonzero(~test), np.flatnonzero(test)


def micro_batches(data: PreferenceData, pairs: np.ndarray, micro_frames: int) -> list[np.ndarray]:
    """Split a batch of pair indices into micro-batches whose distinct segments hold at most
    ``micro_frames`` steps (always at least one pair)."""
    pairs = np.asarray(pairs)
    lengths = data.lengths
    out: list[np.ndarray] = []
    cur: list[int] = []
    segs: set[int] = set()
    frames = 0
    for p, x, y in zip(pairs.tolist(), data.first[pairs].tolist(), data.second[pairs].tolist(), strict=True):
        new = {x, y} - segs
        add = int(sum(lengths[s] for s in new))
        if cur and frames + add > micro_frames:
            out.append(np.asarray(cur))
            cur, segs, frames = [], set(), 0
            new = {x, y}
            add = int(sum(lengths[s] for s in new))
        cur.append(p)
        segs |= new
        frames += add
    if cur:
        out.append(np.asarray(cur))
    return out


def _pair_returns(
    model: AnyRewardModel, data: PreferenceData, pairs: np.ndarray, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted returns (R1, R2), each (P,), of labeled pairs ``pairs``: one forward over their
    distinct segments (a diff net's features come from the per-segment cache)."""
    a, b = data.first[pairs], data.second[pairs]
    segs, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    if isinstance(model, DiffRewardModel):
        f, actions, owner = step_features(model, data, segs, device)
        r = model.head(f, torch.from_numpy(actions).to(device))  # (F,)
    else:
        frames, actions, owner = model_inputs(data, segs, model.arch)
        r = model(torch.from_numpy(frames).to(device), torch.from_numpy(actions).to(device))  # (F,)
    returns = torch.zeros(len(segs), device=device, dtype=r.dtype).index_add(0, torch.from_numpy(owner).to(device), r)
    inv_t = torch.from_numpy(inv).to(device)
    return returns[inv_t[: len(a)]], returns[inv_t[len(a) :]]


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (Linux only; returns False elsewhere). Training
    frees and allocates the same ~20 MB activation tensors every micro-batch; by default glibc
    returns them to the OS and the next micro-batch page-faults them in again. With the mmap
    threshold at its maximum (32 MB) and no trimming, freed memory is reused; RSS stays at its peak
    until exit."""
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


def _build_fit(
    data: PreferenceData,
    cfg: TrainConfig,
    split: tuple[np.ndarray, np.ndarray] | None = None,
    init: Sequence[dict[str, torch.Tensor]] | None = None,
) -> _Fit:
    """The models, optimisers and pairs of one training run. ``split``: its (train, test) pair
    indices (default ``split_pairs``); ``init``: a state dict per member to start from (a warm start
    keeps the diff net's input scale)."""
    from lib.models.policy import resolve_device

    device = resolve_device(cfg.device)
    if cfg.patience is None and cfg.arch in PATIENCE:
        cfg = replace(cfg, patience=PATIENCE[cfg.arch])
    cfg.check()
    keep_freed_memory()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    train, test = split_pairs(data.n_pairs, cfg.test_ratio, rng) if split is None else split
    if (data.mu[train] == 0.5).all():
        raise UserError(
            f"all {len(train)} training labels are ties: nothing to learn an order from; "
            f"label more pairs where one segment is better"
        )
    models = [
        new_reward_model(
            cfg.arch,
            data.n_actions,
            data.frame_shape,
            mask_rows=cfg.mask_rows,
            block=cfg.diff_block,
            flow=cfg.diff_flow,
            flow_scene=cfg.diff_flow_scene,
        )
        for _ in range(cfg.ensemble)
    ]
    if init is not None:
        if len(init) != len(models):
            raise UserError(f"the model to start from has {len(init)} members, --ensemble is {cfg.ensemble}")
        for m, sd in zip(models, init, strict=True):
            m.load_state_dict(sd)
    for m in models:
        m.to(device, memory_format=torch.channels_last).train()
    if init is None:
        _fit_input_scale(models, data, train, rng, device)
    members = [train] if cfg.ensemble == 1 else [rng.choice(train, size=len(train)) for _ in range(cfg.ensemble)]
    return _Fit(
        data,
        cfg,
        device,
        models,
        [torch.optim.Adam(m.parameters(), lr=cfg.lr) for m in models],
        members,
        test,
        NOISE_EPS if cfg.noise else 0.0,
        rng,
    )


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
    """One pass over the training pairs in batches of ``cfg.batch``, each in micro-batches of at
    most ``cfg.micro_frames`` steps whose gradients accumulate to the batch-mean loss. Returns (mean
    train loss, pairs seen, seconds)."""
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
            r1, r2 = _pair_returns(model, data, mb, fit.device)
            loss, _ = preference_loss(r1, r2, torch.from_numpy(data.mu[mb]).to(fit.device), fit.noise)
            value = float(loss.detach())
            if not math.isfinite(value):
                bar.close()
                raise Diverged(epoch, f"the training loss is {value}")
            (loss * (len(mb) / len(batch))).backward()
            loss_sum += value * len(mb)
            n_seen += len(mb)
            bar.update(len(mb))
        opt.step()
        bar.set_postfix(loss=f"{loss_sum / max(n_seen, 1):.4f}")
    bar.close()
    return loss_sum / max(n_seen, 1), n_seen, time.perf_counter() - t0


def train_reward_model(
    data: PreferenceData,
    cfg: TrainConfig,
    out_path: str | os.PathLike,
    writer: Any | None = None,
    progress: bool = True,
    log: Log = print,
) -> TrainResult:
    """Fit the reward model to ``data`` and install the best checkpoint (lowest test loss) at
    ``out_path``. Each optimiser step sees ``cfg.batch`` pairs; with ``cfg.ensemble`` K > 1 each
    member trains on its own bootstrap sample. Training stops after ``cfg.patience`` epochs without
    a better test loss, at ``cfg.epochs``, or at Ctrl-C (the best so far is installed, marked
    ``"finished": False``)."""
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
        ended = {"finished": run.finished, "stopped": run.stopped}
        mean, std = _install_best(fit, run.best, run.best_states, {**meta, **ended}, out_path, log)
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
        finished=run.finished,
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


STOPPED_BY_HAND = "stopped early by hand (Ctrl-C)"


@dataclass
class _Progress:
    """The training loop's running state: every epoch's figures, the best epoch so far and its
    weights (on the CPU), and why the loop ended."""

    history: list[EpochMetrics] = field(default_factory=list)
    best: EpochMetrics | None = None
    best_states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    stopped: str = "max epochs"

    @property
    def finished(self) -> bool:
        """Whether training ended by itself (early stop or max epochs), not by Ctrl-C."""
        return self.stopped != STOPPED_BY_HAND

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
    fit: _Fit,
    meta: dict[str, Any],
    partial_path: Path | None,
    writer: Any | None,
    progress: bool,
    log: Log,
    keep_on_interrupt: bool = True,
) -> _Progress:
    """Train up to ``cfg.epochs`` epochs, evaluating and logging each. Every new best is kept in
    memory and written to ``partial_path`` (unless None), never over the installed model. Stops
    after ``cfg.patience`` epochs without a better test loss, and at Ctrl-C; with
    ``keep_on_interrupt`` False the KeyboardInterrupt goes on up."""
    cfg, run = fit.cfg, _Progress()
    try:
        for epoch in range(cfg.epochs):
            train_loss, n_seen, seconds = train_epoch(fit, epoch, progress)
            _check_finite_models(fit.models, epoch)
            ev = pair_metrics(fit.models, fit.data, fit.test, fit.device, fit.noise)
            for key in ("loss", "step_mean", "step_std"):
                if not math.isfinite(ev[key]):
                    raise Diverged(epoch, f"the test {key.replace('_', ' ')} is {ev[key]}")
            em = EpochMetrics.of(epoch, train_loss, ev, seconds, n_seen)
            run.history.append(em)
            improved = run.improves(em)
            if improved:
                run.keep(em, fit.models)  # before its line: a Ctrl-C after a "*" line keeps that epoch
            _report_epoch(fit, em, improved, writer, log)
            if improved and partial_path is not None:
                ck = reward_checkpoint(
                    fit.models,
                    norm_mean=ev["step_mean"],
                    norm_std=ev["step_std"],
                    metrics=em.as_dict(),
                    epoch=epoch,
                    **meta,
                    finished=False,
                    stopped="in progress",
                )
                save_reward_checkpoint(ck, partial_path)
            elif not improved and epoch - run.best.epoch >= cfg.patience:
                run.stopped = f"early stop: test loss not better for {cfg.patience} epochs"
                break
    except KeyboardInterrupt:
        if not keep_on_interrupt:
            raise
        run.stopped = STOPPED_BY_HAND
        log("interrupted: keeping the best model so far, marked as stopped early by hand")
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
    """An epoch's scalars, in the tag scheme of every stage (``lib/core/tb.py``)."""
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


def best_epoch_checkpoint(
    fit: _Fit, best: EpochMetrics, states: list[dict[str, torch.Tensor]], meta: dict[str, Any]
) -> tuple[dict[str, Any], float, float]:
    """Put the best weights back into ``fit.models``, measure their per-step prediction stats over
    up to 256 labeled segments (what the wrapper normalises with until its window fills), and make
    the checkpoint. Returns (checkpoint, mean, std)."""
    for m, sd in zip(fit.models, states, strict=True):
        m.load_state_dict(sd)
    data = fit.data
    all_segs = np.unique(np.concatenate([data.first, data.second]))
    sample = np.sort(fit.rng.choice(all_segs, size=min(len(all_segs), 256), replace=False))
    mean, std = norm_stats(fit.models, data, sample, fit.device)
    if not (math.isfinite(mean) and math.isfinite(std)):
        raise Diverged(best.epoch, f"the per-step prediction mean {mean} / std {std} is not finite")
    scores = true_step_stats(data, sample)
    if scores is not None:
        meta = {**meta, "score_mean": scores[0], "score_std": scores[1]}
    ck = reward_checkpoint(fit.models, norm_mean=mean, norm_std=std, metrics=best.as_dict(), epoch=best.epoch, **meta)
    return ck, mean, std


def _install_best(
    fit: _Fit,
    best: EpochMetrics,
    states: list[dict[str, torch.Tensor]],
    meta: dict[str, Any],
    out_path: Path,
    log: Log,
) -> tuple[float, float]:
    """``best_epoch_checkpoint``, installed at ``out_path``. Returns (mean, std)."""
    ck, mean, std = best_epoch_checkpoint(fit, best, states, meta)
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
    if not res.finished:
        lines.append(
            f"  not a finished training: {res.path.name} records that it was stopped early by hand, and "
            f"experiments/round.py trains it again; run the same command to train to the end"
        )
    return lines
