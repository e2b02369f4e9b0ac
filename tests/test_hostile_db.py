"""A DB handed over by a stranger: crafted segments, special files, bad names, bad label lines.

Every crafted pickle is built here, byte for byte what an attacker could write. The loader may
only ever answer with a Segment or a SegmentError: no code runs, no memory is read or exhausted.
The stage scripts then run as subprocesses against one DB holding all of it.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zstandard
from numpy._core import multiarray, numeric

from bench.dbs import SEAQUEST, SEAQUEST_ACTIONS, book_pickle, make_square_db, make_synthetic_db
from lib.core.errors import UserError
from lib.core.files import UMASK
from lib.label_ui.oracle import oracle_label_db
from lib.store.labels import Label, append_labels, load_labels, read_label_log
from lib.store.segment_writer import check_db_game, claim_db, encode_segment, save_segment
from lib.store.segments import (
    FORMAT_NAME,
    Segment,
    SegmentError,
    SegmentWatch,
    check_same_game,
    decode_segment,
    list_segments,
    load_segment,
    read_db_info,
    read_segment,
    scan_db,
)

ROOT = Path(__file__).resolve().parents[1]


# --- crafted pickles ----------------------------------------------------------------------------


class Reduce:
    """Pickles as ``func(*args)`` (then ``__setstate__(state)``): any call a file can ask for."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def reconstruct(dtype, shape, raw):
    """numpy's own pickle of an array, with a dtype and raw bytes of the attacker's choice."""
    return Reduce(multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, shape, dtype, False, raw))


EVIL_ARRAYS = {
    # elements are pointers the file chose: reading them dereferences arbitrary addresses
    "object dtype": reconstruct(np.dtype(object), (2,), b"\x41" * 16),
    "structured dtype with an object field": reconstruct(np.dtype([("a", "O"), ("b", "u1")]), (1,), b"\x41" * 9),
    "object dtype via _frombuffer": Reduce(numeric._frombuffer, (b"\x41" * 16, np.dtype(object), (2,), "C")),
    # a uint8 array that starts 4 KB before its buffer: reads heap memory into the frames
    "negative offset": Reduce(np.ndarray, ((50, 210, 160, 3), np.dtype("u1"), b"\x00" * 64, -4096)),
    "memory bomb": Reduce(bytes, (10**11,)),
    "payload shorter than the shape": reconstruct(np.dtype("u1"), (50, 210, 160, 3), b"\x00" * 100),
    "big-endian dtype": reconstruct(np.dtype(">i8"), (50,), b"\x00" * 400),
    "os.system": Reduce(os.system, ("echo pwned",)),
}


def _v1_record(frames) -> dict:
    n = 50
    return {
        "format": FORMAT_NAME,
        "version": 1,
        "frames": frames,
        "actions": np.zeros(n, np.int64),
        "rewards": np.zeros(n, np.float32),
        "dones": None,
        "game_over": None,
        "lives": None,
    }


def crafted_files() -> dict[str, bytes]:
    """Every crafted segment file: each evil array as the book's legacy list, inside a format-1
    record, and inside a format-2 record; plus format-2 records that lie about their arrays."""
    zc = zstandard.ZstdCompressor()
    out = {}
    for name, evil in EVIL_ARRAYS.items():
        out[f"legacy EpisodeStep wrapping {name}"] = book_pickle([(evil, 0)] * 3)
        out[f"format 1 wrapping {name}"] = zc.compress(pickle.dumps(_v1_record(evil), protocol=5))
        rec2 = Segment(np.zeros((2, 4, 4, 3), np.uint8), np.zeros(2, np.int64)).to_record()
        rec2["frames"] = evil
        out[f"format 2 wrapping {name}"] = zc.compress(pickle.dumps(rec2, protocol=5))
    good = Segment(np.zeros((2, 4, 4, 3), np.uint8), np.zeros(2, np.int64)).to_record()
    lies = {
        "dtype O": {"dtype": "|O", "shape": [2], "data": b"\x41" * 16},
        "structured dtype text": {"dtype": "[('a', 'O')]", "shape": [2], "data": b"\x41" * 16},
        "shape beyond the payload": {"dtype": "|u1", "shape": [2, 4, 4, 3000], "data": b"\x00" * 96},
        "negative dimension": {"dtype": "|u1", "shape": [-2, 4, 4, 3], "data": b""},
        "huge dimensions": {"dtype": "|u1", "shape": [2**31, 2**31, 2**31, 3], "data": b""},
        "bool dimension": {"dtype": "|u1", "shape": [True, 4, 4, 3], "data": b"\x00" * 48},
        "text payload": {"dtype": "|u1", "shape": [2, 4, 4, 3], "data": "x" * 96},
        "extra key offset": {"dtype": "|u1", "shape": [2, 4, 4, 3], "data": b"\x00" * 96, "offset": -64},
    }
    for name, arr in lies.items():
        rec = dict(good, frames=arr)
        out[f"format 2 frames with {name}"] = zc.compress(pickle.dumps(rec, protocol=5))
    rec = dict(good, rewards={"dtype": "<f4", "shape": [2], "data": np.array([np.nan, 1], "<f4").tobytes()})
    out["format 2 with NaN rewards"] = zc.compress(pickle.dumps(rec, protocol=5))
    rec = dict(good, actions={"dtype": "<i8", "shape": [2], "data": np.array([-5, 1], "<i8").tobytes()})
    out["format 2 with a negative action"] = zc.compress(pickle.dumps(rec, protocol=5))
    # a zstd frame whose header claims 100 GB of content (single segment: window = content size)
    out["zstd frame claiming 100 GB"] = (
        b"\x28\xb5\x2f\xfd" + b"\xe0" + (10**11).to_bytes(8, "little") + b"\x51\x00\x00" + b"\x00" * 10
    )
    return out


@pytest.mark.parametrize("name", sorted(crafted_files()))
def test_crafted_segment_is_only_ever_a_segment_error(name, tmp_path):
    data = crafted_files()[name]
    path = tmp_path / "00" / "00000001.dat"
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(SegmentError) as e:
        read_segment(tmp_path, "00/00000001.dat")
    assert "00000001.dat" in str(e.value)


def test_crafted_pickles_resolve_no_numpy_code(monkeypatch):
    """The strict path never calls numpy's reconstruction: break it, and legacy files still load."""
    frames = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    data = book_pickle([(frames[0], 1), (frames[1], 2)])

    def boom(*a, **k):
        raise AssertionError("numpy code ran")

    monkeypatch.setattr(multiarray, "_reconstruct", boom)
    monkeypatch.setattr(numeric, "_frombuffer", boom)
    seg = decode_segment(data)
    np.testing.assert_array_equal(seg.frames, frames)
    assert list(seg.actions) == [1, 2] and seg.rewards is None


def test_new_files_unpickle_with_no_global(tmp_path, monkeypatch):
    """A format-2 file asks the unpickler for no global at all."""
    import lib.store.segments as segments

    asked = []
    monkeypatch.setattr(segments._Strict, "find_class", lambda self, m, n: asked.append((m, n)))
    monkeypatch.setattr(segments._Refuse, "find_class", lambda self, m, n: asked.append((m, n)))
    seg = Segment(
        np.ones((3, 8, 8, 3), np.uint8),
        np.array([0, 1, 2]),
        rewards=np.ones(3, np.float32),
        env_id=SEAQUEST,
        env_index=0,
        step=3,
        time=1.5,
        meta={"k": 1},
    )
    back = read_segment(tmp_path, save_segment(tmp_path, seg).relative_to(tmp_path).as_posix())
    assert asked == []
    assert back.true_return == 3.0 and back.meta == {"k": 1} and back.time == 1.5


def test_format_1_files_still_load(tmp_path):
    """Segments written by the previous version (numpy pickled its own arrays) load unchanged."""
    rng = np.random.default_rng(0)
    rec = _v1_record(rng.integers(0, 255, (50, 210, 160, 3), dtype=np.uint8))
    rec.update(
        env_id=SEAQUEST,
        action_meanings=list(SEAQUEST_ACTIONS),
        env_index=np.int64(2),
        step=7,
        checkpoint=None,
        time=np.float64(3.0),
        meta={},
        dones=np.zeros(50, bool),
    )
    for protocol in (2, 4, 5):
        seg = decode_segment(zstandard.ZstdCompressor().compress(pickle.dumps(rec, protocol=protocol)))
        np.testing.assert_array_equal(seg.frames, rec["frames"])
        assert seg.env_index == 2 and seg.time == 3.0 and seg.action_meanings == SEAQUEST_ACTIONS


# --- fuzzing a real segment under a memory limit ------------------------------------------------

FUZZ = textwrap.dedent(
    """
    import json, random, resource, sys, zstandard
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    sys.path.insert(0, sys.argv[2])
    from lib.store.segments import SegmentError, decode_segment
    data = open(sys.argv[1], "rb").read()
    raw = zstandard.ZstdDecompressor().decompress(data)
    rng = random.Random(0)
    outcomes = {"segment": 0, "SegmentError": 0}
    for i in range(int(sys.argv[3])):
        src = raw if i % 2 else data  # mutate the pickle (then compress) or the compressed file
        b = bytearray(src)
        kind = i % 3
        if kind == 0:  # flip a few bytes, near the start (where lengths and opcodes are) or anywhere
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(min(len(b), 400)) if rng.random() < 0.7 else rng.randrange(len(b))
                b[pos] = rng.randrange(256)
        elif kind == 1:
            del b[rng.randrange(len(b)):]
        else:
            pos = rng.randrange(min(len(b), 400))
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
        blob = zstandard.ZstdCompressor().compress(bytes(b)) if src is raw else bytes(b)
        try:
            decode_segment(blob, f"mutation {i}")
            outcomes["segment"] += 1
        except SegmentError:
            outcomes["SegmentError"] += 1
    print(json.dumps(outcomes))
    """
)


@pytest.mark.slow
def test_fuzzed_real_segment_is_a_segment_or_a_segment_error(tmp_path):
    from bench.dbs import make_atari_db

    rel = make_atari_db(tmp_path / "db", 1, t=50, n_envs=1)[0]
    n = 400
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-c", FUZZ, str(tmp_path / "db" / rel), str(ROOT), str(n)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    outcomes = json.loads(r.stdout)
    assert sum(outcomes.values()) == n
    assert outcomes["SegmentError"] > n // 4  # the mutations do break most files


# --- what a DB directory may hold ---------------------------------------------------------------


def _tiny(env_index=0, step=1, env_id=SEAQUEST) -> Segment:
    return Segment(
        np.zeros((2, 8, 8, 3), np.uint8),
        np.zeros(2, np.int64),
        rewards=np.zeros(2, np.float32),
        env_id=env_id,
        env_index=env_index,
        step=step,
    )


def hostile_dir(db: Path, outside: Path) -> None:
    """Bad names, symlinks out of the DB, a FIFO, a device link, a directory in a segment's place."""
    (db / "00").mkdir(parents=True, exist_ok=True)
    outside.mkdir(exist_ok=True)
    save_segment(outside, _tiny(0, 99))
    for name in (
        "$(touch pwned).dat",
        "abc.dat",
        "1.dat",
        "\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2.dat",
    ):
        (db / "00" / name).write_bytes(encode_segment(_tiny()))
    fd = os.open(os.fsencode(db / "00") + b"/\xff\xfe.dat", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    os.symlink("/dev/zero", db / "00" / "00000010.dat")
    os.symlink(outside / "00" / "00000099.dat", db / "00" / "00000011.dat")
    os.mkfifo(db / "00" / "00000012.dat")
    (db / "00" / "00000013.dat").mkdir()
    os.symlink(outside / "00", db / "77")


def test_scan_keeps_regular_files_named_like_segments_inside_the_db(tmp_path):
    db = tmp_path / "db"
    save_segment(db, _tiny(0, 1))
    save_segment(db, _tiny(1, 2))
    os.symlink("../01/00000002.dat", db / "00" / "00000003.dat")  # inside the DB: reads, but is 01/00000002.dat
    hostile_dir(db, tmp_path / "outside")
    listing = scan_db(db)
    assert listing.segments == ["00/00000001.dat", "01/00000002.dat"]
    assert listing.ignored["00/00000003.dat"] == "the same file as 01/00000002.dat"
    assert listing.ignored["00/00000010.dat"] == "symlink leading outside the DB"
    assert listing.ignored["00/00000011.dat"] == "symlink leading outside the DB"
    assert listing.ignored["00/00000012.dat"] == "not a regular file"
    assert listing.ignored["00/00000013.dat"] == "not a regular file"
    assert listing.ignored["77/00000099.dat"] == "symlink leading outside the DB"
    assert "00/$(touch pwned).dat" in listing.ignored and len(listing.ignored) == 11
    lines = []
    assert list_segments(db, warn=lines.append) == listing.segments
    assert len(lines) == 1 and "ignored 11 entries" in lines[0]
    assert read_segment(db, "00/00000003.dat").step == 2


def test_an_alias_inside_the_db_is_one_segment(tmp_path):
    """Audit 5 item 7: a symlink alias (50/X.dat -> ../00/X.dat), one listed before its target, a
    hard link and a linked env directory are the file they name, said once: the oracle labels the
    6 pairs of the 4 files, none compares a file with itself (was: 28 pairs of 8 names, 4 of them a
    file with itself). The name that is not a symlink is kept."""
    db = tmp_path / "db"
    segs = make_synthetic_db(db, 4, seed=5)  # 00/00000012.dat .. 03/00000012.dat
    for env in ("50", "51"):
        (db / env).mkdir()
    os.symlink("../00/00000012.dat", db / "50" / "00000012.dat")
    os.symlink("../03/00000012.dat", db / "00" / "00000001.dat")
    os.link(db / "01" / "00000012.dat", db / "51" / "00000012.dat")
    os.symlink("02", db / "52")
    listing = scan_db(db)
    said: list[str] = []
    assert listing.segments == segs and SegmentWatch(db, warn=said.append).segments == segs  # the page's, --follow's
    assert len(said) == 1 and "ignored 4 entries" in said[0]
    assert listing.ignored == {
        "00/00000001.dat": "the same file as 03/00000012.dat",
        "50/00000012.dat": "the same file as 00/00000012.dat",
        "51/00000012.dat": "the same file as 01/00000012.dat",
        "52/00000012.dat": "the same file as 02/00000012.dat",
    }
    s = oracle_label_db(db, 50, seed=0)
    labels = read_label_log(db)
    assert not [(x.sample1, x.sample2) for x in labels if os.path.samefile(db / x.sample1, db / x.sample2)]
    assert s.labeled == len(labels) == 6


@pytest.mark.parametrize(
    "rel",
    [
        "00/00000010.dat",
        "00/00000011.dat",
        "00/00000012.dat",
        "00/00000013.dat",
        "../outside/00/00000099.dat",
        "00/abc.dat",
        "/etc/passwd",
    ],
)
def test_reading_a_special_or_outside_file_is_a_prompt_segment_error(tmp_path, rel):
    db = tmp_path / "db"
    hostile_dir(db, tmp_path / "outside")
    signal.alarm(10)  # a FIFO must never block the reader
    try:
        with pytest.raises(SegmentError):
            read_segment(db, rel)
    finally:
        signal.alarm(0)


def test_load_segment_refuses_devices_and_fifos(tmp_path):
    with pytest.raises(SegmentError, match="not a regular file"):
        load_segment("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    signal.alarm(10)
    try:
        with pytest.raises(SegmentError, match="not a regular file"):
            load_segment(tmp_path / "fifo")
    finally:
        signal.alarm(0)


def test_written_files_get_the_umask_and_leave_no_temp(tmp_path):
    from lib.store.checkpoints import atomic_torch_save

    path = save_segment(tmp_path, _tiny())
    assert path.stat().st_mode & 0o777 == 0o666 & ~UMASK
    atomic_torch_save({"x": 1}, tmp_path / "ck.pt")
    assert (tmp_path / "ck.pt").stat().st_mode & 0o777 == 0o666 & ~UMASK
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["00", "00000001.dat", "ck.pt"]


# --- labels.jsonl -------------------------------------------------------------------------------


def test_labels_are_never_appended_through_a_symlink(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    victim = tmp_path / "bashrc"
    victim.write_text("# start-up file\n")
    os.symlink(victim, db / "labels.jsonl")
    with pytest.raises(UserError, match="symlink"):
        append_labels(db, [Label("00/$(touch pwned).dat", "00/00000001.dat", 1)])
    assert victim.read_text() == "# start-up file\n"
    warned = []
    assert read_label_log(db, warn=warned.append) == [] and "symlink" in warned[0]


def test_labels_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "labels.jsonl")
    signal.alarm(10)
    try:
        with pytest.raises(UserError, match="not a regular file"):
            append_labels(tmp_path, [Label("00/00000001.dat", "00/00000002.dat", 1)])
        warned = []
        assert load_labels(tmp_path, warn=warned.append) == {} and warned
    finally:
        signal.alarm(0)


GOOD = {"sample1": "00/00000001.dat", "sample2": "00/00000002.dat", "label": 1, "time": 1.0}
BAD_LINES = {
    "label 1e999": json.dumps(GOOD).replace('"label": 1', '"label": 1e999'),
    "label NaN": json.dumps(GOOD).replace('"label": 1', '"label": NaN'),
    "label true": json.dumps(dict(GOOD, label=True)),
    "label 1.0": json.dumps(dict(GOOD, label=1.0)),
    "label 7": json.dumps(dict(GOOD, label=7)),
    "time as text": json.dumps(dict(GOOD, time="yesterday")),
    "time Infinity": json.dumps(GOOD).replace('"time": 1.0', '"time": Infinity'),
    "time a 400-digit integer": json.dumps(dict(GOOD, time=10**400)),  # no float holds it
    "numeric path": json.dumps(dict(GOOD, sample1=5)),
    "path leaving the DB": json.dumps(dict(GOOD, sample1="../../etc/passwd")),
    "source as a list": json.dumps(dict(GOOD, source=["x"])),
    "a JSON list": "[1, 2]",
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "not UTF-8": '{"sample1": "00/\xff"}',
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_bad_label_line_is_skipped_with_its_line_number(tmp_path, name):
    other = dict(GOOD, sample2="00/00000003.dat")
    raw = BAD_LINES[name].encode("latin-1" if name == "not UTF-8" else "utf-8")
    (tmp_path / "labels.jsonl").write_bytes(
        json.dumps(GOOD).encode() + b"\n" + raw + b"\n" + json.dumps(other).encode() + b"\n"
    )
    warned = []
    labels = load_labels(tmp_path, warn=warned.append)
    assert len(labels) == 2
    assert len(warned) == 1 and "labels.jsonl:2: skipping a bad line" in warned[0]


def test_torn_utf8_last_line_is_skipped_and_earlier_labels_survive(tmp_path):
    line = json.dumps(dict(GOOD, labeler="Zoë"), ensure_ascii=False).encode()
    cut = line.index("ë".encode()) + 1  # inside the two bytes of ë
    (tmp_path / "labels.jsonl").write_bytes(json.dumps(GOOD).encode() + b"\n" + line[:cut])
    warned = []
    assert len(load_labels(tmp_path, warn=warned.append)) == 1
    assert "labels.jsonl:2: skipping a torn last line" in warned[0]
    append_labels(tmp_path, [Label("00/00000004.dat", "00/00000005.dat", 2)])
    assert len(load_labels(tmp_path, warn=warned.append)) == 2


# --- a DB knows its game ------------------------------------------------------------------------


def test_db_json_is_written_by_the_first_recording_and_guards_the_game(tmp_path):
    db = tmp_path / "db"
    claim_db(db, SEAQUEST, SEAQUEST_ACTIONS)
    info = read_db_info(db)
    assert info is not None and info.game == "seaquest" and info.action_meanings == SEAQUEST_ACTIONS
    claim_db(db, "ALE/Seaquest-v5", SEAQUEST_ACTIONS)  # same game, other spelling: fine
    with pytest.raises(UserError, match="holds SeaquestNoFrameskip-v4 segments, this run plays Breakout"):
        check_db_game(db, "BreakoutNoFrameskip-v4")
    other = tmp_path / "breakout"
    claim_db(other, "BreakoutNoFrameskip-v4", ("NOOP", "FIRE", "RIGHT", "LEFT"))
    with pytest.raises(UserError, match=f"{db} holds SeaquestNoFrameskip-v4, {other} holds Breakout"):
        check_same_game([db, other], "labeling")


def test_db_without_db_json_takes_its_game_from_its_segments(tmp_path):
    save_segment(tmp_path, _tiny())
    with pytest.raises(UserError, match="Breakout"):
        check_db_game(tmp_path, "BreakoutNoFrameskip-v4")
    (tmp_path / "db.json").write_text("{not json")
    warned = []
    assert read_db_info(tmp_path, warn=warned.append) is None and "db.json: ignored" in warned[0]


# --- the stage scripts against one hostile DB ---------------------------------------------------


def hostile_db(tmp_path: Path) -> Path:
    """A DB a stranger could hand over: 30 good segments, every crafted file, special files,
    labels with bad lines, a labeled pair of crafted segments."""
    db = tmp_path / "db"
    rels = make_square_db(db, n_segments=30)
    hostile_dir(db, tmp_path / "outside")
    crafted = []
    for k, data in enumerate(crafted_files().values()):
        rel = f"05/{k + 1:08d}.dat"
        (db / "05").mkdir(exist_ok=True)
        (db / rel).write_bytes(data)
        crafted.append(rel)
    labels = [Label(rels[i], rels[i + 1], 1 if i % 3 else 2) for i in range(0, 28, 2)]
    labels += [Label(crafted[k], rels[k], 1) for k in range(5)]
    labels += [Label("00/00000010.dat", rels[0], 2), Label("00/00000012.dat", rels[1], 1)]
    append_labels(db, labels)
    with open(db / "labels.jsonl", "ab") as f:
        for line in BAD_LINES.values():
            f.write(line.encode("utf-8", "surrogateescape") + b"\n")
        f.write('{"sample1": "00/00000001.dat", "labeler": "Zo\u00eb'.encode()[:-1])  # torn inside ë
    return db


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _clean(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode in (0, 2), (r.returncode, r.stderr[-3000:])


@pytest.mark.slow
def test_stage_scripts_exit_cleanly_on_a_hostile_db(tmp_path):
    db = hostile_db(tmp_path)
    before = (tmp_path / "outside" / "00" / "00000099.dat").read_bytes()

    r = _run(str(ROOT / "02_label_ui.py"), "-d", str(db), "--oracle", "40", "--seed", "0", cwd=tmp_path)
    _clean(r)
    assert r.returncode == 0 and "oracle labels" in r.stdout
    assert "skipping a bad line" in r.stderr and "ignored 10 entries" in r.stderr

    r = _run(
        str(ROOT / "03_reward_train.py"),
        "-n",
        "h",
        "-o",
        str(tmp_path / "out"),
        str(db),
        "--epochs",
        "1",
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    _clean(r)
    assert r.returncode == 0 and (tmp_path / "out" / "reward-h.pt").is_file()
    assert "left out: segment file unreadable" in r.stdout and "skipped:" in r.stderr

    r = _run(
        str(ROOT / "01_a2c.py"),
        "-n",
        "x",
        "--env",
        "BreakoutNoFrameskip-v4",
        "--db-path",
        str(db),
        "--save",
        str(tmp_path / "s"),
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    _clean(r)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "holds SeaquestNoFrameskip-v4" in r.stderr

    assert not (tmp_path / "pwned").exists() and not (db / "pwned").exists()
    assert (tmp_path / "outside" / "00" / "00000099.dat").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "outside").rglob("*")) == ["00", "00000099.dat"]


@pytest.mark.slow
def test_recording_into_a_db_with_hostile_names_continues_its_counters(tmp_path):
    db = tmp_path / "db"
    hostile_dir(db, tmp_path / "outside")
    save_segment(db, _tiny(0, 500))
    r = _run(
        str(ROOT / "01_a2c.py"),
        "-n",
        "rec",
        "--db-path",
        str(db),
        "--envs",
        "2",
        "--max-steps",
        "256",
        "--record-prob",
        "0.5",
        "--segment-steps",
        "5",
        "--test-every",
        "0",
        "--save",
        str(tmp_path / "s"),
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    _clean(r)
    assert r.returncode == 0
    steps = [int(rel[3:11]) for rel in list_segments(db, warn=None) if rel.startswith("00/")]
    assert steps[0] == 500 and len(steps) > 1  # new segments continue after the highest counter
    assert read_db_info(db).game == "seaquest"


def test_a_flipped_bit_in_a_frame_payload_is_caught_by_the_checksum(tmp_path):
    seg = Segment(np.random.default_rng(0).integers(0, 255, (4, 16, 16, 3), dtype=np.uint8), np.zeros(4, np.int64))
    seg = Segment(seg.frames, seg.actions, env_index=0, step=1)
    path = save_segment(tmp_path, seg)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the compressed frames, far from any header
    path.write_bytes(bytes(data))
    with pytest.raises(SegmentError, match="00000001.dat"):
        read_segment(tmp_path, "00/00000001.dat")


# --- issue 24: bounds before np.stack, db.json and directories that break readers ---------------


def test_a_legacy_file_of_many_references_to_one_frame_is_refused_before_stacking(tmp_path):
    """Under 1 MB of pickle, 30,000 references to one 100 KB frame: would decode to 2.8 GiB."""
    frame = np.zeros((210, 160, 3), np.uint8)
    data = book_pickle([(frame, 0)] * 30_000)
    assert len(data) < 1 << 20
    with pytest.raises(SegmentError, match="decode to more than"):
        decode_segment(data, "bomb.dat")
    ok = book_pickle([(frame, 0)] * 50)  # the book's own size still loads
    assert len(decode_segment(ok, "ok.dat")) == 50


def _broken_db_json(db: Path, case: str) -> None:
    db.mkdir(parents=True, exist_ok=True)
    info = db / "db.json"
    if case == "version 1e400":
        text = (
            '{"format": "rlhf-atari-db", "version": 1e400, "game": "seaquest", "env_id": "%s", "action_meanings": []}'
        )
        info.write_text(text % SEAQUEST)
    elif case == "60,000 nested [":
        info.write_text("[" * 60_000)
    elif case == "symlink to itself":
        info.symlink_to("db.json")
    elif case == "a directory":
        info.mkdir()
    elif case == "directory loop":
        (db / "07").symlink_to("07")
    else:
        raise AssertionError(case)


DB_CASES = ["version 1e400", "60,000 nested [", "symlink to itself", "a directory", "directory loop"]


@pytest.mark.parametrize("case", DB_CASES)
def test_broken_db_json_or_directory_loop_is_a_warning_for_every_reader(tmp_path, case):
    db = tmp_path / "db"
    save_segment(db, _tiny())
    _broken_db_json(db, case)
    warned: list[str] = []
    read_db_info(db, warn=warned.append)
    assert list_segments(db, warn=warned.append) == ["00/00000001.dat"]
    assert check_same_game([db], "labeling") == "seaquest"  # from the segment
    assert all("\n" not in w for w in warned)
    if case != "directory loop":
        assert any("db.json: ignored" in w for w in warned)
    else:
        assert "07 (" in scan_db(db).warning(db)


@pytest.mark.parametrize("case", DB_CASES)
def test_broken_db_json_or_directory_loop_stops_the_recorder_with_one_line(tmp_path, case):
    from test_recorder import CountingEnv

    from lib.a2c.recorder import EpisodeRecorderWrapper

    db = tmp_path / "db"
    _broken_db_json(db, case)
    if case == "directory loop":  # readable db.json: the recorder just skips the loop
        EpisodeRecorderWrapper(CountingEnv(1), db, segment_steps=2).close()
        return
    with pytest.raises(UserError, match="not a readable DB description") as e:
        EpisodeRecorderWrapper(CountingEnv(1), db, segment_steps=2)
    assert "\n" not in str(e.value)
    # the refused DB's lock was released: once db.json is fixed, a recorder starts
    if (db / "db.json").is_dir():
        (db / "db.json").rmdir()
    else:
        (db / "db.json").unlink()
    EpisodeRecorderWrapper(CountingEnv(1), db, segment_steps=2).close()


def test_the_legacy_decoded_size_bound_is_the_format_2_one(monkeypatch):
    """The legacy path is bounded by MAX_RAW_BYTES, like a format-2 file (cheap: a 20 MB bound)."""
    import lib.store.segments

    frame = np.zeros((210, 160, 3), np.uint8)
    monkeypatch.setattr(lib.store.segments, "MAX_RAW_BYTES", 20 << 20)
    assert len(decode_segment(book_pickle([(frame, 0)] * 200), "ok.dat")) == 200  # 20.2 MB < 20 MiB
    with pytest.raises(SegmentError, match="decode to more than"):
        decode_segment(book_pickle([(frame, 0)] * 300), "big.dat")  # 30 MB
