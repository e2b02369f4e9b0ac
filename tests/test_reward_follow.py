"""``03_reward_train.py --follow`` (issue 31, live rounds): a real trainer process over real segment
files, labels appended as the label page appends them, versions read back from the files it writes."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from test_reward_train import _cli_in_process, _label, one_thread  # noqa: F401 (one_thread: an autouse fixture)

from bench.dbs import make_atari_db, make_square_db
from lib.models.reward import load_reward_model
from lib.reward.config import FollowConfig, TrainConfig
from lib.reward.follow import Follower, LabelWatch, answers, count_new, versions_log
from lib.reward.train import held_out, split_by_pair, train_reward_model
from lib.store.labels import CANT_TELL, FIRST_BETTER, RETRACTED, SECOND_BETTER, pair_key
from lib.store.segments import load_segment

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
WAIT_S = 120.0  # a line the trainer owes; seconds on an idle machine, more on a loaded one
SEED, RATIO = 42, 0.2  # the trainer's defaults: --seed, --test-ratio


class Trainer:
    """``03_reward_train.py --follow`` as a process, its output (stdout and stderr) read line by line."""

    def __init__(self, out: Path, dbs: list[Path], *flags: str, cwd: Path):
        cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", "t", "-o", str(out), "--follow"]
        cmd += ["--poll", "0.1", "--no-progress", "--runs-dir", str(cwd / "runs"), *flags, *map(str, dbs)]
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self._ended = False  # the output's end was read
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, pattern: str, unless: str | None = None, timeout: float = WAIT_S) -> str:
        """The next line matching ``pattern`` (lines before it are kept in ``lines``); a line
        matching ``unless`` before it fails the test."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(end - time.monotonic(), 0.01))
            except queue.Empty:
                self.stop(signal.SIGKILL)
                seen = "\n".join(self.lines)
                raise AssertionError(f"no line matching {pattern!r} in {timeout:.0f} s:\n{seen}") from None
            if line is None:
                self._ended = True
                raise AssertionError(f"exit {self.proc.wait()} before {pattern!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if re.search(pattern, line):
                return line
            if unless is not None and re.search(unless, line):
                raise AssertionError(f"{line!r} came before {pattern!r}:\n" + "\n".join(self.lines))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=WAIT_S)
        while not self._ended:
            line = self._q.get(timeout=WAIT_S)
            self._ended = line is None
            if line is not None:
                self.lines.append(line)
        return rc


def pairs_of(rels: list[str], held: bool, n: int, taken: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The first ``n`` unlabelled pairs on the held-out side (``held``) or the training side."""
    out = []
    for a, b in combinations(rels, 2):
        if len(out) == n:
            break
        if pair_key(a, b) not in taken and held_out(a, b, SEED, RATIO) == held:
            out.append((a, b))
            taken.add(pair_key(a, b))
    assert len(out) == n, "the DB is too small for the pairs the test needs"
    return out


def by_score(db: Path, pairs: list[tuple[str, str]]) -> list[tuple[str, str, int]]:
    """The square rule's answers (the higher true return wins) for pairs whose returns differ."""
    ret = {r: load_segment(db / r).true_return for p in pairs for r in p}
    return [(a, b, FIRST_BETTER if ret[a] > ret[b] else SECOND_BETTER) for a, b in pairs if ret[a] != ret[b]]


def metrics(path: Path) -> dict:
    return load_reward_model(path).metrics


# --- the split and the label count -------------------------------------------------------------


def test_held_out_split_is_stable_as_labels_grow() -> None:
    rng = np.random.default_rng(0)
    segs = [f"{e:02d}/{s:08d}.dat" for e in range(4) for s in rng.choice(10**6, 60, replace=False)]
    pairs = [tuple(rng.choice(segs, 2, replace=False)) for _ in range(2000)]
    labels = [(0, str(a), str(b)) for a, b in pairs]
    _, test100 = split_by_pair(labels[:100], SEED, RATIO)
    held = {pair_key(*labels[i][1:]) for i in test100}
    # 1,900 labels more, in another order, some pairs the other way round: the first 100's side stays
    grown = labels[::-1]
    grown = [(d, b, a) if i % 3 == 0 else (d, a, b) for i, (d, a, b) in enumerate(grown)]
    train, test = split_by_pair(grown, SEED, RATIO)
    later = {pair_key(*grown[i][1:]) for i in test}
    first100 = {pair_key(a, b) for _, a, b in labels[:100]}
    assert held == later & first100 and held
    assert not {pair_key(*grown[i][1:]) for i in train} & held
    assert 0.17 < len(test) / len(grown) < 0.23  # about --test-ratio
    _, other = split_by_pair(grown, SEED + 1, RATIO)  # the seed picks another split
    assert set(other.tolist()) != set(test.tolist())


def test_new_labels_are_new_or_edited_answers_only(tmp_path: Path) -> None:
    """What --retrain-every counts, read from a real labels.jsonl: a new pair's answer and an edited
    answer count; "can't tell", a retraction, and the same answer with the pair the other way round
    do not."""
    db = tmp_path / "db"
    db.mkdir()
    watch = LabelWatch([str(db)], warn=lambda m: None)
    assert watch.read() == {}  # no labels.jsonl yet
    s = [f"00/{i:08d}.dat" for i in range(8)]
    _label(db, [(s[0], s[1], FIRST_BETTER), (s[2], s[3], SECOND_BETTER), (s[4], s[5], 0)])
    seen = answers(watch.read())
    assert len(seen) == 3
    _label(db, [(s[1], s[0], SECOND_BETTER)])  # the same answer, the pair the other way round
    _label(db, [(s[6], s[7], CANT_TELL), (s[4], s[5], RETRACTED)])
    assert count_new(answers(watch.read()), seen) == 0
    _label(db, [(s[0], s[2], FIRST_BETTER), (s[3], s[2], SECOND_BETTER)])  # new; an edit of (2, 3)
    assert count_new(answers(watch.read()), seen) == 2


def test_a_following_trainer_parses_only_the_lines_appended_since_its_last_look(tmp_path: Path) -> None:
    """``LabelWatch.read`` after a change reads only what was appended (was: the whole file at each
    change, 3-4 s at 100k lines): the bad line 2 is said once, not at each look (its ``warn`` here
    says every call), and agrees at each look with a fresh reader's. A file replaced by another
    is read whole again."""
    db = tmp_path / "db"
    db.mkdir()
    s = [f"00/{i:08d}.dat" for i in range(8)]
    _label(db, [(s[0], s[1], FIRST_BETTER)])
    with open(db / "labels.jsonl", "ab") as f:
        f.write(b"not a label\n")
    said: list[str] = []
    watch = LabelWatch([str(db)], warn=said.append)

    def fresh() -> dict:
        return LabelWatch([str(db)], warn=lambda m: None).read()

    assert len(watch.read()) == 1 and len(said) == 1 and "labels.jsonl:2:" in said[0]
    _label(db, [(s[0], s[1], SECOND_BETTER), (s[2], s[3], FIRST_BETTER)])  # an edit and a new pair
    assert watch.read() == fresh() and len(watch.read()) == 2 and len(said) == 1, said
    _label(db, [(s[2], s[3], CANT_TELL), (s[4], s[5], FIRST_BETTER)])
    assert watch.read() == fresh() and len(watch.read()) == 2 and len(said) == 1, said
    other = db / "other.jsonl"
    other.write_bytes((db / "labels.jsonl").read_bytes().replace(b"not a label\n", b""))
    other.replace(db / "labels.jsonl")  # the same labels, another file: read whole again
    _label(db, [(s[6], s[7], SECOND_BETTER)])
    assert watch.read() == fresh() and len(watch.read()) == 3 and len(said) == 1, said


# --- the process ---------------------------------------------------------------------------------


def test_retrain_triggers_at_k_new_labels_and_not_before(tmp_path: Path) -> None:
    """Real SeaQuest segments. No labels: it waits; enough for a split: v1. Then K-1 = 2 new
    labels (one of them an edit), with a "can't tell", a retraction and an unchanged answer
    beside them: still waiting. One more: v2. A bad line in labels.jsonl, read at every change and
    every version, is one warning."""
    db = tmp_path / "db"
    rels = make_atari_db(db, 12, t=10)
    (db / "labels.jsonl").write_bytes(b"not a label\n")
    out = tmp_path / "out"
    tr = Trainer(out, [db], "--retrain-every", "3", "--epochs", "2", cwd=tmp_path)
    try:
        tr.expect("^waiting: no labels yet")  # the bad line is not a label
        taken: set[tuple[str, str]] = set()
        first = pairs_of(rels, True, 1, taken) + pairs_of(rels, False, 4, taken)
        _label(db, [(a, b, FIRST_BETTER if i % 2 else SECOND_BETTER) for i, (a, b) in enumerate(first)])
        assert "installed" in tr.expect("^v1: trained on 4 labels")
        tr.expect("^waiting: 0/3 new labels")
        (a, b), (c, d), (e, f) = pairs_of(rels, False, 3, taken)
        # one write: a new answer, an edit (first[1] was "#1 better"), a "can't tell", a retraction
        # and first[3]'s answer again
        again = [(first[1][1], first[1][0], FIRST_BETTER), (c, d, CANT_TELL), (*first[2], RETRACTED)]
        _label(db, [(a, b, FIRST_BETTER), *again, (*first[3], FIRST_BETTER)])
        tr.expect("^waiting: 2/3 new labels", unless="^(v2|waiting: 3/3)")
        assert not (out / "reward-t-v2.pt").exists()
        _label(db, [(e, f, SECOND_BETTER)])
        tr.expect("^v2: trained on 5 labels", unless="^waiting: 3/3")  # 4 - 1 retracted + 2 new
        tr.expect("^waiting: 0/3 new labels")
        assert tr.stop(signal.SIGTERM) == 130
    finally:
        tr.stop(signal.SIGKILL)
    assert tr.lines[-1].startswith("stopped by SIGTERM: v") and "Traceback" not in "\n".join(tr.lines)
    assert len([x for x in tr.lines if x.startswith("warning:")]) == 1, tr.lines
    m2 = metrics(out / "reward-t-v2.pt")
    assert m2["version"] == 2 and m2["labels"] == 6 and m2["train_pairs"] == 5 and m2["split"] == "pair-hash"
    log = [json.loads(x) for x in versions_log(out, "t").read_text().splitlines()]
    assert [r["version"] for r in log] == [1, 2] and log[0]["installed"] is True
    assert metrics(out / "reward-t.pt")["version"] == (2 if log[1]["installed"] else 1)


def test_a_worse_version_is_kept_but_not_installed(tmp_path: Path) -> None:
    """v1 learns the square rule. Then every training label is flipped (edits: they count) and two
    new held-out pairs are labelled right: v2, trained on the flipped answers, is worse on the
    held-out labels. It is kept as reward-t-v2.pt, logged as rejected, and reward-t.pt stays v1;
    the new held-out pairs are v1's fresh evidence."""
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=30, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    first = by_score(db, pairs_of(rels, True, 14, taken) + pairs_of(rels, False, 50, taken))
    _label(db, first)
    out = tmp_path / "out"
    tr = Trainer(out, [db], "--retrain-every", "10", "--epochs", "6", "--lr", "3e-3", cwd=tmp_path)
    try:
        tr.expect("^v1: .*: installed$")
        tr.expect("^waiting: 0/10 new labels")
        flipped = [(a, b, 3 - lab) for a, b, lab in first if not held_out(a, b, SEED, RATIO)]
        fresh = by_score(db, pairs_of(rels, True, 6, taken))[:2]
        _label(db, flipped + fresh)
        line = tr.expect("^v2: ")
        assert tr.stop(signal.SIGINT) == 130
    finally:
        tr.stop(signal.SIGKILL)
    assert line.endswith("kept as reward-t-v2.pt, not installed") and "held-out loss" in line, line
    assert f"fresh: v1's acc 100.0% on {len(fresh)} held-out labels newer than it" in line, line
    m2 = metrics(out / "reward-t-v2.pt")
    assert m2["version"] == 2 and m2["installed"] is False and m2["candidate_loss"] > m2["installed_heldout_loss"]
    assert metrics(out / "reward-t.pt")["version"] == 1
    log = [json.loads(x) for x in versions_log(out, "t").read_text().splitlines()]
    assert [(r["version"], r["installed"]) for r in log] == [(1, True), (2, False)]
    assert log[1]["fresh_pairs"] == len(fresh) and log[1]["fresh_accuracy"] == 1.0 and ">" in log[1]["why"]
    assert tr.lines[-1].startswith("stopped by SIGINT: v1 is installed at ")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(next((tmp_path / "runs").iterdir())))
    acc.Reload()
    assert [e.value for e in acc.Scalars("follow/installed_version")] == [1, 1]
    assert [e.value for e in acc.Scalars("follow/version")] == [1, 2]
    assert {"follow/heldout_accuracy", "follow/installed_heldout_loss", "follow/fresh_accuracy"} <= set(
        acc.Tags()["scalars"]
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_mid_training_abandons_the_version(tmp_path: Path, sig: signal.Signals) -> None:
    """v1 is made (in this process, by the same code). A new trainer process adopts it, starts v2
    on new labels, and gets the signal once v2's first epochs are logged: exit 130, one line naming
    v1, no v2 file, no temp or partial file, and reward-t.pt whole and still v1."""
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=30, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    _label(db, by_score(db, pairs_of(rels, True, 4, taken) + pairs_of(rels, False, 12, taken)))
    out = tmp_path / "out"
    fast = TrainConfig(epochs=2, lr=1e-3)
    follower = Follower([str(db)], fast, FollowConfig(retrain_every=4), out, "t", log=lambda line: None)
    follower.adopt()
    assert follower.step() and metrics(out / "reward-t.pt")["version"] == 1
    slow = ("--retrain-every", "4", "--epochs", "100000", "--patience", "100000", "--lr", "1e-3")
    tr = Trainer(out, [db], *slow, cwd=tmp_path)
    try:
        tr.expect("^installed: v1 ")
        tr.expect("^waiting: 0/4 new labels")
        _label(db, by_score(db, pairs_of(rels, False, 8, taken))[:4])
        tr.expect("^v2 epoch 1:")
        assert tr.stop(sig) == 130
    finally:
        tr.stop(signal.SIGKILL)
    name = signal.Signals(sig).name
    assert tr.lines[-1] == (
        f"stopped by {name}: v1 is installed at {out / 'reward-t.pt'}; v2's training abandoned, nothing of it written"
    ), tr.lines[-3:]
    assert "Traceback" not in "\n".join(tr.lines)
    assert sorted(p.name for p in out.iterdir()) == ["reward-t-v1.pt", "reward-t-versions.jsonl", "reward-t.pt"]
    assert metrics(out / "reward-t.pt")["version"] == 1
    assert len(versions_log(out, "t").read_text().splitlines()) == 1


# --- mistakes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--follow", "--retrain-every", "0"], "--retrain-every must be an integer in 1.."),
        (["--follow", "--poll", "0"], "--poll must be a number of seconds above 0"),
        (["--follow", "--poll", "nan"], "--poll must be"),
        (["--retrain-every", "5"], "--retrain-every applies to --follow only"),
        (["--poll", "1"], "--poll applies to --follow only"),
        (["--follow", "--evaluate", "x.pt"], "--follow trains and --evaluate only scores a model"),
        (["--follow", "--epochs", "0"], "--epochs must be at least 1"),
        (["--follow", "DB-THAT-IS-NOT-THERE"], "DB not found: DB-THAT-IS-NOT-THERE"),
    ],
)
def test_follow_flags_are_one_line_exit_2(tmp_path, monkeypatch, capsys, flags, message):
    db = tmp_path / "db"
    db.mkdir()
    base = ["-n", "t", "-o", str(tmp_path / "o"), "--runs-dir", str(tmp_path / "runs")]
    assert message in _cli_in_process(monkeypatch, capsys, *base, *flags, str(db))
    assert not (tmp_path / "o" / "reward-t.pt").exists()


def test_an_installed_model_of_another_network_is_one_line(tmp_path):
    """A warm start copies the installed model's weights: --follow refuses one of another --arch
    (a real process; the model is dated before the labels and --retrain-every is 1, so without the
    check a version would start from it at once)."""
    from lib.reward.data import load_preferences

    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=20, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    _label(db, by_score(db, pairs_of(rels, True, 3, taken) + pairs_of(rels, False, 10, taken)))
    out = tmp_path / "o" / "reward-t.pt"
    data = load_preferences([db], log=lambda line: None)
    train_reward_model(data, TrainConfig(epochs=1, arch="book"), out, progress=False, log=lambda line: None)
    os.utime(out, (1, 1))  # older than every label: they are all new to it
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", "t", "-o", str(out.parent), "--follow"]
    cmd += ["--retrain-every", "1", "--runs-dir", str(tmp_path / "runs"), "--epochs", "1", str(db)]
    r = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=WAIT_S)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, (r.returncode, r.stdout, r.stderr)
    assert "was trained with --arch book, this run has --arch diff" in err[0]
    assert sorted(p.name for p in out.parent.iterdir()) == ["reward-t.pt"]


# --- audit 5 -------------------------------------------------------------------------------------


def test_a_huge_version_in_the_versions_log_is_skipped(tmp_path):
    """A versions-log line {"version": <400 digits>} (audit 5 item 1) is a bad line: skipped by every
    reader; the next version is the one after the highest sane line, and it is trained and installed."""
    from lib.reward.follow import next_version, read_versions

    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=20, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    _label(db, by_score(db, pairs_of(rels, True, 3, taken) + pairs_of(rels, False, 10, taken)))
    out = tmp_path / "out"
    out.mkdir()
    versions_log(out, "t").write_text('{"version": 3}\n{"version": ' + "9" * 400 + "}\n")
    assert [r["version"] for r in read_versions(versions_log(out, "t"))] == [3]
    assert next_version(out, "t") == 4
    follower = Follower([str(db)], TrainConfig(epochs=1), FollowConfig(retrain_every=1), out, "t", log=lambda x: None)
    follower.adopt()
    assert follower.step()
    assert metrics(out / "reward-t.pt")["version"] == 4 and (out / "reward-t-v4.pt").is_file()


def test_evaluate_a_model_with_a_huge_number_is_one_line(tmp_path, monkeypatch, capsys):
    """--evaluate MODEL whose metrics hold 10**400 (audit 5 item 1): one line, exit 2."""
    import torch

    from lib.models.reward import RewardModel, reward_checkpoint
    from lib.store.checkpoints import atomic_torch_save

    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=6, steps=10, seed=0)
    _label(db, [(rels[0], rels[1], FIRST_BETTER)])
    torch.manual_seed(0)
    ck = reward_checkpoint([RewardModel(18, (48, 48, 3)).eval()], "SeaquestNoFrameskip-v4", "seaquest", None, 0.0, 1.0)
    ck["metrics"] = {"heldout_accuracy": 10**400}
    atomic_torch_save(ck, tmp_path / "huge.pt")
    msg = _cli_in_process(monkeypatch, capsys, "--evaluate", str(tmp_path / "huge.pt"), str(db))
    assert "huge.pt: field 'metrics' must be" in msg


def test_a_second_follow_trainer_refuses_the_output_directory(tmp_path):
    """Two --follow trainers on one output directory would both make "v2" and one model would be
    lost (audit 5 item 3): the second refuses the directory in one line, exit 2; the first goes on."""
    db = tmp_path / "db"
    make_square_db(db, n_segments=6, steps=10, seed=0)
    out = tmp_path / "out"
    first = Trainer(out, [db], cwd=tmp_path)
    try:
        first.expect("^waiting: no labels yet")
        second = Trainer(out, [db], "--seed", "1", cwd=tmp_path)
        try:
            line = second.expect("^error: ", unless="^waiting")
            assert second.proc.wait(timeout=WAIT_S) == 2
        finally:
            second.stop(signal.SIGKILL)
        assert f"{out} is followed by another --follow trainer" in line, line
        assert len(second.lines) == 2 and second.lines[0].startswith("following "), second.lines
        assert first.proc.poll() is None
        assert first.stop(signal.SIGTERM) == 130
    finally:
        first.stop(signal.SIGKILL)


def test_a_versions_log_that_is_a_symlink_is_refused_before_anything_is_written(tmp_path):
    """reward-t-versions.jsonl -> another file (audit 5 item 5): refused at the start in one line,
    exit 2; no version trained or written, the link's target untouched."""
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=20, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    _label(db, by_score(db, pairs_of(rels, True, 3, taken) + pairs_of(rels, False, 10, taken)))
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    versions_log(out, "t").symlink_to(target)
    tr = Trainer(out, [db], "--epochs", "1", cwd=tmp_path)
    try:
        line = tr.expect("^error: ", unless="^(v1|installed)")
        assert tr.proc.wait(timeout=WAIT_S) == 2
    finally:
        tr.stop(signal.SIGKILL)
    assert "reward-t-versions.jsonl is a symlink" in line, line
    assert [p.name for p in out.iterdir()] == ["reward-t-versions.jsonl"] and target.read_text() == "keep\n"


@pytest.mark.parametrize("where", ["checkpoint", "versions log"])
def test_a_full_disk_while_writing_a_version_leaves_no_trace_of_it(tmp_path, where):
    """A file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full disk) while v2 is
    written (audit 5 item 4): below the checkpoint's size (torch.save raises RuntimeError), or with
    the versions log padded up to it (its line does not fit). One UserError line; v1 stays installed,
    no v2 file, no log line, no temp file. With room again the same labels make v2."""
    import resource

    from lib.core.errors import UserError

    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=20, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    _label(db, by_score(db, pairs_of(rels, True, 3, taken) + pairs_of(rels, False, 10, taken)))
    out = tmp_path / "out"
    follower = Follower([str(db)], TrainConfig(epochs=1), FollowConfig(retrain_every=2), out, "t", log=lambda x: None)
    follower.adopt()
    assert follower.step()  # v1, installed
    v1 = (out / "reward-t.pt").read_bytes()
    size = len(v1)
    log = versions_log(out, "t")
    if where == "checkpoint":
        limit = size // 2
    else:
        limit = size * 2
        with log.open("ab") as f:  # padding up to the limit: a valid line, so the log stays readable
            pad = limit - log.stat().st_size - len('{"version": 1, "pad": ""}\n') - 10
            f.write(b'{"version": 1, "pad": "' + b"x" * pad + b'"}\n')
    before = log.read_bytes()
    _label(db, by_score(db, pairs_of(rels, False, 4, taken)))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        with pytest.raises(UserError) as e:
            follower.step()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    msg = str(e.value)
    assert "\n" not in msg and ("reward-t" in msg), msg
    assert sorted(p.name for p in out.iterdir()) == ["reward-t-v1.pt", "reward-t-versions.jsonl", "reward-t.pt"]
    assert (out / "reward-t.pt").read_bytes() == v1 and log.read_bytes() == before
    assert follower.installed is not None and follower.installed.version == 1
    assert follower.step()  # room again: v2 is made from the same labels
    assert (out / "reward-t-v2.pt").is_file() and log.read_bytes().startswith(before)
    assert [json.loads(x)["version"] for x in log.read_text().splitlines()][-1] == 2


def test_labels_of_segments_that_do_not_exist_or_cannot_be_read_make_no_version(tmp_path):
    """Label lines naming segments that are not in the DB, or one that is broken (audit 5 item 8):
    they do not count toward --retrain-every, and a version with no new usable label is not made
    (the agent would switch models and restart its normalisation for nothing)."""
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=20, steps=10, seed=0)
    taken: set[tuple[str, str]] = set()
    _label(db, by_score(db, pairs_of(rels, True, 3, taken) + pairs_of(rels, False, 10, taken)))
    out = tmp_path / "out"
    lines: list[str] = []
    follower = Follower([str(db)], TrainConfig(epochs=1), FollowConfig(retrain_every=2), out, "t", log=lines.append)
    follower.adopt()
    assert follower.step()  # v1
    ghosts = [(f"03/{90_000_000 + i:08d}.dat", rels[i], FIRST_BETTER) for i in range(3)]
    _label(db, ghosts)  # three label lines, no such segments
    assert not follower.step() and lines[-1] == "waiting: 0/2 new labels", lines[-3:]
    (db / "02" / "00009999.dat").write_bytes(b"x")  # a broken segment named like one
    _label(db, [("02/00009999.dat", rels[i], SECOND_BETTER) for i in range(3)])
    assert not follower.step() and "waiting" in lines[-1], lines[-3:]
    assert not follower.step()  # the same labels: nothing tried again
    assert sorted(p.name for p in out.iterdir()) == ["reward-t-v1.pt", "reward-t-versions.jsonl", "reward-t.pt"]
    _label(db, by_score(db, pairs_of(rels, False, 4, taken))[:2])  # two real new labels: v2
    assert follower.step() and (out / "reward-t-v2.pt").is_file()


def test_a_warm_start_from_a_model_with_another_diff_flow_or_a_retired_input_is_one_line(tmp_path):
    """--follow copies the installed model's weights into each version: an installed diff net
    trained with --diff-flow (296 features) cannot start one without it (294), and back; a book net
    on half-size frames (the retired --input half) cannot start one at all."""
    from lib.core.errors import UserError
    from lib.models.reward import DiffRewardModel, RewardModel
    from lib.reward.follow import check_warm_start

    path = tmp_path / "reward-t.pt"
    book = TrainConfig(arch="book")
    check_warm_start([RewardModel(18)], book, path)  # full frames, as this run: fine
    with pytest.raises(UserError, match=r"trained on frames shrunk 2x \(--input half, retired\): give another -n$"):
        check_warm_start([RewardModel(18, downscale=2)], book, path)
    check_warm_start([DiffRewardModel(18, flow=True)], TrainConfig(diff_flow=True), path)  # the same: fine
    for have, want in ((True, False), (False, True)):
        with pytest.raises(UserError, match=f"trained with --diff-flow {have}, this run has --diff-flow {want}"):
            check_warm_start([DiffRewardModel(18, flow=have)], TrainConfig(diff_flow=want), path)
    with pytest.raises(UserError, match="trained with --diff-flow-scene False, this run has --diff-flow-scene True"):
        check_warm_start([DiffRewardModel(18, flow=True)], TrainConfig(diff_flow=True, diff_flow_scene=True), path)
