"""``experiments.compare_arms``: every fine-tune of a seed's rounds on one picture, from real
TensorBoard event files; v0 is left out, each arm once, and a missing directory is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from experiments.compare_arms import arm_runs, figure, label, main
from lib.core.errors import UserError


def _run(tb: Path, name: str, scores: list[float], stamp: str = "20261127-000000", learned: bool = False) -> None:
    with SummaryWriter(str(tb / f"{name}__a2c__seaquest__s1__{stamp}")) as w:
        for k, v in enumerate(scores, start=1):
            w.add_scalar("eval/score_mean", v, k * 100_000)
            w.add_scalar("finetune/kl_to_start", 0.01 * k, k * 100_000)
            if learned:  # only a fine-tune on a learned reward has a learned return
                w.add_scalar("finetune/learned_return", v / 10, k * 100_000)


def test_every_arm_of_a_seed_is_drawn_once_and_summarised(tmp_path: Path, capsys) -> None:
    tb = tmp_path / "tb"
    _run(tb, "round-v0", [100, 200])
    _run(tb, "round-control-r1", [300, 340, 380, 420])
    _run(tb, "round-control-r1", [300], stamp="20261127-010000")  # a resumed run's second directory
    _run(tb, "round-rlhf-score-100-death100-ftrewardscale0.05rewardnormlabels-r1", [400, 200, 100, 50])
    assert arm_runs(tb) == ["round-control-r1", "round-rlhf-score-100-death100-ftrewardscale0.05rewardnormlabels-r1"]
    assert label(arm_runs(tb)[1]) == "rlhf-death100-std0.05+labels"
    main(["--out", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert (tmp_path / "arms.png").stat().st_size > 10_000
    # the mean of the evaluations from half the steps on (200k..400k), and the last one
    rlhf = "round-rlhf-score-100-death100-ftrewardscale0.05rewardnormlabels-r1"
    assert f"{rlhf}: mean eval score from half-way on 117, last 50" in out


def test_no_tensorboard_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no TensorBoard directory"):
        main(["--out", str(tmp_path / "nothing")])


def test_an_arm_has_one_colour_in_every_panel_also_where_another_has_no_curve(tmp_path: Path) -> None:
    """The control has no learned return: the rlhf arm's curve there is still rlhf's colour, not
    the first colour of the cycle (the control's in the other panels)."""
    import matplotlib.pyplot as plt

    tb = tmp_path / "tb"
    _run(tb, "round-control-r1", [300, 340])
    _run(tb, "round-rlhf-score-100-death100-ftkl1-r1", [400, 200], learned=True)
    fig, _ = figure(tb)
    score, learned = fig.axes[0], fig.axes[1]
    colour = {line.get_label(): line.get_color() for line in score.lines}
    assert len(set(colour.values())) == 2
    assert [line.get_label() for line in learned.lines] == ["rlhf-death100-ftkl1"]
    assert learned.lines[0].get_color() == colour["rlhf-death100-ftkl1"]
    plt.close(fig)
