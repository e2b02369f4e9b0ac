"""Benchmark of the label page (02_label_ui.py): answer-to-next-pair latency in a real browser,
clip encoding, start-up time and memory with a 10,000-segment DB, how long another tab's
requests wait while a tab opens the Overview or Existing labels of 300,000 labels, and (``live``)
the latency alone and with a live round's trainer (03_reward_train.py --follow) and recording A2C
(01_a2c.py --db-path) running beside the page on the same DB, and (``scale``) what grows with the DB
on the page's event loop (a new list under --recent at 50,000 segments) and in a following trainer
(re-reading 100,000 label lines after one more). Also writes the README's screenshot
(docs/label_ui.png). Prints a table: figure | value | unit | setting.

    python -m bench.bench_label_ui [--answers 25] [--segments 60] [--no-screenshot] [--only busy live scale]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.dbs import make_atari_db
from bench.label_harness import Beside, LabelServer, answer_and_wait, chromium, small_png, wait_shown
from lib.core.table import print_table
from lib.label_ui.clips import encode_clip_file
from lib.label_ui.oracle import oracle_label_db
from lib.store.labels import Label, append_labels
from lib.store.segment_writer import encode_segment
from lib.store.segments import Segment, list_segments

ROOT = Path(__file__).resolve().parents[1]

KEYS = "1201x"  # answers cycle through #1 better, #2 better, equal, #1 better, can't tell
PARTS = ("encode", "latency", "startup", "busy", "live", "scale")
Row = tuple[str, str, str, str]  # figure, value, unit, setting


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def latency(
    db: Path, cache: Path, answers: int, view_s: float, screenshot: Path | None, pairs: int = 20
) -> list[float]:
    """Key press -> both clips of the next pair on screen, as the page measures it (ms); lists of
    ``pairs`` pairs (at each list's end the page looks for new segments)."""
    out = []
    # Run where the DB is db/v0, as in the README, so the screenshot shows that path.
    cwd = db.parents[1]
    args = ("-d", str(db.relative_to(cwd)), "--cache-dir", str(cache), "--pairs", str(pairs), "--seed", "0")
    with LabelServer(*args, cwd=cwd) as server, chromium(viewport=(1180, 740)) as page:
        page.goto(f"{server.url}/label")
        wait_shown(page, 1)
        for i in range(answers):
            time.sleep(view_s)  # the person watches the pair; the next pairs' clips are prefetched
            out.append(answer_and_wait(page, KEYS[i % len(KEYS)]))
        if screenshot is not None:
            time.sleep(1.2)  # mid-clip, not the first frame
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(small_png(page.screenshot()))
    return out


def encode_times(db: Path, cache: Path) -> tuple[list[float], list[float]]:
    """Encode every segment's clip once (cold cache): ms per clip and KB per clip."""
    ms, kb = [], []
    for k, rel in enumerate(list_segments(db)):
        out = cache / f"{k}.mp4"
        t0 = time.perf_counter()
        encode_clip_file(db / rel, out, 15.0)
        ms.append((time.perf_counter() - t0) * 1000)
        kb.append(out.stat().st_size / 1024)
    return ms, kb


def big_db(src: Path, dst: Path, n: int) -> None:
    """A DB of ``n`` segments: copies of real segments, 100 per env dir (copies, not hard links: a
    second name of one file is one segment, ``lib.store.segments.DbListing.one_per_file``)."""
    segs = [src / rel for rel in list_segments(src)]
    for k in range(n):
        d = dst / f"{k // 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(segs[k % len(segs)], d / f"{(k % 100 + 1) * 50:08d}.dat")


def startup(db: Path, cache: Path) -> tuple[float, float, float, float]:
    """Launch to first page served (s), RSS then (MB), time to the first pair on screen in the
    browser (s, from launch), RSS after (MB)."""
    t0 = time.perf_counter()
    with LabelServer("-d", str(db), "--cache-dir", str(cache)) as server:
        start_s, rss0 = server.startup_s, server.rss_mb()
        with chromium() as page:
            page.goto(f"{server.url}/label")
            wait_shown(page, 1)
            first_pair_s = time.perf_counter() - t0
        return start_s, rss0, first_pair_s, server.rss_mb()


def many_labels(db: Path, n: int, seed: int = 0) -> None:
    """Append ``n`` labels of distinct random pairs of the DB's segments, one a second, answers and
    sources (human, oracle) taking turns."""
    segs = list_segments(db)
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, int]] = set()
    out: list[Label] = []
    start = time.time() - n
    for a, b in rng.integers(len(segs), size=(4 * n, 2)):
        key = (min(a, b), max(a, b))
        if a == b or key in seen:
            continue
        seen.add(key)
        k = len(out)
        out.append(Label(segs[a], segs[b], (1, 2, 0, -1)[k % 4], time=start + k, source=("human", "oracle")[k % 2]))
        if len(out) == n:
            break
    append_labels(db, out)


PROBE_EVERY_S = 0.02


def other_tab_waits(
    db: Path, cache: Path, path: str, loads: int, shown: re.Pattern[str]
) -> tuple[list[float], list[float]]:
    """While one tab opens ``path`` ``loads`` times (until ``shown`` is on screen), another tab's
    request (a clip it shows, every 20 ms) is timed: (request ms, page-open s). An open before
    them is not timed: the browser's and the server's first page cost the same with no labels."""
    rel = list_segments(db)[0]
    with LabelServer("-d", str(db), "--cache-dir", str(cache), timeout=300) as server, chromium() as page:
        clip = f"{server.url}/clip/0/{rel.removesuffix('.dat')}.mp4"
        urllib.request.urlopen(clip, timeout=60).read()  # encoded now: what is timed is serving it
        page.goto(f"{server.url}{path}")
        page.get_by_text(shown).first.wait_for(timeout=120_000)
        waits, opens, stop = [], [], threading.Event()

        def probe() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                with urllib.request.urlopen(clip, timeout=60) as r:
                    r.read()
                waits.append((time.perf_counter() - t0) * 1000)
                time.sleep(PROBE_EVERY_S)

        thread = threading.Thread(target=probe)
        thread.start()
        try:
            for _ in range(loads):
                t0 = time.perf_counter()
                page.goto(f"{server.url}{path}")
                page.get_by_text(shown).first.wait_for(timeout=120_000)
                opens.append(time.perf_counter() - t0)
        finally:
            stop.set()
            thread.join()
    return waits, opens


def busy_rows(src: Path, tmp: Path, n_labels: int, loads: int) -> list[Row]:
    """Another tab's requests while the Overview and Existing labels open with ``n_labels`` labels,
    and with one page of labels (25): what the pages cost whatever the number of labels."""
    rows = []
    for n in (n_labels, 25):
        db = tmp / f"labels{n}"
        big_db(src, db, 1000)  # 499,500 pairs
        many_labels(db, n)
        what = f"{n:,} labels, 1,000 segments"
        for name, path in (("Overview", "/"), ("Existing labels", "/labels")):
            waits, opens = other_tab_waits(db, tmp / "cache-busy", path, loads, re.compile(rf"^{n} labels"))
            how = f"{len(waits)} GETs of a clip, one every {PROBE_EVERY_S * 1000:.0f} ms, during {loads} opens"
            fig = f"other tab's request while {name} opens"
            rows += [
                (f"{fig}, max", f"{max(waits):.0f}", "ms", f"{what} (target < 250 ms)"),
                (f"{fig}, median", f"{statistics.median(waits):.0f}", "ms", how),
                (f"{name} open", f"{statistics.median(opens):.2f}", "s", f"median, navigation to counts shown; {what}"),
            ]
    return rows


def encode_rows(db: Path, tmp: Path) -> list[Row]:
    ms, kb = encode_times(db, tmp / "enc")
    setting = "median; 50 frames 210x160 -> H.264 MP4 320x420, ffmpeg 1 thread"
    return [
        ("clip encode", f"{statistics.median(ms):.0f}", "ms/clip", setting),
        ("clip encode p95", f"{p95(ms):.0f}", "ms/clip", f"over {len(ms)} clips, incl. reading the segment"),
        ("clip size", f"{statistics.median(kb):.1f}", "KB/clip", "median; cached outside the DB"),
    ]


def latency_rows(db: Path, tmp: Path, answers: int, shot: Path | None) -> list[Row]:
    setting = f"{len(list_segments(db))} real SeaQuest 50-step segments, headless Chromium, {os.cpu_count()} cores"
    lat = latency(db, tmp / "cache1", answers, 1.0, shot)
    fast = latency(db, tmp / "cache2", answers, 0.0, None)
    return [
        (
            "key -> next pair shown, median",
            f"{statistics.median(lat):.0f}",
            "ms",
            f"{len(lat)} answers, 1 s viewing each; {setting}",
        ),
        ("key -> next pair shown, p95", f"{p95(lat):.0f}", "ms", "same (target <= 250 ms)"),
        (
            "key -> next pair shown, median",
            f"{statistics.median(fast):.0f}",
            "ms",
            f"{len(fast)} answers back to back (no viewing time), cold clip cache",
        ),
        ("key -> next pair shown, p95", f"{p95(fast):.0f}", "ms", "same"),
    ]


LIVE_SEEDED = 10  # oracle labels before the start: the trainer's first version trains right away
LIVE_PAIRS = 5  # the page's lists: it looks for the A2C's new segments at the end of each
LIVE_ENVS, LIVE_RECORD_PROB, LIVE_RETRAIN_EVERY, LIVE_POLL_S = 8, 0.01, 5, 1.0
TRAINING_LINE = re.compile(r"^v([0-9]+) training on ([0-9]+) labels", re.MULTILINE)  # stage 3 --follow


def live_rows(src: Path, tmp: Path, answers: int) -> list[Row]:
    """The answer-to-next-pair latency on one DB twice: alone, then with ``03_reward_train.py
    --follow`` (retraining on the labels the answers write) and a recording ``01_a2c.py`` (new
    segments into the DB) running beside the page as real processes, stopped by Ctrl-C afterwards.
    Also the versions the trainer wrote and the agent steps the A2C took while the page was timed."""
    work = tmp / "live"
    db = work / "db" / "v0"
    shutil.copytree(src, db)  # its own copy: the labels of the other parts' answers are not its
    oracle_label_db(db, LIVE_SEEDED, seed=0)
    n_segments = len(list_segments(db))
    alone = latency(db, work / "cache-alone", answers, 1.0, None, pairs=LIVE_PAIRS)
    with Beside(
        db,
        work / "beside",
        envs=LIVE_ENVS,
        record_prob=LIVE_RECORD_PROB,
        retrain_every=LIVE_RETRAIN_EVERY,
        poll=LIVE_POLL_S,
    ) as beside:
        # Timed once both are at work: the trainer has installed its first version (from the labels so
        # far) and waits for the page's answers; the A2C's first progress line (every 10 s) says it steps.
        beside.wait_for("first reward model version", lambda: beside.versions() != [], timeout=900)
        beside.wait_for("progress line of the A2C", lambda: beside.a2c_logged_step() is not None, timeout=900)
        step0, t0, segs0 = beside.a2c_logged_step() or 0, time.time(), len(list_segments(db))
        mark = beside.log_size("trainer")
        near = latency(db, work / "cache-beside", answers, 1.0, None, pairs=LIVE_PAIRS)
        t1, segs1 = time.time(), len(list_segments(db))
        started = TRAINING_LINE.findall(beside.log("trainer")[mark:])  # (version, labels) of each training begun
        beside.check_running()  # both were running all along
        codes = beside.stop()
    step1 = beside.a2c_final_step() or step0
    dropped = re.search(r"v([0-9]+)'s training abandoned", beside.log("trainer"))
    made = [v for v in beside.versions() if t0 <= float(v.get("time", 0)) <= t1]
    every = beside.versions()
    secs = [float(v["seconds"]) for v in made if "seconds" in v]
    stopped = ", ".join(f"{n} exit {codes[n]} on {beside.stopped_by.get(n, '-')}" for n in codes)
    setting = (
        f"{len(alone)} answers, 1 s viewing each, lists of {LIVE_PAIRS} pairs; {n_segments} real SeaQuest segments, "
        f"{LIVE_SEEDED} oracle labels at start; headless Chromium, {os.cpu_count()} cores; each run's clip cache cold"
    )
    beside_how = (
        f"03_reward_train.py --follow --retrain-every {LIVE_RETRAIN_EVERY} --poll {LIVE_POLL_S:g} and "
        f"01_a2c.py --envs {LIVE_ENVS} --record-prob {LIVE_RECORD_PROB:g} --db-path (same DB) running"
    )
    return [
        ("key -> next pair shown, median, alone", f"{statistics.median(alone):.0f}", "ms", setting),
        ("key -> next pair shown, p95, alone", f"{p95(alone):.0f}", "ms", "same"),
        ("key -> next pair shown, median, beside", f"{statistics.median(near):.0f}", "ms", beside_how),
        ("key -> next pair shown, p95, beside", f"{p95(near):.0f}", "ms", "same, after the alone run (its labels too)"),
        (
            "trainer versions begun while timed",
            str(len(started)),
            "versions",
            ", ".join(f"v{k} on {n} training labels" for k, n in started)
            + f"; v1 before the timing ({len(every)} written in all)",
        ),
        (
            "trainer versions written while timed",
            str(len(made)),
            "versions",
            f"{sum(bool(v.get('installed')) for v in made)} installed"
            + (f", {statistics.median(secs):.0f} s of training each (median)" if secs else "")
            + (f"; v{dropped[1]}'s training dropped at the stop" if dropped else "; none training at the stop"),
        ),
        (
            "A2C agent steps while timed",
            f"{step1 - step0:,}",
            "steps",
            f"{(step1 - step0) / max(t1 - t0, 1e-6):.0f} steps/s over {t1 - t0:.0f} s (page start incl.); "
            f"{segs1 - segs0} new segments in the DB",
        ),
        ("processes beside, stopped", str(sum(c in (0, 130) for c in codes.values())), f"of {len(codes)}", stopped),
    ]


def startup_rows(db: Path, tmp: Path, n_segments: int) -> list[Row]:
    big = tmp / "big"
    big_db(db, big, n_segments)
    oracle_label_db(big, 1000, seed=0)
    start_s, rss0, first_s, rss1 = startup(big, tmp / "cache3")
    what = f"{n_segments:,} segments, 1,000 labels"
    return [
        ("start-up", f"{start_s:.2f}", "s", f"launch to first page served; {what} (target < 3 s)"),
        ("first pair on screen", f"{first_s:.2f}", "s", f"launch to both clips playing, incl. Chromium start; {what}"),
        ("server memory", f"{rss0:.0f}", "MB RSS", f"after start-up; {what}"),
        ("server memory", f"{rss1:.0f}", "MB RSS", "after one label page with clips"),
    ]


def tiny_db(root: Path, n: int, envs: int = 100) -> None:
    """A DB of ``n`` files, each its own copy of one tiny segment (2 frames of 8x8; nothing timed
    opens them), ``envs`` env directories, names ``NN/SSSSSSSS.dat`` 50 steps apart."""
    data = encode_segment(Segment(np.zeros((2, 8, 8, 3), np.uint8), np.zeros(2, np.int64), env_index=0, step=50))
    for env in range(envs):
        (root / f"{env:02d}").mkdir(parents=True, exist_ok=True)
    for k in range(n):
        (root / f"{k % envs:02d}" / f"{(k // envs + 1) * 50:08d}.dat").write_bytes(data)


async def loop_cpu(work, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """Await ``work()`` ``repeats`` times: the CPU time the event loop's thread spent in each call
    (what every other request on the loop waits for), the CPU time of all threads, and the wall time
    (ms each). CPU time, not wall: on a machine shared with a training run, wall time is mostly
    waiting for a core."""
    loop_ms, cpu_ms, wall_ms = [], [], []
    for _ in range(repeats):
        t0, c0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
        await work()
        loop_ms.append((time.thread_time() - t0) * 1000)
        cpu_ms.append((time.process_time() - c0) * 1000)
        wall_ms.append((time.perf_counter() - w0) * 1000)
    return loop_ms, cpu_ms, wall_ms


def scale_rows(tmp: Path, n_segments: int, n_labels: int, recent: int = 50, repeats: int = 10) -> list[Row]:
    """What grows with the DB: a tab's new list under ``--recent`` on the page's event loop
    (``label_page.next_list``, as the Resample button runs it), and a following trainer's
    ``LabelWatch.read`` after one label is appended to ``n_labels`` lines."""
    from lib.label_ui.label_page import next_list
    from lib.label_ui.state import AppState, DbState, TabSession
    from lib.reward.follow import LabelWatch, OnceWarn

    db = tmp / "scale"
    tiny_db(db, n_segments)
    many_labels(db, n_labels)
    app = AppState([DbState.open(0, db, recent=recent)], pairs=20, seed=0, control_rate=0.05)
    tab = TabSession(app, "bench")
    on_loop, cpu, wall = asyncio.run(loop_cpu(lambda: next_list(app, tab), repeats))
    what = f"{n_segments:,} segments, {n_labels:,} labels, --recent {recent}, lists of 20, --control-rate 0.05"
    med = statistics.median
    rows = [
        ("new list: CPU on the event loop, median", f"{med(on_loop):.0f}", "ms", f"over {repeats} lists; {what}"),
        ("new list: CPU on the event loop, max", f"{max(on_loop):.0f}", "ms", "same"),
        ("new list: CPU in all threads, median", f"{med(cpu):.0f}", "ms", "same; rescan and label refresh incl."),
        ("new list: wall time, median", f"{med(wall):.0f}", "ms", "same; mostly waiting for a core when shared"),
    ]
    watch = LabelWatch([str(db)], OnceWarn())
    c0 = time.process_time()
    watch.read()
    first = (time.process_time() - c0) * 1000
    segs = list_segments(db, warn=None)
    again = []
    for k in range(3):
        append_labels(db, [Label(segs[k], segs[-1 - k], 1, time=time.time(), source="human")])
        c0 = time.process_time()
        watch.read()
        again.append((time.process_time() - c0) * 1000)
    rows += [
        ("LabelWatch.read, first: CPU", f"{first:.0f}", "ms", f"{n_labels:,} label lines, {n_segments:,} segments"),
        ("LabelWatch.read after 1 more: CPU", f"{med(again):.0f}", "ms", "median of 3; one label appended before each"),
    ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=25, help="answers timed per latency run (default 25)")
    ap.add_argument("--segments", type=int, default=60, help="real SeaQuest segments in the latency DB")
    ap.add_argument("--big", type=int, default=10_000, help="segments in the start-up DB (default 10,000)")
    ap.add_argument("--busy-labels", type=int, default=300_000, help="labels of the busy rows (default 300,000)")
    ap.add_argument("--busy-loads", type=int, default=5, help="opens of each page timed in the busy rows (default 5)")
    ap.add_argument("--scale-segments", type=int, default=50_000, help="segments of the scale rows (default 50,000)")
    ap.add_argument("--scale-labels", type=int, default=100_000, help="label lines of the scale rows (default 100,000)")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=PARTS, help="run only these parts (default: all)")
    ap.add_argument("--screenshot", type=Path, default=ROOT / "docs" / "label_ui.png")
    ap.add_argument("--no-screenshot", action="store_true")
    args = ap.parse_args()
    shot = None if args.no_screenshot or "latency" not in args.only else args.screenshot
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-label-") as tmp_:
        tmp = Path(tmp_)
        db = tmp / "db" / "v0"
        if set(args.only) != {"scale"}:
            make_atari_db(db, args.segments, t=50, n_envs=4, seed=0)
        if "encode" in args.only:
            rows += encode_rows(db, tmp)
        if "latency" in args.only:
            rows += latency_rows(db, tmp, args.answers, shot)
        if "startup" in args.only:
            rows += startup_rows(db, tmp, args.big)
        if "busy" in args.only:
            rows += busy_rows(db, tmp, args.busy_labels, args.busy_loads)
        if "live" in args.only:
            rows += live_rows(db, tmp, args.answers)
        if "scale" in args.only:
            rows += scale_rows(tmp, args.scale_segments, args.scale_labels)
    print_table("bench_label_ui (stage 2: labeling)", rows)
    if shot is not None:
        print(f"\nscreenshot: {shot} ({shot.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
