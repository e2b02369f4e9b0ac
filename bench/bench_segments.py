"""Benchmark of the segment format: size on disk, write, encode, read and list costs, on real
SeaQuest segments (50 agent steps of random play, full-resolution RGB). Prints a table:
figure | value | unit | setting.

    python -m bench.bench_segments [--segments 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np
import zstandard

from bench.dbs import make_atari_db
from lib.core.table import print_table
from lib.store.segment_writer import encode_segment, save_segment
from lib.store.segments import FORMAT_NAME, decode_segment, list_segments, read_segment

ROOT = Path(__file__).resolve().parents[1]


def per_item_ms(fn, items, repeat: int) -> float:
    """Median over ``repeat`` passes of the mean milliseconds per item."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for it in items:
            fn(it)
        times.append((time.perf_counter() - t0) / len(items) * 1000)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=64, help="real segments to record and measure")
    ap.add_argument("--repeat", type=int, default=3, help="passes per figure (the median is reported)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        rels = make_atari_db(src, args.segments, t=50, n_envs=8, seed=3)
        segs = [read_segment(src, r) for r in rels]
        k = iter(range(10**9))
        write_ms = per_item_ms(lambda s: save_segment(out / str(next(k)), s), segs, args.repeat)
        enc_ms = per_item_ms(encode_segment, segs, args.repeat)
        sizes = [(src / r).stat().st_size for r in rels]
        read_ms = per_item_ms(lambda r: read_segment(src, r), rels, args.repeat)
        # The previous format (numpy pickled its own arrays) goes through the strict path.
        old = [zstandard.ZstdCompressor(level=3).compress(pickle.dumps(_v1(s), protocol=5)) for s in segs]
        v1_ms = per_item_ms(decode_segment, old, args.repeat)
        list_ms = per_item_ms(lambda _: list_segments(src, warn=None), range(20), args.repeat)

    n = len(rels)
    raw_kb = segs[0].frames.nbytes / 1024
    rows = [
        ("segment size", f"{np.mean(sizes) / 1024:,.1f}", "KB/segment", f"mean of {n} (raw frames {raw_kb:,.0f} KB)"),
        ("segment write", f"{write_ms:.2f}", "ms/segment", "plain record + pickle + zstd-3 + fsync + rename"),
        ("segment encode", f"{enc_ms:.2f}", "ms/segment", "plain record + pickle + zstd-3 only"),
        ("segment read", f"{read_ms:.2f}", "ms/segment", "read_segment: checks + read + zstd + unpickle + rebuild"),
        ("segment read, format 1", f"{v1_ms:.2f}", "ms/segment", "decode of the previous format (strict path)"),
        ("DB listing", f"{list_ms / n * 1000:.1f}", "ms/1,000 segments", f"scan_db of {n} segments"),
    ]  # fmt: skip
    print_table("bench_segments (the segment DB)", rows)


def _v1(seg) -> dict:
    """A segment as the previous version pickled it: numpy arrays inside the dict."""
    return {
        "format": FORMAT_NAME,
        "version": 1,
        "frames": seg.frames,
        "actions": seg.actions,
        "rewards": seg.rewards,
        "dones": seg.dones,
        "game_over": seg.game_over,
        "lives": seg.lives,
        "env_id": seg.env_id,
        "action_meanings": list(seg.action_meanings or ()),
        "env_index": seg.env_index,
        "step": seg.step,
        "checkpoint": seg.checkpoint,
        "time": seg.time,
        "meta": {},
    }


if __name__ == "__main__":
    main()
