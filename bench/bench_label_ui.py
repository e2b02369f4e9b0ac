"""Benchmark of the label page (02_label_ui.py): answer-to-next-pair latency in a real browser,
clip encoding, and start-up time and memory with a 10,000-segment DB. Also writes the README's
screenshot (docs/label_ui.png). Prints a table: figure | value | unit | setting.

    python -m bench.bench_label_ui [--answers 25] [--segments 60] [--no-screenshot]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.dbs import make_atari_db
from bench.label_harness import LabelServer, answer_and_wait, chromium, small_png, wait_shown
from bench.table import print_table
from lib.label_ui.clips import encode_clip_file
from lib.oracle import oracle_label_db
from lib.segments import list_segments

ROOT = Path(__file__).resolve().parents[1]

KEYS = "1201x"  # answers cycle through #1 better, #2 better, equal, #1 better, can't tell


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def latency(db: Path, cache: Path, answers: int, view_s: float, screenshot: Path | None) -> list[float]:
    """Key press -> both clips of the next pair on screen, as the page measures it (ms)."""
    out = []
    # Run where the DB is db/v0, as in the README, so the screenshot shows that path.
    cwd = db.parents[1]
    args = ("-d", str(db.relative_to(cwd)), "--cache-dir", str(cache), "--pairs", "20", "--seed", "0")
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
    """A DB of ``n`` segments: hard links to real segments (no disk space), 100 per env dir."""
    segs = [src / rel for rel in list_segments(src)]
    for k in range(n):
        d = dst / f"{k // 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        os.link(segs[k % len(segs)], d / f"{(k % 100 + 1) * 50:08d}.dat")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=25, help="answers timed per latency run (default 25)")
    ap.add_argument("--segments", type=int, default=60, help="real SeaQuest segments in the latency DB")
    ap.add_argument("--big", type=int, default=10_000, help="segments in the start-up DB (default 10,000)")
    ap.add_argument("--screenshot", type=Path, default=ROOT / "docs" / "label_ui.png")
    ap.add_argument("--no-screenshot", action="store_true")
    args = ap.parse_args()
    rows: list[tuple[str, str, str, str]] = []
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory(prefix="bench-label-") as tmp_:
        tmp = Path(tmp_)
        db = tmp / "db" / "v0"
        make_atari_db(db, args.segments, t=50, n_envs=4, seed=0)
        setting = f"{args.segments} real SeaQuest 50-step segments, headless Chromium, {cores} cores"

        ms, kb = encode_times(db, tmp / "enc")
        rows.append(
            (
                "clip encode",
                f"{statistics.median(ms):.0f}",
                "ms/clip",
                "median; 50 frames 210x160 -> H.264 MP4 320x420, ffmpeg 1 thread",
            )
        )
        rows.append(
            ("clip encode p95", f"{p95(ms):.0f}", "ms/clip", f"over {len(ms)} clips, incl. reading the segment")
        )
        rows.append(("clip size", f"{statistics.median(kb):.1f}", "KB/clip", "median; cached outside the DB"))

        shot = None if args.no_screenshot else args.screenshot
        lat = latency(db, tmp / "cache1", args.answers, 1.0, shot)
        rows.append(
            (
                "key -> next pair shown, median",
                f"{statistics.median(lat):.0f}",
                "ms",
                f"{len(lat)} answers, 1 s viewing each; {setting}",
            )
        )
        rows.append(("key -> next pair shown, p95", f"{p95(lat):.0f}", "ms", "same (target <= 250 ms)"))
        fast = latency(db, tmp / "cache2", args.answers, 0.0, None)
        rows.append(
            (
                "key -> next pair shown, median",
                f"{statistics.median(fast):.0f}",
                "ms",
                f"{len(fast)} answers back to back (no viewing time), cold clip cache",
            )
        )
        rows.append(("key -> next pair shown, p95", f"{p95(fast):.0f}", "ms", "same"))

        big = tmp / "big"
        big_db(db, big, args.big)
        oracle_label_db(big, 1000, seed=0)
        start_s, rss0, first_s, rss1 = startup(big, tmp / "cache3")
        what = f"{args.big:,} segments, 1,000 labels"
        rows.append(("start-up", f"{start_s:.2f}", "s", f"launch to first page served; {what} (target < 3 s)"))
        rows.append(
            (
                "first pair on screen",
                f"{first_s:.2f}",
                "s",
                f"launch to both clips playing, incl. Chromium start; {what}",
            )
        )
        rows.append(("server memory", f"{rss0:.0f}", "MB RSS", f"after start-up; {what}"))
        rows.append(("server memory", f"{rss1:.0f}", "MB RSS", "after one label page with clips"))

    print_table("bench_label_ui (stage 2: labeling)", rows)
    if shot is not None:
        print(f"\nscreenshot: {shot} ({shot.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
