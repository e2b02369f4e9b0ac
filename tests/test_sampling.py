"""Which pairs get asked (lib/label_ui/sampling.py, ``02_label_ui.py --sampling``): each mode picks what it
claims on a DB whose answer is known.

The reward models here are real checkpoints whose per-step prediction depends only on the action
(conv features weighted 0, the action's one-hot weighted c[a] into one hidden unit): a segment
that always takes action a has predicted return T * c[a], exactly."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from bench.dbs import SEAQUEST, action_model, write_action_db
from lib.core.errors import UserError
from lib.label_ui.oracle import OracleSettings, oracle_label_db
from lib.label_ui.sampling import SegmentBeliefs, choose_pairs, exploit_ranking, preference
from lib.label_ui.state import AppState, DbState
from lib.models.reward import RewardModel, load_reward_model, reward_checkpoint, save_reward_checkpoint
from lib.store.labels import Label, append_labels, load_labels, pair_key, read_label_log

ROOT = Path(__file__).resolve().parents[1]
T, SIZE, N_ACTIONS = 10, 64, 18


# predicted return per step of actions 0..7 under a one-member model, and the segments using them
VALUES = {0: 0.0, 1: 0.05, 2: 0.3, 3: 0.32, 4: 1.0, 5: 1.6, 6: 2.0, 7: 2.01}


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "db"
    return root, write_action_db(root, [(a, 0.0) for a in VALUES], T, SIZE)


def all_free(segs: list[str], taken: set) -> list[tuple[str, str]]:
    return [p for p in itertools.combinations(segs, 2) if pair_key(*p) not in taken]


def test_uncertain_takes_the_pairs_closest_to_even(db, tmp_path: Path) -> None:
    root, segs = db
    rm = load_reward_model(action_model(SIZE, tmp_path / "m.pt", [VALUES]))
    beliefs = SegmentBeliefs(rm, root)
    ret = {s: T * VALUES[a] for s, a in zip(segs, VALUES, strict=True)}
    taken = {pair_key(segs[6], segs[7])}  # the closest pair is labeled already
    got = choose_pairs(segs, taken, 3, np.random.default_rng(0), "uncertain", beliefs, pool=1000)
    by_gap = sorted(all_free(segs, taken), key=lambda p: abs(ret[p[0]] - ret[p[1]]))
    assert {pair_key(*p) for p in got} == {pair_key(*p) for p in by_gap[:3]}
    assert pair_key(segs[2], segs[3]) in {pair_key(*p) for p in got}  # |0.3 - 0.32| * 10 = 0.2
    p = preference(beliefs.get(segs[2]), beliefs.get(segs[3]))
    assert p.shape == (1,) and p[0] == pytest.approx(1 / (1 + math.exp(0.2)), abs=1e-5)
    random = choose_pairs(segs, taken, 3, np.random.default_rng(0), "random")
    assert {pair_key(*p) for p in random} != {pair_key(*p) for p in got}  # the mode matters


def test_disagree_takes_the_pairs_the_members_split_on(db, tmp_path: Path) -> None:
    root, segs = db
    # member 1 agrees with VALUES except that it ranks action 1 above everything
    other = {**VALUES, 1: 3.0}
    rm = load_reward_model(action_model(SIZE, tmp_path / "ens.pt", [VALUES, other]))
    assert rm.ensemble == 2
    beliefs = SegmentBeliefs(rm, root)
    got = choose_pairs(segs, set(), 4, np.random.default_rng(1), "disagree", beliefs, pool=1000)
    spread = {}
    for a, b in all_free(segs, set()):
        p = preference(beliefs.get(a), beliefs.get(b))
        spread[pair_key(a, b)] = float(p.var())
    best = sorted(spread, key=lambda k: -spread[k])[:4]
    assert {pair_key(*p) for p in got} == set(best)
    assert all(segs[1] in p for p in got)  # the pairs with the segment the members split on
    single = SegmentBeliefs(load_reward_model(action_model(SIZE, tmp_path / "one.pt", [VALUES])), root)
    with pytest.raises(UserError, match="ensemble"):
        choose_pairs(segs, set(), 2, np.random.default_rng(0), "disagree", single)


def test_exploits_puts_overrated_segments_first(tmp_path: Path) -> None:
    root = tmp_path / "ft"
    # (action, true reward per step): action 6 is predicted highest; the segment taking it earns
    # nothing, while action 4's segment earns the most
    specs = [(0, 0.0), (2, 0.5), (4, 2.0), (6, 0.0), (5, 1.0), (1, 0.0)]
    segs = write_action_db(root, specs, T, SIZE)
    beliefs = SegmentBeliefs(load_reward_model(action_model(SIZE, tmp_path / "m.pt", [VALUES])), root)
    views = {s: beliefs.get(s) for s in segs}
    ranking = exploit_ranking(views)
    # predicted returns 0, 3, 10, 20, 16, 0.5 against true 0, 5, 20, 0, 10, 0: z(pred) - z(true)
    # ranks them 3, 4, 5, 0, 1, 2 (segment 3: highest prediction, no reward; 2: the most reward)
    assert [r for r, _ in ranking] == [segs[i] for i in (3, 4, 5, 0, 1, 2)]
    assert ranking[0][1] == pytest.approx(2.3213, abs=1e-3)
    pairs = choose_pairs(segs, set(), 3, np.random.default_rng(0), "exploits", beliefs)
    assert [ranking[i][0] in pairs[i] for i in range(3)] == [True] * 3
    assert len({pair_key(*p) for p in pairs}) == 3


def test_exploits_needs_true_rewards(tmp_path: Path) -> None:
    root = tmp_path / "book"
    segs = write_action_db(root, [(0, 0.0), (4, 0.0), (6, 0.0)], T, SIZE)
    beliefs = SegmentBeliefs(load_reward_model(action_model(SIZE, tmp_path / "m.pt", [VALUES])), root)
    for s in segs:
        beliefs.get(s).true_return = None  # as a DB in the book's format has
    with pytest.raises(UserError, match="true rewards"):
        choose_pairs(segs, set(), 2, np.random.default_rng(0), "exploits", beliefs)


def test_a_model_of_other_frames_is_one_error(tmp_path: Path) -> None:
    root = tmp_path / "db"
    segs = write_action_db(root, [(0, 0.0), (1, 0.0)], T, SIZE)
    m = RewardModel(N_ACTIONS, (48, 48, 3))
    save_reward_checkpoint(reward_checkpoint([m.eval()], SEAQUEST, "seaquest", None), tmp_path / "small.pt")
    beliefs = SegmentBeliefs(load_reward_model(tmp_path / "small.pt"), root)
    with pytest.raises(UserError, match="48x48x3 frames"):
        beliefs.get(segs[0])


def test_oracle_labels_what_the_page_would_show(db, tmp_path: Path) -> None:
    root, segs = db
    model = action_model(SIZE, tmp_path / "m.pt", [VALUES])
    summary = oracle_label_db(root, 3, seed=0, settings=OracleSettings(sampling="uncertain", reward=model, pool=1000))
    assert summary.labeled == 3
    log = read_label_log(root)
    assert all(lab.extra["sampling"] == "uncertain" for lab in log)
    ret = {s: T * VALUES[a] for s, a in zip(segs, VALUES, strict=True)}
    by_gap = sorted(all_free(segs, set()), key=lambda p: abs(ret[p[0]] - ret[p[1]]))
    assert {lab.key for lab in log} == {pair_key(*p) for p in by_gap[:3]}
    # the page, from the same DB state, offers the next most uncertain pairs
    d = DbState.open(0, root)
    beliefs = [SegmentBeliefs(load_reward_model(model), root)]
    app = AppState([d], pairs=2, seed=0, sampling="uncertain", beliefs=beliefs, pool=1000)
    items = app.sample(2, np.random.default_rng(0), "tab", set())
    assert {it.key for it in items} == {pair_key(*p) for p in by_gap[3:5]}


def test_label_cli_sampling_flags(db, tmp_path: Path) -> None:
    root, segs = db
    model = action_model(SIZE, tmp_path / "m.pt", [VALUES])

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "02_label_ui.py"), "-d", str(root), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    p = run("--oracle", "2", "--sampling", "uncertain")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--reward MODEL" in p.stderr
    p = run("--oracle", "2", "--sampling", "uncertain", "--reward", str(tmp_path / "nope.pt"))
    assert p.returncode == 2 and "no such file" in p.stderr
    p = run("--oracle", "2", "--sampling", "disagree", "--reward", str(model))
    assert p.returncode == 2 and "ensemble" in p.stderr and "Traceback" not in p.stderr
    append_labels(root, [Label(segs[6], segs[7], 1, source="human")])
    p = run("--oracle", "2", "--sampling", "uncertain", "--reward", str(model), "--seed", "0")
    assert p.returncode == 0, p.stderr
    assert "2 oracle labels (score teacher, uncertain pairs)" in p.stdout
    new = [lab for lab in load_labels(root).values() if lab.source == "oracle"]
    assert {lab.key for lab in new} == {pair_key(segs[2], segs[3]), pair_key(segs[0], segs[1])}


@pytest.fixture(scope="module")
def rare_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], str]:
    """Real SeaQuest clips: six of a sub parked at the surface with a full gauge (alike), and one
    of a sub deep down with a low, red gauge and a diver aboard (the odd one)."""
    import dataclasses

    from test_seaquest import CLIMB_START, PARKED_PLAN, STAY_PLAN

    from bench.dbs import cut, play_plan
    from lib.store.segment_writer import save_segment

    root = tmp_path_factory.mktemp("rare") / "db"
    parked, stay = play_plan(PARKED_PLAN), play_plan(STAY_PLAN)
    clips = [cut(parked, 40 + 10 * k, 90 + 10 * k) for k in range(6)]
    clips.append(cut(stay, CLIMB_START - 26, CLIMB_START + 24))
    rels = [
        save_segment(root, dataclasses.replace(c, env_index=i), fsync=False).relative_to(root).as_posix()
        for i, c in enumerate(clips)
    ]
    return root, rels, rels[-1]


def test_rare_asks_first_about_the_clip_that_looks_least_like_the_others(rare_db) -> None:
    from lib.label_ui.sampling import SegmentLooks, block_mean, rare_ranking

    root, rels, odd = rare_db
    assert block_mean(np.arange(24.0).reshape(4, 6), 2).tolist() == [[3.5, 5.5, 7.5], [15.5, 17.5, 19.5]]
    looks = SegmentLooks(root)
    rarity = looks.rarity(rels)
    assert max(rarity, key=rarity.get) == odd and len(rarity) == 7
    assert rare_ranking(rels, set(), looks)[0] == odd
    rng = np.random.default_rng(0)
    pairs = choose_pairs(rels, set(), 3, rng, "rare", looks=looks)
    assert len(pairs) == 3 and odd in pairs[0] and len({pair_key(*p) for p in pairs}) == 3
    # Once the odd clip has a label, the least-labelled come first: a clip never labelled leads.
    taken = {pair_key(*pairs[0])}
    ranking = rare_ranking(rels, taken, looks)
    assert set(ranking[-2:]) == set(pairs[0]) and ranking[-2] == odd  # labelled once: last, the rarer first
    again = choose_pairs(rels, taken, 1, rng, "rare", looks=looks)
    assert ranking[0] in again[0]
    with pytest.raises(ValueError, match="looks"):
        choose_pairs(rels, set(), 1, rng, "rare")


def test_oracle_with_rare_labels_the_odd_clip_first(rare_db, tmp_path: Path) -> None:
    import shutil

    root, _, odd = rare_db
    db = tmp_path / "db"
    shutil.copytree(root, db)
    summary = oracle_label_db(db, 1, seed=0, settings=OracleSettings(teacher="surface", sampling="rare"))
    (lab,) = read_label_log(db)
    assert summary.labeled == 1 and odd in (lab.sample1, lab.sample2) and lab.extra["sampling"] == "rare"
    # The page (the looks computed before serving) offers the least-labelled rarest next: not the odd one.
    from lib.label_ui.sampling import SegmentLooks, rare_ranking
    from lib.label_ui.server import rare_view

    d = DbState.open(0, db)
    app = AppState([d], pairs=2, seed=0, sampling="rare", looks=rare_view([d]))
    items = app.sample(2, np.random.default_rng(0), "tab", set())
    ranking = rare_ranking(d.usable_segments(), {lab.key}, SegmentLooks(db))
    assert len(items) == 2 and ranking[0] in (items[0].a, items[0].b) and ranking[1] in (items[1].a, items[1].b)
    assert lab.key not in {it.key for it in items}


class OtherTabFirst:
    """``AppState.lock`` for a tab that, the first time it lets go of the lock (it has read what
    is reserved), is overtaken by a second tab that picks its whole list: two tabs opening at
    the same moment, interleaved the worst way."""

    def __init__(self, app: AppState):
        self.app, self.inner, self.other, self.fired = app, threading.Lock(), [], False

    def __enter__(self) -> None:
        self.inner.acquire()

    def __exit__(self, *exc) -> None:
        self.inner.release()
        if not self.fired:
            self.fired = True
            self.other.extend(self.app.sample(6, np.random.default_rng(0), "other", set()))


def test_two_tabs_opening_at_once_both_get_full_lists_of_different_pairs(db) -> None:
    root, segs = db  # 8 segments: 28 pairs, room for two lists of 6
    app = AppState([DbState.open(0, root)], pairs=6, seed=0)
    app.lock = lock = OtherTabFirst(app)
    # the same generator seed as the other tab: it picks the same pairs first, all of them taken
    mine = app.sample(6, np.random.default_rng(0), "tab", set())
    theirs = lock.other
    assert len(theirs) == 6 and len(mine) == 6
    assert not {it.key for it in mine} & {it.key for it in theirs}
    assert {app.reserved[(0, it.key)] for it in mine} == {"tab"}
    assert {app.reserved[(0, it.key)] for it in theirs} == {"other"}
