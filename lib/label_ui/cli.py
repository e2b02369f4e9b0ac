"""``02_label_ui.py``'s main: parse arguments, then oracle-label (or follow the DBs), or serve the
page. Free of NiceGUI imports, so bad input and ``--oracle`` answer at once."""

from __future__ import annotations

import sys
from dataclasses import fields

from lib.core.errors import EXIT_INTERRUPTED, UserError, fail
from lib.core.signals import SignalStop
from lib.label_ui.config import LabelConfig, parse_label_config
from lib.label_ui.oracle import FollowSettings, OracleSettings, OracleSummary, oracle_follow, oracle_label_db
from lib.store.labels import LABEL_NAMES


def run_oracle(cfg: LabelConfig) -> None:
    """Label ``cfg.oracle`` new pairs (picked by ``cfg.sampling``) of each DB with the synthetic
    teacher; print a summary."""
    assert cfg.oracle is not None
    for db in cfg.dbs:
        s = oracle_label_db(db, cfg.oracle, cfg.seed, _oracle_settings(cfg))
        short = f" (only {s.labeled} unlabeled pairs were left)" if s.labeled < s.requested else ""
        print(_summary_line(cfg, s, short))


ORACLE_FLAGS = {"noise": "teacher_noise", "ties": "teacher_ties"}  # OracleSettings fields named otherwise here


def _oracle_settings(cfg: LabelConfig) -> OracleSettings:
    """The one settings object ``--oracle`` and ``--follow`` both label by: each of its fields from
    the flag of the same name (``ORACLE_FLAGS``: the two named after the teacher)."""
    return OracleSettings(**{f.name: getattr(cfg, ORACLE_FLAGS.get(f.name, f.name)) for f in fields(OracleSettings)})


def _summary_line(cfg: LabelConfig, s: OracleSummary, short: str) -> str:
    counts = ", ".join(f"{LABEL_NAMES[v]} {s.counts.get(v, 0)}" for v in (1, 2, 0, -1))
    bad = f"; skipped {s.skipped_unreadable} unreadable segment(s)" if s.skipped_unreadable else ""
    how = f", {cfg.sampling} pairs" if cfg.sampling != "random" else ""
    how += f", {cfg.recent} newest segments" if cfg.recent else ""
    got = f"{s.labeled} oracle labels ({cfg.teacher} teacher{how}) in {s.seconds:.1f} s{short}"
    return f"{s.db}: {got}: {counts}{bad} -> {s.db}/labels.jsonl"


def run_follow(cfg: LabelConfig) -> int:
    """``--oracle N --follow``: label as clips appear until N labels per DB, Ctrl-C or SIGTERM.
    Returns the exit status: 0 when done or stopped by SIGTERM, 130 after Ctrl-C."""
    assert cfg.oracle is not None
    follow = FollowSettings(cfg.oracle, cfg.schedule, cfg.label_rate, cfg.poll)
    with SignalStop() as stop:
        summaries = oracle_follow(
            list(cfg.dbs), follow, _oracle_settings(cfg), cfg.seed, stop, log=lambda line: print(line, flush=True)
        )
    ended = f" (stopped by {stop.signal})" if stop.signal else ""
    for s in summaries:
        print(_summary_line(cfg, s, ended), flush=True)
    return EXIT_INTERRUPTED if stop.signal == "SIGINT" else 0


def main(argv: list[str] | None = None) -> None:
    """Entry point; a UserError ends in ``error: <message>`` and exit status 2."""
    try:
        cfg = parse_label_config(argv)
        if cfg.oracle is not None and cfg.follow:
            code = run_follow(cfg)
            if code:
                raise SystemExit(code)
            return
        if cfg.oracle is not None:
            run_oracle(cfg)
            return
        from lib.label_ui.server import serve  # NiceGUI is imported only to serve

        serve(cfg)
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:  # a second Ctrl-C while following: every label written is whole
        print("interrupted", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
