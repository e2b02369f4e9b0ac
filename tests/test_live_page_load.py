"""The label page while a live round's other stages run beside it (issue 31, item 7): the real
server (``02_label_ui.py``) in headless Chromium, the real trainer (``03_reward_train.py --follow``)
and a recording A2C (``01_a2c.py --db-path``) as subprocesses on the same DB. A person's answers
keep working: each brings the next pair, the pairs come to include clips the agent recorded while
the page ran, the answers land in ``labels.jsonl``, and the trainer makes a version from them.
Functional only: how fast the page answers beside them is ``bench.bench_label_ui --only live``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.dbs import make_atari_db
from bench.label_harness import Beside, LabelServer, answer_and_wait, chromium, shown_pair, wait_shown
from lib.label_ui.oracle import oracle_label_db
from lib.store.labels import pair_key
from lib.store.segments import list_segments

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SEEDED = 6  # oracle labels before the start: the trainer's first version needs a few
ANSWERS = 6  # two lists of 3 pairs: the second is drawn after the page looked for new clips
KEYS = "120"  # #1 better, #2 better, equal: each a new answer for the trainer


def label_lines(db: Path) -> list[dict]:
    return [json.loads(x) for x in (db / "labels.jsonl").read_text().splitlines()]


def temp_files(root: Path) -> list[Path]:
    """What an atomic write or a killed encode would leave: ``.NAME.*.tmp``, ``.tmp-*.mp4``."""
    return sorted(p for p in root.rglob(".*") if p.is_file() and ".tmp" in p.name)


def test_answers_keep_working_while_the_trainer_and_a_recording_agent_run_beside(tmp_path: Path) -> None:
    db = tmp_path / "db"
    make_atari_db(db, 8, t=50, n_envs=4)  # real SeaQuest: step counters 50 and 100 in envs 00-03
    assert oracle_label_db(db, SEEDED, seed=0).labeled == SEEDED
    before = set(list_segments(db))
    # The page's pairs come from the 4 newest segments (--recent), 3 to a list. The first list is of
    # the DB's own; the page looks at the DB again when a list ends, and by then the agent (whose step
    # counters go on from 100) has recorded the 4 newest: every later pair is of its clips.
    args = ("-d", str(db), "--cache-dir", str(tmp_path / "clips"), "--pairs", "3", "--recent", "4", "--seed", "0")
    server = LabelServer(*args, timeout=120)
    beside = None
    try:
        with chromium() as page:
            page.goto(f"{server.url}/label")
            wait_shown(page, 1, timeout_ms=60_000)
            beside = Beside(db, tmp_path / "live", envs=2, record_prob=0.05, retrain_every=3)
            recorded = lambda: set(list_segments(db)) - before  # noqa: E731
            beside.wait_for("4 segments recorded by the A2C", lambda: len(recorded()) >= 4, timeout=180)
            shown = [shown_pair(page)]
            for i in range(ANSWERS):
                beside.check_running()
                answer_and_wait(page, KEYS[i % len(KEYS)])  # the next pair within 20 s, or it fails here
                shown.append(shown_pair(page))
            answered = shown[:-1]
            assert len({pair_key(*p) for p in answered}) == ANSWERS, answered
            new = recorded()
            assert all(a not in new and b not in new for a, b in answered[:3]), answered  # the page's first list
            assert all(a in new and b in new for a, b in answered[3:]), (answered, sorted(new))
            # The answers land in labels.jsonl, after the oracle's, in the order given.
            deadline = time.monotonic() + 10
            while len(label_lines(db)) < SEEDED + ANSWERS and time.monotonic() < deadline:
                time.sleep(0.05)
            human = [x for x in label_lines(db) if x.get("source") == "human"]
            assert [(x["sample1"], x["sample2"]) for x in human] == answered
            assert [x["label"] for x in human] == [int(KEYS[i % len(KEYS)]) for i in range(ANSWERS)]
            # The trainer makes a version that learnt from them while the page is in use.
            beside.wait_for(
                "reward model version trained on the page's answers",
                lambda: any(v.get("labels", 0) > SEEDED for v in beside.versions()),
                timeout=120,
            )
            answer_and_wait(page, "1")  # and the page still answers
    finally:
        out = server.stop()
        codes = beside.stop() if beside is not None else {}
    # Every process ended on Ctrl-C: the server, the trainer (exit 130) and the A2C (exit 0).
    assert server.proc.returncode == 0, out[-2000:]
    assert codes == {"trainer": 130, "a2c": 0}, (codes, beside.log("trainer")[-2000:], beside.log("a2c")[-2000:])
    assert beside.stopped_by == {"trainer": "SIGINT", "a2c": "SIGINT"}
    assert "stopped by SIGINT" in beside.log("trainer")
    assert "interrupted at step" in beside.log("a2c") and beside.a2c_final_step() > 0
    versions = beside.versions()
    assert versions[0]["installed"] and (beside.out / "reward-x.pt").is_file()
    assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
    assert temp_files(tmp_path) == []
