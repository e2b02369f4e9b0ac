"""Training the reward model: data loading, bad inputs, a known rule, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.dbs import appear_frames, make_appear_db, make_square_db, square_frames, write_legacy_segment
from lib.core.errors import UserError
from lib.label_ui.oracle import oracle_label_db
from lib.models.reward import RewardModel, load_reward_model, preference_loss
from lib.reward.config import TrainConfig
from lib.reward.data import load_preferences, model_inputs
from lib.reward.train import _build_fit, _pair_returns, micro_batches, split_pairs, train_reward_model
from lib.store.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER, Label, append_labels

ROOT = Path(__file__).resolve().parents[1]


def _quiet(_: str) -> None:
    pass


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from 2 threads, and OpenMP threads on a busy 2-core machine
    (tests of other stages running too) can be several times slower than one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def square_db(tmp_path: Path) -> tuple[Path, list[str]]:
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=40, steps=10, seed=0)
    return db, rels


def _label(db: Path, pairs: list[tuple[str, str, int]]) -> None:
    append_labels(db, [Label(a, b, lab, source="test") for a, b, lab in pairs])


@pytest.mark.parametrize("arch", ["book", "diff"])
def test_known_rule_is_learned_in_seconds(square_db, tmp_path, arch):
    """Reward = a bright square in the frame: oracle labels -> over 90% test accuracy."""
    db, _ = square_db
    oracle_label_db(db, 150, seed=1)
    data = load_preferences([db], log=_quiet)
    assert data.n_pairs == 150 and data.has_true_returns and data.frame_shape == (48, 48, 3)
    cfg = TrainConfig(epochs=8, batch=16, lr=1e-3, patience=8, seed=0, arch=arch)
    res = train_reward_model(data, cfg, tmp_path / "out" / "r.pt", progress=False, log=_quiet)
    assert res.best.test_accuracy > 0.9
    assert res.best.oracle_agreement > 0.9 and res.best.return_corr > 0.8
    rm = load_reward_model(res.path, game="seaquest", n_actions=18)
    assert rm.metrics["test_accuracy"] == pytest.approx(res.best.test_accuracy)
    assert rm.norm_std > 0 and rm.has_norm_stats
    # the model learned the rule per step, not only per segment: squares score higher
    frames, rewards = square_frames(np.random.default_rng(5), 200)
    pred = rm.predict(frames, np.zeros(200, dtype=np.int64), frames)  # a diff model: steps that changed nothing
    assert pred[rewards == 1].mean() > pred[rewards == 0].mean()
    assert rm.arch == arch


def _step_corr(rm, seed: int, clips: int = 40, n: int = 10) -> float:
    """Per-step correlation of predicted and true rewards over fresh clips, each step given the
    frame it led to."""
    rng = np.random.default_rng(seed)
    pred, true = [], []
    for _ in range(clips):
        frames, rewards = appear_frames(rng, n)
        pred.append(rm.predict(frames[:-1], np.zeros(n, dtype=np.int64), frames[1:]))
        true.append(rewards)
    return float(np.corrcoef(np.concatenate(pred), np.concatenate(true))[0, 1])


@pytest.mark.slow
def test_only_the_diff_net_places_a_reward_its_frame_cannot_show(tmp_path):
    """A point shows in the NEXT frame's score bar. The book's net sees the frame the action was
    chosen on, so it cannot tell which step earned it; the diff net sees the step's outcome."""
    db = tmp_path / "db"
    make_appear_db(db, n_segments=80, steps=10, seed=3)
    oracle_label_db(db, 200, seed=1)
    data = load_preferences([db], log=_quiet)
    corr = {}
    for arch in ("book", "diff"):
        cfg = TrainConfig(epochs=12, batch=16, lr=1e-3, patience=12, seed=0, arch=arch)
        res = train_reward_model(data, cfg, tmp_path / f"{arch}.pt", progress=False, log=_quiet)
        corr[arch] = _step_corr(load_reward_model(res.path), seed=11)
    assert corr["diff"] > 0.4 and corr["diff"] > corr["book"] + 0.3, corr  # measured 0.64 and 0.06


def test_labels_are_read_with_skips_reported(square_db):
    db, rels = square_db
    _label(
        db,
        [
            (rels[0], rels[1], FIRST_BETTER),
            (rels[2], rels[3], CANT_TELL),
            (rels[4], rels[5], EQUAL),
            (rels[6], "07/00000001.dat", SECOND_BETTER),
            (rels[1], rels[0], SECOND_BETTER),
        ],
    )
    (db / rels[7]).write_bytes(b"garbage")
    _label(db, [(rels[7], rels[8], FIRST_BETTER)])
    lines: list[str] = []
    data = load_preferences([db], log=lines.append)
    # (0,1) relabelled as (1,0) "second better" -> mu 0 for the pair (1, 0): the last answer wins
    assert data.n_pairs == 2 and sorted(data.mu.tolist()) == [0.0, 0.5]
    assert data.skipped == {"cant_tell": 1, "missing": 1, "unreadable": 1}
    assert any(
        "1 can't tell left out" in s
        and "1 left out: segment file missing" in s
        and "1 left out: segment file unreadable" in s
        for s in lines
    )
    frames, actions, owner = model_inputs(data, [0, 1], "book")
    assert frames.shape == (20, 48, 48, 3) and actions.shape == (20,) and owner.tolist() == [0] * 10 + [1] * 10


def test_no_labels(square_db):
    db, _ = square_db
    with pytest.raises(UserError, match="has no labels"):
        load_preferences([db], log=_quiet)
    (db / "labels.jsonl").write_text("")
    with pytest.raises(UserError, match="no labels in"):
        load_preferences([db], log=_quiet)
    with pytest.raises(UserError, match="DB not found"):
        load_preferences([db / "nope"], log=_quiet)


def test_only_ties_or_cant_tell(square_db):
    db, rels = square_db
    _label(db, [(rels[0], rels[1], CANT_TELL), (rels[2], rels[3], CANT_TELL)])
    with pytest.raises(UserError, match='no usable labels.*2 are "can\'t tell"'):
        load_preferences([db], log=_quiet)
    _label(db, [(rels[4], rels[5], EQUAL), (rels[6], rels[7], EQUAL)])
    with pytest.raises(UserError, match="all 2 usable labels .* are ties"):
        load_preferences([db], log=_quiet)


def test_all_segments_missing(square_db):
    db, rels = square_db
    _label(db, [(rels[0], rels[1], FIRST_BETTER), (rels[2], rels[3], SECOND_BETTER)])
    for r in rels[:4]:
        (db / r).unlink()
    with pytest.raises(UserError, match=r"2 have missing segment files \(4 files\)"):
        load_preferences([db], log=_quiet)


def test_mixed_games_and_env_mismatch(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ra = make_square_db(a, n_segments=4, steps=5)
    rb = make_square_db(b, n_segments=4, steps=5, env_id="BreakoutNoFrameskip-v4")
    _label(a, [(ra[0], ra[1], FIRST_BETTER), (ra[2], ra[3], SECOND_BETTER)])
    _label(b, [(rb[0], rb[1], FIRST_BETTER)])
    with pytest.raises(UserError, match="training on DBs of different games"):
        load_preferences([a, b], log=_quiet)
    with pytest.raises(UserError, match="does not match"):
        load_preferences([a], env="BreakoutNoFrameskip-v4", log=_quiet)


def test_legacy_db_trains_with_oracle_metrics_na(tmp_path):
    """The book's DB: labels.json and uncompressed pickles of EpisodeStep, no true rewards."""
    db = tmp_path / "legacy"
    rng = np.random.default_rng(0)
    rels, returns = [], []
    for i in range(12):
        frames, rewards = square_frames(rng, 6, p=float(rng.uniform(0, 0.9)))
        rel = f"{i % 2:02d}/{100 + i:08d}.dat"
        write_legacy_segment(db / rel, frames, rng.integers(0, 18, 6))
        rels.append(rel)
        returns.append(rewards.sum())
    lines = []
    for _ in range(30):
        i, j = rng.choice(12, 2, replace=False)
        lab = 1 if returns[i] > returns[j] else 2 if returns[j] > returns[i] else 0
        lines.append(json.dumps({"sample1": rels[i], "sample2": rels[j], "label": lab}))
    (db / "labels.json").write_text("\n".join(lines) + "\n")
    log: list[str] = []
    data = load_preferences([db], log=log.append)
    assert not data.has_true_returns and data.env_id == "SeaquestNoFrameskip-v4" and data.n_actions == 18
    assert any("legacy" in s for s in log)
    assert all(b[:4] == b"\x28\xb5\x2f\xfd" for b in data.blobs)  # kept compressed in memory
    res = train_reward_model(
        data, TrainConfig(epochs=2, batch=8, patience=2), tmp_path / "r.pt", progress=False, log=log.append
    )
    assert np.isnan(res.best.oracle_agreement) and np.isnan(res.best.return_corr)
    assert any("n/a (segments carry no true rewards)" in s for s in log)
    assert load_reward_model(res.path).env_id == "SeaquestNoFrameskip-v4"


def test_split_is_seeded_and_keeps_both_sides():
    a = split_pairs(10, 0.2, np.random.default_rng(3))
    b = split_pairs(10, 0.2, np.random.default_rng(3))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert len(a[1]) == 2 and len(np.intersect1d(*a)) == 0
    tr, te = split_pairs(2, 0.2, np.random.default_rng(0))
    assert len(tr) == 1 and len(te) == 1
    with pytest.raises(UserError, match="--test-ratio"):
        split_pairs(10, 1.0, np.random.default_rng(0))


def test_micro_batches_bound_frames_and_accumulate_exactly(square_db):
    """Gradient accumulation over micro-batches equals the gradient of the whole batch."""
    db, _ = square_db
    oracle_label_db(db, 30, seed=2)
    data = load_preferences([db], log=_quiet)
    pairs = np.arange(12)
    mbs = micro_batches(data, pairs, micro_frames=40)
    assert np.concatenate(mbs).tolist() == pairs.tolist()
    for mb in mbs:
        segs = np.unique(np.concatenate([data.first[mb], data.second[mb]]))
        assert len(mb) == 1 or data.lengths[segs].sum() <= 40
    torch.manual_seed(0)
    model = RewardModel(18, data.frame_shape).eval()  # eval: no dropout / batch statistics
    dev = torch.device("cpu")

    def grad_of(chunks: list[np.ndarray]) -> torch.Tensor:
        model.zero_grad()
        for mb in chunks:
            r1, r2 = _pair_returns(model, data, mb, dev)
            loss, _ = preference_loss(r1, r2, torch.from_numpy(data.mu[mb]))
            (loss * len(mb) / len(pairs)).backward()
        return model.conv[0].weight.grad.clone()

    torch.testing.assert_close(grad_of(mbs), grad_of([pairs]), rtol=1e-4, atol=1e-6)


def test_bad_hyper_parameters(square_db, tmp_path):
    db, _ = square_db
    oracle_label_db(db, 10, seed=0)
    data = load_preferences([db], log=_quiet)
    with pytest.raises(UserError, match="--batch must be at least 1"):
        train_reward_model(data, TrainConfig(batch=0), tmp_path / "r.pt", progress=False, log=_quiet)
    with pytest.raises(UserError, match="--lr must be positive"):
        train_reward_model(data, TrainConfig(lr=0), tmp_path / "r.pt", progress=False, log=_quiet)
    with pytest.raises(UserError, match="--diff-block: the diff block must be two divisors of 84"):
        train_reward_model(data, TrainConfig(diff_block=(5, 12)), tmp_path / "r.pt", progress=False, log=_quiet)
    with pytest.raises(UserError, match="--diff-block applies to --arch diff only"):
        cfg = TrainConfig(arch="book", diff_block=(6, 6))
        train_reward_model(data, cfg, tmp_path / "r.pt", progress=False, log=_quiet)


def test_diff_flow_trains_a_net_on_the_scene_flow_too(square_db, tmp_path):
    """TrainConfig.diff_flow reaches the net it trains and its checkpoint: two features more,
    "diff_flow" recorded, the model and its lean twin load back with the flow; --arch book refuses it."""
    from lib.models.reward import FLOW_FEATURES, load_reward_models

    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet)
    for flow in (False, True):
        out = tmp_path / f"r-{flow}.pt"
        train_reward_model(data, TrainConfig(epochs=1, diff_flow=flow), out, progress=False, log=_quiet)
        ck = torch.load(out, weights_only=True)
        assert ck["diff_flow"] is flow
        assert ck["state_dicts"][0]["scale"].numel() == 2 * 21 * 7 + (FLOW_FEATURES if flow else 0)
        assert load_reward_models(out)[0][0].flow is flow
        assert load_reward_model(out).nets[0].flow is flow  # the lean twin that predicts
    with pytest.raises(UserError, match="--diff-flow applies to --arch diff only"):
        train_reward_model(data, TrainConfig(epochs=1, arch="book", diff_flow=True), tmp_path / "b.pt", log=_quiet)
    out = tmp_path / "r-scene.pt"
    train_reward_model(
        data, TrainConfig(epochs=1, diff_flow=True, diff_flow_scene=True), out, progress=False, log=_quiet
    )
    assert torch.load(out, weights_only=True)["state_dicts"][0]["scale"].numel() == (2 + FLOW_FEATURES) * 21 * 7 + 2
    assert load_reward_model(out).nets[0].flow_scene is True  # the lean twin that predicts
    with pytest.raises(UserError, match="--diff-flow-scene needs --diff-flow"):
        train_reward_model(data, TrainConfig(epochs=1, diff_flow_scene=True), tmp_path / "c.pt", log=_quiet)


def test_ensemble_trains_and_predicts_the_mean(square_db, tmp_path):
    db, _ = square_db
    oracle_label_db(db, 40, seed=0)
    data = load_preferences([db], log=_quiet)
    res = train_reward_model(
        data,
        TrainConfig(epochs=1, batch=8, ensemble=2, noise=True, arch="book"),
        tmp_path / "r.pt",
        progress=False,
        log=_quiet,
    )
    assert res.best.disagreement > 0
    rm = load_reward_model(res.path)
    assert rm.ensemble == 2
    frames, _ = square_frames(np.random.default_rng(3), 12)
    actions = np.arange(12) % 18
    members = rm.predict_members(frames, actions).cpu().numpy()
    assert members.shape == (2, 12) and not np.allclose(members[0], members[1])  # two different models
    np.testing.assert_allclose(rm.predict(frames, actions), members.mean(0), rtol=1e-5)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "03_reward_train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_cli_trains_and_writes_model_and_tensorboard(square_db, tmp_path):
    db, _ = square_db
    oracle_label_db(db, 60, seed=3)
    r = _cli(
        "-n",
        "t",
        "-o",
        str(tmp_path / "saves"),
        str(db),
        "--epochs",
        "2",
        "--batch",
        "16",
        "--lr",
        "1e-3",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "saves" / "reward-t.pt").is_file()
    assert "oracle agreement" in r.stdout and "best model:" in r.stdout
    events = list((tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])  # the tag scheme of every stage (lib/core/tb.py)
    want = {"losses/train", "losses/test", "eval/test_accuracy", "eval/oracle_agreement", "charts/s_per_pair"}
    assert want <= tags, tags
    assert "hyperparameters" in " ".join(acc.Tags()["tensors"])
    assert load_reward_model(tmp_path / "saves" / "reward-t.pt", game="seaquest").metrics["epoch"] in (
        0.0,
        1.0,
    )


@pytest.mark.slow
def test_cli_bad_inputs_exit_2_with_one_line(square_db, tmp_path):
    db, rels = square_db
    r = _cli("-n", "t", "-o", str(tmp_path / "o"), str(db), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    assert "no labels" in r.stderr
    _label(db, [(rels[0], rels[1], EQUAL), (rels[2], rels[3], EQUAL)])
    r = _cli("-n", "t", "-o", str(tmp_path / "o"), str(db), cwd=tmp_path)
    assert r.returncode == 2 and "ties" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli("-n", "t", "-o", str(tmp_path / "o"), str(db), "--diff-block", "4by12", cwd=tmp_path)
    assert r.returncode == 2 and "expected ROWSxCOLS such as 4x12" in r.stderr
    if not torch.cuda.is_available():
        r = _cli("-n", "t", "-o", str(tmp_path / "o"), str(db), "--dev", "cuda", cwd=tmp_path)
        assert r.returncode == 2 and "no CUDA GPU" in r.stderr


def test_previous_model_survives_until_training_ends_and_is_kept_as_prev(square_db, tmp_path):
    """An interrupted or crashed run must not destroy the model that was there before."""
    db, _ = square_db
    oracle_label_db(db, 40, seed=1)
    data = load_preferences([db], log=_quiet)
    out = tmp_path / "out" / "reward-x.pt"
    out.parent.mkdir()
    out.write_bytes(b"the previous model")
    seen = []

    def log(line: str) -> None:
        if line.startswith("epoch 1:"):  # mid-run: the old file is untouched, the new best is aside
            seen.append((out.read_bytes(), (tmp_path / "out" / "reward-x.partial.pt").is_file()))
            raise KeyboardInterrupt  # Ctrl-C: training ends with the best model so far

    res = train_reward_model(data, TrainConfig(epochs=5, patience=5), out, progress=False, log=log)
    assert seen == [(b"the previous model", True)]
    assert not res.finished and "by hand" in res.stopped and load_reward_model(out).metrics
    assert (tmp_path / "out" / "reward-x.prev.pt").read_bytes() == b"the previous model"
    assert sorted(p.name for p in out.parent.iterdir()) == ["reward-x.prev.pt", "reward-x.pt"]


@pytest.mark.slow
def test_ctrl_c_installs_a_model_that_says_it_was_stopped_by_hand(square_db, tmp_path):
    """A real SIGINT to a real 03_reward_train.py once its first epoch is logged: the best model so
    far is installed (what a user expects from Ctrl-C), but the run exits 130, says the training
    was stopped by hand, and the checkpoint records it: a stage that reuses models must retrain."""
    import signal

    db, _ = square_db
    oracle_label_db(db, 60, seed=3)
    out = tmp_path / "saves" / "reward-t.pt"
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", "t", "-o", str(out.parent), str(db)]
    cmd += ["--epochs", "100000", "--patience", "100000", "--batch", "16", "--no-progress"]
    cmd += ["--runs-dir", str(tmp_path / "runs")]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # no timing: the signal goes once the first epoch is logged
        seen.append(line)
        if line.startswith("epoch 1:"):  # epoch 0 is a best kept by then
            proc.send_signal(signal.SIGINT)
            break
    rest, err = proc.communicate(timeout=300)
    stdout = "".join(seen) + rest
    assert proc.returncode == 130, (proc.returncode, stdout, err)
    assert "stopped early by hand" in stdout and "Traceback" not in err
    ck = torch.load(out, weights_only=True)
    assert ck["finished"] is False and "by hand" in ck["stopped"]
    from lib.models.reward import reward_training_finished

    assert not reward_training_finished(out)
    assert load_reward_model(out).metrics  # still a usable model, for whoever wants it


def test_only_a_finished_training_passes_for_one(square_db, tmp_path):
    db, _ = square_db
    oracle_label_db(db, 40, seed=1)
    data = load_preferences([db], log=_quiet)
    from lib.models.reward import reward_training_finished

    out = tmp_path / "reward-x.pt"
    assert not reward_training_finished(out)  # missing
    res = train_reward_model(data, TrainConfig(epochs=1, patience=5), out, progress=False, log=_quiet)
    assert res.finished and reward_training_finished(out)
    assert torch.load(out, weights_only=True)["stopped"] == "max epochs"
    out.write_bytes(b"not a checkpoint")
    assert not reward_training_finished(out)


def test_output_dir_that_is_a_file_is_one_line(square_db, tmp_path):
    db, _ = square_db
    oracle_label_db(db, 10, seed=1)
    (tmp_path / "afile").write_text("not a directory")
    data = load_preferences([db], log=_quiet)
    with pytest.raises(UserError, match="output directory .*afile is a file: give a directory with -o"):
        train_reward_model(data, TrainConfig(epochs=1), tmp_path / "afile" / "reward-x.pt", log=_quiet)
    assert (tmp_path / "afile").read_text() == "not a directory"


def test_oracle_agreement_counts_a_predicted_tie_as_wrong_and_leaves_out_true_ties():
    from lib.reward.eval import oracle_agreement

    pred1 = np.array([2.0, 1.0, 3.0, 2.0, 5.0, 0.0, 1.0])
    pred2 = np.array([1.0, 2.0, 3.0, 2.0, 4.0, 9.0, 0.0])
    true1 = np.array([10.0, 0.0, 20.0, 0.0, 7.0, 3.0, np.nan])
    true2 = np.array([0.0, 10.0, 0.0, 5.0, 7.0, 1.0, 1.0])
    # pairs 0 and 1 right; 2 and 3 predicted ties (wrong whichever segment is truly better);
    # 4 a true tie and 6 an unknown true return (left out); 5 wrong. Counting a predicted tie as
    # "second better", "first better" or half right gives 3/5; leaving it out gives 2/3.
    assert oracle_agreement(pred1, pred2, true1, true2) == (pytest.approx(2 / 5), 5)
    assert oracle_agreement(pred1[4:5], pred2[4:5], true1[4:5], true2[4:5])[1] == 0
    share, n = oracle_agreement(pred1[6:], pred2[6:], true1[6:], true2[6:])
    assert np.isnan(share) and n == 0


def test_the_flags_defaults_are_the_configs():
    """03_reward_train.py's flags take their defaults from TrainConfig: parsed with no flag they
    give TrainConfig(); every flag named like a field reaches that field."""
    from lib.reward.cli import build_parser, config_from_args

    args = build_parser().parse_args(["db"])
    assert config_from_args(args, "cpu") == TrainConfig()
    flags = ["--epochs", "7", "--batch", "3", "--lr", "0.01", "--seed", "5", "--test-ratio", "0.5"]
    flags += ["--patience", "2", "--noise", "--ensemble", "4", "--micro-frames", "60", "--arch", "book"]
    flags += ["--mask-rows", "9", "--diff-block", "6x12", "--diff-flow", "--diff-flow-scene", "--input", "full"]
    flags += ["--dev", "cuda"]
    got = config_from_args(build_parser().parse_args([*flags, "db"]), "cuda:0")
    want = TrainConfig(
        epochs=7, batch=3, lr=0.01, seed=5, test_ratio=0.5, patience=2, noise=True, ensemble=4, micro_frames=60,
        device="cuda:0", arch="book", mask_rows=9, diff_block=(6, 12), diff_flow=True,
        diff_flow_scene=True,
    )  # fmt: skip
    assert got == want


def test_help_imports_no_torch():
    """--help is read far more often than a model is trained: it must not wait for torch."""
    code = (
        "import runpy, sys; sys.argv = ['03_reward_train.py', '--help']\n"
        "try:\n    runpy.run_path('03_reward_train.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO TORCH')"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "baselines:" in r.stdout and "--mask-rows" in r.stdout
    assert r.stdout.strip().endswith("NO TORCH")


RETIRED = ["--encoder p.pt", "--pseudo-labels 0.9", "--pseudo-weight 1", "--crop 5", "--weight-decay 1", "--augment 4"]


@pytest.mark.parametrize("flags", RETIRED)
def test_retired_levers_are_unknown_flags(flags, capsys):
    """The levers that lost the few-labels ablation are gone, flags and all."""
    from lib.reward.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["-n", "x", "-o", "y", *flags.split(), "db"])
    assert e.value.code == 2 and f"unrecognized arguments: {flags.split()[0]}" in capsys.readouterr().err


RETIRED_NOW = [  # (what a user gives, the words the line starts with, what the last commit that had it declares)
    pytest.param(["--diff-signed"], "--diff-signed", "diff_signed: bool = setting(", id="diff-signed"),
    pytest.param(["--input", "half"], "--input half", 'INPUTS = {"full": 1, "half": 2}', id="input-half"),
]


@pytest.mark.parametrize("given, words, declared", RETIRED_NOW)
def test_a_retired_flag_is_one_line_exit_2_naming_its_last_commit(square_db, tmp_path, given, words, declared):
    """A lever the measurements closed (docs/reference.md, "Retired flags") is refused by
    03_reward_train.py itself in one line, exit 2, before a model or a log is written: it names the
    last commit that had the flag (a real commit of this repository, whose stage 3 still declares it)
    and where its figures are (test_stage_flags: --help no longer lists it)."""
    import re

    db, _ = square_db
    oracle_label_db(db, 10, seed=0)
    out, runs = tmp_path / "o", tmp_path / "runs"
    argv = ["-n", "t", "-o", str(out), "--epochs", "1", "--runs-dir", str(runs), *given, str(db)]
    r = subprocess.run(
        [sys.executable, str(ROOT / "03_reward_train.py"), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.stdout, r.stderr)
    assert lines[0].startswith(f"error: {words} was retired after commit ") and "docs/results.md" in lines[0], lines
    assert not out.exists() and not runs.exists()
    commit = re.search(r"after commit ([0-9a-f]{7,40}):", lines[0]).group(1)
    shown = subprocess.run(
        ["git", "show", f"{commit}:lib/reward_config.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if shown.returncode != 0 and not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the commit cannot be looked up")
    assert shown.returncode == 0 and declared in shown.stdout, shown.stderr


def test_a_wrong_input_is_not_offered_the_retired_one(capsys):
    """argparse's "invalid choice" line lists the --input kept, not the retired ``half``; a RewardArgs
    made in code with it is refused with the line that says why."""
    from lib.reward.cli import build_parser
    from lib.reward.config import RewardArgs

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--input", "hal", "db"])
    assert e.value.code == 2 and "invalid choice: 'hal' (choose from 'full')" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"^--input half was retired after commit [0-9a-f]+: .*give full$"):
        RewardArgs(dbs=["db"], input="half").check()


def test_cached_features_give_each_models_own_returns(square_db):
    """Training reads a diff net's features from a per-segment cache; a model with another mask
    gets its own features, and returns equal the model's own forward pass."""
    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet)
    a, b = data.first[:5], data.second[:5]
    segs, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    x, acts, owner = model_inputs(data, segs, "diff")
    seen = []
    for cfg in (TrainConfig(arch="diff", seed=0), TrainConfig(arch="diff", seed=0, mask_rows=40)):
        model = _build_fit(data, cfg).models[0].eval()
        with torch.no_grad():
            r1, r2 = _pair_returns(model, data, np.arange(5), torch.device("cpu"))
            per_step = model(torch.from_numpy(x), torch.from_numpy(acts)).numpy()
        want = np.bincount(owner, weights=per_step, minlength=len(segs))
        np.testing.assert_allclose(r1.numpy(), want[inv[:5]], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(r2.numpy(), want[inv[5:]], rtol=1e-4, atol=1e-4)
        seen.append(model.feature_key())
    assert len(set(seen)) == 2
    assert len(data.feature_cache) == 2 * len(segs)


def test_patience_defaults_to_the_archs(square_db, tmp_path):
    """No --patience: 20 for the diff net (its epochs are cheap), the book's 4 for the book's net;
    a given one wins; the checkpoint's config says which was used."""
    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet)
    assert _build_fit(data, TrainConfig(arch="diff")).cfg.patience == 20
    assert _build_fit(data, TrainConfig(arch="book")).cfg.patience == 4
    assert _build_fit(data, TrainConfig(arch="diff", patience=3)).cfg.patience == 3
    with pytest.raises(UserError, match="--patience must be at least 1"):
        _build_fit(data, TrainConfig(arch="diff", patience=0))
    res = train_reward_model(data, TrainConfig(arch="diff", epochs=2), tmp_path / "r.pt", progress=False, log=_quiet)
    assert torch.load(res.path, weights_only=True)["config"]["patience"] == 20


def test_a_non_finite_loss_stops_training_and_installs_nothing(square_db, tmp_path, monkeypatch):
    """Issue 24 (High): training that turns NaN ends with one line and never installs its model;
    a model already there stays as it was."""
    import lib.reward.train as rt

    db, _ = square_db
    oracle_label_db(db, 40, seed=0)
    data = load_preferences([db], log=_quiet)
    out = tmp_path / "out" / "r.pt"
    cfg = TrainConfig(epochs=1, batch=8, arch="diff", patience=1)
    train_reward_model(data, cfg, out, progress=False, log=_quiet)
    before = out.read_bytes()
    calls = {"n": 0}
    real = rt.preference_loss

    def nan_later(*a, **k):
        loss, m = real(*a, **k)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] > 3 else loss), m

    monkeypatch.setattr(rt, "preference_loss", nan_later)
    with pytest.raises(UserError, match="training diverged in epoch 0: the training loss is nan") as e:
        train_reward_model(data, TrainConfig(epochs=3, batch=8, arch="diff"), out, progress=False, log=_quiet)
    assert "\n" not in str(e.value) and "is unchanged" in str(e.value)
    assert out.read_bytes() == before
    assert not out.with_name("r.prev.pt").exists()


def test_weights_that_turn_non_finite_are_never_saved(square_db, tmp_path, monkeypatch):
    """The loss was finite, the step made the weights inf: caught before the epoch's checkpoint."""
    import lib.reward.train as rt

    db, _ = square_db
    oracle_label_db(db, 40, seed=0)
    data = load_preferences([db], log=_quiet)
    real = rt.train_epoch

    def blow_up(fit, epoch, progress):
        res = real(fit, epoch, progress)
        with torch.no_grad():
            next(fit.models[0].out.parameters()).fill_(float("inf"))
        return res

    monkeypatch.setattr(rt, "train_epoch", blow_up)
    out = tmp_path / "r.pt"
    with pytest.raises(UserError, match="the weights are not finite.*no model installed"):
        train_reward_model(data, TrainConfig(epochs=2, batch=8, arch="diff"), out, progress=False, log=_quiet)
    assert not out.exists() and not out.with_name("r.partial.pt").exists()


def _cli_in_process(monkeypatch, capsys, *args: str) -> str:
    import runpy

    monkeypatch.setattr(sys, "argv", [str(ROOT / "03_reward_train.py"), *args])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "03_reward_train.py"), run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr", "1e30"], "--lr must be positive and at most 1"),
        (["--lr", "nan"], "--lr"),
        (["--lr", "inf"], "--lr"),
        (["--arch", "book", "--mask-rows", "10"], "--mask-rows applies to --arch diff only"),
        (["--test-ratio", "nan"], "--test-ratio"),
        (["--test-ratio", "1.5"], "--test-ratio"),
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**70)], "--seed"),
        (["--ensemble", "2000"], "--ensemble must be at most 64"),
        (["--runs-dir", "/proc/x"], "cannot write TensorBoard logs"),
        (["-o", "/proc/x"], "/proc/x"),
        (["-n", "../escape"], "-n must be a plain name"),
    ],
)
def test_cli_bad_values_are_one_line_exit_2(square_db, tmp_path, monkeypatch, capsys, flags, message):
    db, _ = square_db
    oracle_label_db(db, 10, seed=0)
    base = ["-n", "t", "-o", str(tmp_path / "o"), "--epochs", "1", "--runs-dir", str(tmp_path / "runs"), str(db)]
    assert message in _cli_in_process(monkeypatch, capsys, *base, *flags)
    assert not (tmp_path / "o" / "reward-t.pt").exists()


def test_stale_temp_files_of_a_killed_install_are_removed(square_db, tmp_path):
    import os

    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet)
    out = tmp_path / "o" / "reward-x.pt"
    out.parent.mkdir()
    stale = [out.parent / ".reward-x.pt.k1ll3d.tmp", out.parent / ".reward-x.partial.pt.abc.tmp"]
    keep = out.parent / ".reward-y.pt.abc.tmp"  # another model's: not ours to remove
    for p in [*stale, keep]:
        p.write_bytes(b"x" * 10)
        os.utime(p, (1, 1))
    train_reward_model(data, TrainConfig(epochs=1, batch=8, arch="diff"), out, progress=False, log=_quiet)
    assert not any(p.exists() for p in stale) and keep.exists() and out.is_file()


def test_disk_full_at_install_is_one_line_naming_what_was_kept(square_db, tmp_path, monkeypatch):
    import errno

    import lib.store.checkpoints

    db, _ = square_db
    oracle_label_db(db, 20, seed=0)
    data = load_preferences([db], log=_quiet)
    out = tmp_path / "reward-x.pt"
    real = lib.store.checkpoints.temp_beside  # where a checkpoint's bytes are written before the rename

    def full(path, *args, **kw):
        if str(path) == str(out):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args, **kw)

    monkeypatch.setattr(lib.store.checkpoints, "temp_beside", full)
    with pytest.raises(UserError, match="No space left on device") as e:
        train_reward_model(data, TrainConfig(epochs=1, batch=8, arch="diff"), out, progress=False, log=_quiet)
    assert "\n" not in str(e.value) and "kept in" in str(e.value) and str(out) in str(e.value)
    assert not out.exists() and out.with_name("reward-x.partial.pt").is_file()
