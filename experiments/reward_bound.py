"""The reward net's reach: stage 3's own network and input, fitted by regression to the surface
rule's per-step pay (``lib.atari.seaquest.step_pay``: the score's sign, +1 on each step the sub climbs
with a low gauge and a diver aboard, +1 on each refill) of a DB's segments, no preferences at all.

Preferences tell a model about a clip's sum; this fit tells it each step's pay outright. If even
this model cannot follow the pay on held-out segments (its per-step correlation on the low-gauge
diver steps, where the climb's pay lives), no number of labels will teach stage 3's input the climb.
The segments are split into a training and a held-out part (by segment, ``--test-share``); training
stops when the held-out squared error has not improved for ``--patience`` epochs. The model is
written as stage 3 writes one (``01_a2c.py -r`` loads it, ``03_reward_train.py --evaluate`` scores
it), with its normalisation statistics over the training segments.

    python -m experiments.reward_bound runs/sdb -o runs/bound/reward-bound.pt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.flags import check_out
from lib.atari.seaquest import OXYGEN_GAMES, StepPay, shows_gauge
from lib.core.errors import UserError, run_cli, warn
from lib.core.files import atomic_write
from lib.core.settings import at_least, check_fields, in_range, setting, within
from lib.core.settings import build_parser as settings_parser
from lib.models.teachers import TEACHER_ENTRIES
from lib.reward.config import DIFF_BLOCK, POLICY_FRAME, block_arg

TARGETS = {"pay": "refill", "moves": "moves"}  # --target: the teacher whose per-step pay is fitted
GROUPS = {"data": "the data", "fit": "the fit", "model": "the input (stage 3's diff net)"}


@dataclass(frozen=True)
class BoundSettings:
    """What ``python -m experiments.reward_bound`` is told, one field per flag."""

    dbs: list[str] = setting(
        help="segment DBs of SeaQuest play with true rewards", group="data", positional=True, nargs="+"
    )
    out: str = setting(
        "runs/bound/reward-bound.pt", "where the fitted reward model is written", group="data", flags=("-o", "--out")
    )
    test_share: float = setting(
        0.2, "share of the segments held out", group="data", checks=within("--test-share", 0.05, 0.9)
    )
    seed: int = setting(0, "the split and the fit's seed", group="data")
    target: str = setting(
        "pay",
        "what is fitted: pay, the refill teacher's per-step pay; moves, the same with each step up with a low "
        "gauge and a diver aboard +1 and each step down -1 in place of the climb (a function of the step alone)",
        group="data",
        choices=tuple(TARGETS),
    )
    epochs: int = setting(200, "epochs at most", group="fit", checks=in_range("--epochs", 1, 100_000))
    patience: int = setting(
        20, "stop after this many epochs without a lower held-out error", group="fit", checks=at_least("--patience", 1)
    )
    lr: float = setting(1e-3, "Adam's learning rate", group="fit", checks=within("--lr", 0.0, 1.0, "(]"))
    batch: int = setting(256, "steps per optimiser step", group="fit", checks=in_range("--batch", 1, 1 << 20))
    threads: int = setting(2, "torch threads", group="fit", checks=in_range("--threads", 1, 256))
    diff_block: tuple[int, int] = setting(
        DIFF_BLOCK,
        f"the block the frame and its change are averaged over, as stage 3's --diff-block "
        f"(default {DIFF_BLOCK[0]}x{DIFF_BLOCK[1]})",
        group="model",
        type=block_arg,
        metavar="ROWSxCOLS",
        checks=[
            (
                lambda v: all(POLICY_FRAME % x == 0 for x in v),
                f"{{flag}} must be two divisors of {POLICY_FRAME}, got {{v}}",
            )
        ],
    )
    diff_flow: bool = setting(False, "also the scene's shift, as stage 3's --diff-flow", group="model")
    diff_flow_scene: bool = setting(False, "--diff-flow: also each shift times each block, as stage 3's", group="model")


def build_parser() -> argparse.ArgumentParser:
    return settings_parser(
        BoundSettings,
        "python -m experiments.reward_bound",
        "Fit stage 3's reward net to the surface rule's per-step pay by regression and report how well it "
        "follows the pay on held-out segments (module docstring)",
        GROUPS,
    )


@dataclass
class PaidSteps:
    """Every step of the readable segments: the net's input, actions, pay and where each belongs.
    x: (F, 2, 84, 84) uint8; actions (F,) int64; pay (StepPay per segment); owner (F,) segment index."""

    x: np.ndarray
    actions: np.ndarray
    pays: list[StepPay]
    owner: np.ndarray
    names: list[str]
    env_id: str
    game: str
    action_meanings: tuple[str, ...]


def read_paid_steps(dbs: list[str]) -> PaidSteps:
    """The segments of ``dbs`` with their per-step pay; a segment that cannot be read, or has no true
    rewards, is skipped with one warning. UserError for a DB that is missing, holds another game or
    no usable segment."""
    from lib.atari.seaquest import step_pay
    from lib.models.reward import reward_input
    from lib.store.segments import SegmentError, db_game, list_segments, read_db_info, read_segment

    xs, acts, pays, owners, names = [], [], [], [], []
    ident: tuple[str, str, tuple[str, ...]] | None = None
    for db in dbs:
        root = Path(db)
        if not root.is_dir():
            raise UserError(f"DB not found: {root}")
        game = (db_game(root, warn=None) or (None, None))[0]
        if game is not None and game not in OXYGEN_GAMES:
            raise UserError(f"{root} holds {game}: the pay reads SeaQuest's screen")
        info = read_db_info(root, warn=None)
        for rel in list_segments(root):
            try:
                seg = read_segment(root, rel)
            except SegmentError as e:
                warn(f"skipped: {e}")
                continue
            if seg.rewards is None or not shows_gauge("seaquest", seg.frames.shape[1:]):
                warn(f"skipped: {root / rel}: no true rewards or not a full-resolution frame")
                continue
            meanings = tuple(seg.action_meanings or (info.action_meanings if info else ()))
            here = (seg.env_id or (info.env_id if info else ""), "seaquest", meanings)
            if not meanings:
                warn(f"skipped: {root / rel}: names no actions")
                continue
            if ident is not None and here[2] != ident[2]:
                raise UserError(f"{root / rel} has other actions than the segments before it: one game per fit")
            ident = ident or here
            xs.append(np.asarray(reward_input("diff", seg.frames, None, seg.game_over)))
            acts.append(np.asarray(seg.actions, dtype=np.int64))
            pays.append(step_pay(seg.frames, seg.rewards, seg.dones))
            owners.append(np.full(len(seg), len(names), dtype=np.int64))
            names.append(f"{root}/{rel}")
    if ident is None or len(names) < 2:
        raise UserError(f"fewer than 2 usable segments in {', '.join(dbs)}: nothing to fit")
    return PaidSteps(
        np.concatenate(xs), np.concatenate(acts), pays, np.concatenate(owners), names, ident[0], ident[1], ident[2]
    )


def target_of(p: StepPay, target: str) -> np.ndarray:
    """The per-step values fitted (``--target``): the pay its teacher sums (``TeacherEntry.step_pay``)."""
    pay_of = TEACHER_ENTRIES[TARGETS[target]].step_pay
    assert pay_of is not None
    return pay_of(p)


def fit(s: BoundSettings, data: PaidSteps, log=print) -> tuple[object, dict[str, float]]:
    """Fit a fresh diff net to the pay; returns the model (eval mode, best held-out epoch) and the
    figures (held-out and training pay scores, epochs, seconds)."""
    import torch

    from lib.models.reward import new_reward_model
    from lib.reward.eval import pay_scores

    torch.manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    n_seg = len(data.names)
    held = np.zeros(n_seg, dtype=bool)
    held[rng.permutation(n_seg)[: max(1, round(s.test_share * n_seg))]] = True
    test, train = held[data.owner], ~held[data.owner]
    pay = torch.from_numpy(np.concatenate([target_of(p, s.target) for p in data.pays]).astype(np.float32))
    model = new_reward_model(
        "diff",
        len(data.action_meanings),
        block=s.diff_block,
        flow=s.diff_flow,
        flow_scene=s.diff_flow_scene,
    )
    with torch.no_grad():
        feats = torch.cat([model.features(torch.from_numpy(data.x[i : i + 2048])) for i in range(0, len(data.x), 2048)])
    model.scale_to(feats[torch.from_numpy(train)])
    actions = torch.from_numpy(data.actions)
    tr, te = torch.from_numpy(np.flatnonzero(train)), torch.from_numpy(np.flatnonzero(test))
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)
    best, best_state, since, t0 = math.inf, None, 0, time.monotonic()
    epoch = 0
    for epoch in range(1, s.epochs + 1):
        model.train()
        order = tr[torch.randperm(len(tr))]
        for i in range(0, len(order), s.batch):
            b = order[i : i + s.batch]
            loss = torch.nn.functional.mse_loss(model.head(feats[b], actions[b]), pay[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            err = float(torch.nn.functional.mse_loss(model.head(feats[te], actions[te]), pay[te]))
        if err < best - 1e-7:
            best, since = err, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            since += 1
        if epoch % 10 == 0 or since == 0 and epoch <= 3:
            log(f"epoch {epoch}: held-out squared error {err:.4f} (best {best:.4f})")
        if since >= s.patience:
            break
    assert best_state is not None
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        pred = model.head(feats, actions).numpy()
    held_pays = [p for p, h in zip(data.pays, held, strict=True) if h]
    train_pays = [p for p, h in zip(data.pays, held, strict=True) if not h]
    figures = {
        "held_out": pay_scores(pred[test], held_pays),
        "train": pay_scores(pred[train], train_pays),
        "held_out_target": pay_scores(pred[test], held_pays, lambda p: target_of(p, s.target)),
        "epochs": epoch,
        "held_out_mse": best,
        "seconds": time.monotonic() - t0,
        "norm_mean": float(pred[train].mean()),
        "norm_std": float(pred[train].std()),
        "held_out_segments": int(held.sum()),
        "train_segments": int((~held).sum()),
    }
    return model, figures


def main(argv: list[str] | None = None) -> int:
    s = BoundSettings(**vars(build_parser().parse_args(argv)))
    check_fields(s)
    if s.diff_flow_scene and not s.diff_flow:
        raise UserError("--diff-flow-scene needs --diff-flow")
    out = Path(s.out)
    check_out(out, ".pt")
    import torch

    from lib.models.reward import reward_checkpoint, save_reward_checkpoint

    torch.set_num_threads(s.threads)
    data = read_paid_steps(s.dbs)
    paid = sum(int(np.count_nonzero(p.pay)) for p in data.pays)
    low = sum(int(p.low_diver.sum()) for p in data.pays)
    climbs = sum(int(p.climb.sum()) for p in data.pays)
    print(
        f"{len(data.names)} segments, {len(data.x):,} steps: {paid:,} paid, {low:,} low-gauge diver steps, "
        f"{climbs:,} climb steps"
    )
    model, f = fit(s, data)
    held, train = f["held_out"], f["train"]
    print(f"held-out ({f['held_out_segments']} segments): {held.text()}")
    print(f"training ({f['train_segments']} segments): {train.text()}")
    if s.target != "pay":
        print(f"held-out against the fitted {s.target}: {f['held_out_target'].text()}")
    metrics = {
        "bound_target": s.target,
        "bound_target_low_diver_corr": f["held_out_target"].low_diver_corr,
        "bound_corr": held.corr,
        "bound_low_diver_corr": held.low_diver_corr,
        "bound_unpaid_variance": held.unpaid_variance,
        "bound_train_corr": train.corr,
        "bound_train_low_diver_corr": train.low_diver_corr,
        "bound_held_out_mse": f["held_out_mse"],
        "bound_epochs": f["epochs"],
    }
    ck = reward_checkpoint(
        [model], data.env_id, data.game, data.action_meanings, f["norm_mean"], f["norm_std"], metrics, finished=True
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    save_reward_checkpoint(ck, out)
    summary = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    atomic_write(out.with_suffix(".json"), json.dumps({"dbs": s.dbs, **summary}, indent=1).encode())
    print(f"wrote {out} ({f['epochs']} epochs, {f['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
