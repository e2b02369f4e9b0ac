"""lib/models/policy.py's file conventions: which best checkpoint stands for a run."""

from __future__ import annotations

from pathlib import Path

from lib.models.policy import best_checkpoint, best_checkpoint_figures, best_checkpoint_name, policy_file


def test_best_checkpoint_is_the_highest_step_even_past_nine_digits(tmp_path: Path) -> None:
    """The name pads the step to 9 digits; a run past 999,999,999 steps (experiments.round --scale
    1000 reaches it) makes a 10-digit name that sorts before 9-digit ones as text."""
    names = [best_checkpoint_name(s, sc, 700) for s, sc in ((999_999_872, 500.0), (1_000_000_128, 510.0))]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "best_notes.pt").write_bytes(b"")  # not a name 01_a2c.py writes: not a candidate
    assert best_checkpoint(tmp_path) == tmp_path / names[1]
    assert policy_file(tmp_path) == tmp_path / names[1]


def test_a_best_checkpoints_name_gives_back_the_evaluation_that_saved_it() -> None:
    assert best_checkpoint_figures(best_checkpoint_name(480_128, 412.34, 1529.6)) == (480_128, 412.3, 1530.0)
    assert best_checkpoint_figures(Path("saves/pong") / best_checkpoint_name(1_000_000_128, -20.5, 800)) == (
        1_000_000_128,
        -20.5,
        800.0,
    )
    assert best_checkpoint_figures("best_notes.pt") is None and best_checkpoint_figures("last.pt") is None
