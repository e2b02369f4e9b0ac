"""``02_label_ui.py``'s main: parse arguments, then oracle-label and exit, or serve the page.

Kept free of NiceGUI imports so that bad input and ``--oracle`` answer at once."""

from __future__ import annotations

from lib.errors import UserError, fail
from lib.label_ui.config import LabelConfig, parse_config
from lib.labels import LABEL_NAMES
from lib.oracle import oracle_label_db


def run_oracle(cfg: LabelConfig) -> None:
    """Label ``cfg.oracle`` new pairs (picked by ``cfg.sampling``) of each DB with the synthetic
    teacher; print a summary."""
    assert cfg.oracle is not None
    for db in cfg.dbs:
        s = oracle_label_db(
            db,
            cfg.oracle,
            cfg.seed,
            cfg.teacher,
            cfg.teacher_noise,
            cfg.teacher_ties,
            sampling=cfg.sampling,
            reward=cfg.reward,
            pool=cfg.pool,
        )
        counts = ", ".join(f"{LABEL_NAMES[v]} {s.counts.get(v, 0)}" for v in (1, 2, 0, -1))
        short = f" (only {s.labeled} unlabeled pairs were left)" if s.labeled < s.requested else ""
        bad = f"; skipped {s.skipped_unreadable} unreadable segment(s)" if s.skipped_unreadable else ""
        how = f", {cfg.sampling} pairs" if cfg.sampling != "random" else ""
        got = f"{s.labeled} oracle labels ({cfg.teacher} teacher{how}) in {s.seconds:.1f} s{short}"
        print(f"{db}: {got}: {counts}{bad} -> {db}/labels.jsonl")


def main(argv: list[str] | None = None) -> None:
    """Entry point; a UserError ends in ``error: <message>`` and exit status 2."""
    try:
        cfg = parse_config(argv)
        if cfg.oracle is not None:
            run_oracle(cfg)
            return
        from lib.label_ui.server import serve  # NiceGUI is imported only to serve

        serve(cfg)
    except UserError as e:
        fail(str(e))
