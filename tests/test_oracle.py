"""Oracle labels from true rewards (lib/label_ui/oracle.py) and ``02_label_ui.py --oracle N``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.dbs import make_synthetic_db, write_legacy_segment
from lib.core.errors import UserError
from lib.label_ui.oracle import oracle_label_db
from lib.store.labels import (
    EQUAL,
    FIRST_BETTER,
    SECOND_BETTER,
    Label,
    append_labels,
    load_labels,
    pair_key,
    read_label_log,
    sample_unlabeled_pairs,
)
from lib.store.segments import load_segment

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "02_label_ui.py"


def run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(MAIN), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    make_synthetic_db(tmp_path / "db", 12, seed=3)
    return tmp_path / "db"


def test_oracle_mode_labels_by_true_return_and_exits(db: Path) -> None:
    p = run_main("-d", str(db), "--oracle", "30", "--seed", "0")
    assert p.returncode == 0, p.stderr
    assert "30 oracle labels" in p.stdout and "#1 better" in p.stdout
    log = read_label_log(db)
    assert len(log) == 30 and all(lab.source == "oracle" for lab in log)
    assert len({lab.key for lab in log}) == 30  # no pair twice, (a,b) == (b,a)
    for lab in log:
        ra = load_segment(db / lab.sample1).true_return
        rb = load_segment(db / lab.sample2).true_return
        assert lab.label == (FIRST_BETTER if ra > rb else SECOND_BETTER if rb > ra else EQUAL)
        assert lab.extra["returns"] == [ra, rb]


def test_oracle_never_relabels_and_stops_when_pairs_run_out(db: Path) -> None:
    segs = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    append_labels(db, [Label(segs[0], segs[1], 1, source="human")])
    first = oracle_label_db(db, 40, seed=1)
    assert first.labeled == 40
    second = oracle_label_db(db, 100, seed=1)  # 66 pairs in all: 1 human + 40 + 25 left
    assert second.labeled == 25
    log = read_label_log(db)
    assert len(log) == 66 and len({lab.key for lab in log}) == 66
    assert load_labels(db)[pair_key(segs[0], segs[1])].source == "human"  # the person's answer stays
    p = run_main("-d", str(db), "--oracle", "5")
    assert p.returncode == 0 and "0 oracle labels" in p.stdout and "only 0 unlabeled pairs" in p.stdout


def test_sample_unlabeled_pairs_never_hangs() -> None:
    rng = np.random.default_rng(0)
    segs = [f"00/{i:08d}.dat" for i in range(5)]
    all_pairs = {pair_key(a, b) for i, a in enumerate(segs) for b in segs[i + 1 :]}
    assert sample_unlabeled_pairs(segs, all_pairs, 10, rng) == []
    left = sample_unlabeled_pairs(segs, set(list(all_pairs)[:7]), 10, rng)
    assert len(left) == 3 and not {pair_key(*p) for p in left} & set(list(all_pairs)[:7])
    assert sample_unlabeled_pairs(segs[:1], set(), 3, rng) == []
    big = [f"00/{i:08d}.dat" for i in range(2000)]
    pairs = sample_unlabeled_pairs(big, set(), 500, rng)
    assert len({pair_key(*p) for p in pairs}) == 500 and all(a != b for a, b in pairs)


@pytest.mark.parametrize("n_segments", [0, 1])
def test_oracle_on_a_db_too_small(tmp_path: Path, n_segments: int) -> None:
    db = tmp_path / "db"
    db.mkdir()
    make_synthetic_db(db, n_segments)
    with pytest.raises(UserError, match="at least 2 are needed"):
        oracle_label_db(db, 3)


def test_oracle_on_a_legacy_db_is_a_clear_error(tmp_path: Path) -> None:
    """The book's segments (pickled lists of lib.rlhf.EpisodeStep) have no rewards."""
    db = tmp_path / "legacy"
    for k in range(3):
        frames = np.stack([np.full((8, 6, 3), k * 40 + t, np.uint8) for t in range(5)])
        write_legacy_segment(db / "00" / f"{k:08d}.dat", frames, np.arange(5) % 4)
    assert load_segment(db / "00" / "00000000.dat").rewards is None  # it does load, without rewards
    p = run_main("-d", str(db), "--oracle", "2")
    assert p.returncode == 2
    assert p.stderr.startswith("error: ") and "legacy DB without true rewards" in p.stderr
    assert p.stderr.count("\n") == 1
    assert not (db / "labels.jsonl").exists() or not read_label_log(db)


# --- issue 24: concurrent oracles, a full disk ------------------------------------------------


def test_concurrent_oracles_never_label_a_pair_twice(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Low 6: four oracle runs at once, same seed (so, unguarded, the same picks): each pair is
    labeled once. The barrier makes every run pick at the same moment, unless a lock serializes them."""
    import contextlib
    import threading

    import lib.label_ui.oracle

    barrier = threading.Barrier(4)
    choose = lib.label_ui.oracle.choose_pairs

    def choose_together(*args, **kwargs):
        with contextlib.suppress(threading.BrokenBarrierError):  # serialized runs: no one else comes
            barrier.wait(timeout=1.0)
        return choose(*args, **kwargs)

    monkeypatch.setattr(lib.label_ui.oracle, "choose_pairs", choose_together)
    results: list[int] = []
    runs = [threading.Thread(target=lambda: results.append(oracle_label_db(db, 12, seed=0).labeled)) for _ in range(4)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(timeout=60)
    assert results == [12] * 4
    log = read_label_log(db)
    assert len(log) == 48 and len({lab.key for lab in log}) == 48


def test_a_full_disk_ends_the_oracle_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Low 1: the disk fills while the oracle writes: one line naming the file and how many labels
    were kept, exit 2, no traceback, no torn line; the labels written before stay."""
    import errno

    import lib.store.labels
    from lib.label_ui.cli import main

    db = tmp_path / "db"
    make_synthetic_db(db, 24, seed=3)  # 276 pairs
    real_write, calls = lib.store.labels.os.write, []

    def fills_up(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data)
        real_write(fd, data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lib.store.labels, "_os_write", fills_up, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["-d", str(db), "--oracle", "250", "--seed", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write ") and f"{db}/labels.jsonl" in err and err.count("\n") == 1, err
    assert "No space left on device" in err and "kept 100 of the 200" in err
    raw = (db / "labels.jsonl").read_bytes()
    assert raw.endswith(b"\n") and len(read_label_log(db)) == 100  # whole lines only
