"""experiments.lab_a2c: stage 1 with the lab's hooks. The oracle arm's reward source (the true score
through -r's path), the low-gauge KL readout (finetune/kl_low_gauge) through a real run, and stage
1's one line for the flag that moved here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_reward_wrapper import SEAQUEST, FakeVec

from experiments.lab_a2c import LowGauge, TrueScore, lab_hooks, main
from lib.a2c.config import A2CConfig
from lib.a2c.reward_env import RewardModelWrapper
from lib.core.errors import UserError
from lib.models.reward import RewardModel, reward_checkpoint, save_reward_checkpoint
from lib.models.reward_path import RewardPath

ROOT = Path(__file__).resolve().parent.parent


def test_the_oracle_sends_the_true_score_through_the_same_path(tmp_path: Path) -> None:
    """The learner's reward is the true score, normalised with the score's stats stored beside the
    model's (labels), clipped and scaled as the model's would be; one line without those stats."""
    torch.manual_seed(0)
    ck = reward_checkpoint([RewardModel(18, (48, 48, 3)).eval()], SEAQUEST, "seaquest", None, 0.0, 1.0)
    ck.update(score_mean=0.25, score_std=0.5)
    path = tmp_path / "r.pt"
    save_reward_checkpoint(ck, path)
    env = FakeVec(n_envs=3)
    w = RewardModelWrapper(env, path, path=RewardPath(clip=1.0, scale=0.1, norm="labels"), source=TrueScore())
    st = w.step(np.zeros(3, np.int64))
    np.testing.assert_array_equal(st.pred_rewards, st.true_rewards)  # the score, not the model
    np.testing.assert_allclose(st.rewards, 0.1 * np.clip((1.0 - 0.25) / 0.5, -1, 1), rtol=1e-6)
    # the running norm of a source starts with no prior: the model's stats say nothing of the score
    running = RewardModelWrapper(FakeVec(n_envs=3), path, source=TrueScore())
    assert running.norm.prior is None
    del ck["score_mean"], ck["score_std"]
    save_reward_checkpoint(ck, path)
    with pytest.raises(UserError, match="stores no statistics of the true score"):
        RewardModelWrapper(env, path, path=RewardPath(norm="labels"), source=TrueScore())


def test_low_gauge_marks_the_frames_with_a_low_gauge_and_none_of_another_game() -> None:
    from lib.atari.seaquest import low_gauge

    frames = np.zeros((2, 210, 160, 3), np.uint8)
    assert np.array_equal(LowGauge()(frames), low_gauge(frames))
    assert not LowGauge()(np.zeros((2, 84, 84, 3), np.uint8)).any()
    assert lab_hooks(A2CConfig(name="x", env="BreakoutNoFrameskip-v4")).marks is None
    assert lab_hooks(A2CConfig(name="x")).marks is not None
    with pytest.raises(UserError, match="give -r in --a2c-args"):
        lab_hooks(A2CConfig(name="x"), reward_oracle=True)


def test_stage_1_names_where_the_oracle_went() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "01_a2c.py"), "-n", "x", "-r", "r.pt", "--reward-oracle"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "--reward-oracle moved to the lab: python -m experiments.lab_a2c --reward-oracle" in lines[0]


def scalar_tags(runs: Path) -> set[str]:
    """The scalar tags of the one TensorBoard run under ``runs``."""
    (run,) = {p.parent for p in runs.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(run))
    acc.Reload()
    return set(acc.Tags()["scalars"])


@pytest.mark.slow
def test_a_lab_fine_tune_logs_the_low_gauge_kl_and_is_paid_the_score(tmp_path: Path) -> None:
    """A fine-tune through the lab: finetune/kl_low_gauge in its TensorBoard (SeaQuest's gauge runs
    low within a few hundred steps of play), the score through -r's path; 01_a2c.py's own run of the
    same flags logs no such readout."""
    from lib.atari.envs import AtariVec
    from lib.models.policy import AtariA2C, policy_checkpoint
    from lib.store.checkpoints import atomic_torch_save

    env = AtariVec(SEAQUEST, n_envs=1)
    torch.manual_seed(0)
    atomic_torch_save(
        policy_checkpoint(AtariA2C(env.obs_shape, env.n_actions), env.env_id, env.game, env.action_meanings),
        tmp_path / "v0.pt",
    )
    torch.manual_seed(1)
    ck = reward_checkpoint([RewardModel(env.n_actions).eval()], env.env_id, env.game, env.action_meanings, 0.0, 1.0)
    env.close()
    save_reward_checkpoint(ck, tmp_path / "r.pt")
    flags = f"-m {tmp_path / 'v0.pt'} -r {tmp_path / 'r.pt'} --finetune --envs 8 --max-steps 4000 --test-every 0"

    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["--reward-oracle", "--a2c-args", f"-n lab --runs-dir runs {flags}"]) == 0
    finally:
        os.chdir(cwd)
    lab = scalar_tags(tmp_path / "runs")
    assert {"finetune/kl_to_start", "finetune/kl_low_gauge"} <= lab, lab
    r = subprocess.run(
        [sys.executable, str(ROOT / "01_a2c.py"), "-n", "plain", "--runs-dir", "runs2", *flags.split()],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    plain = scalar_tags(tmp_path / "runs2")
    assert "finetune/kl_to_start" in plain and not any(t.startswith("finetune/kl_low") for t in plain)


@pytest.mark.slow
def test_a_run_resumes_paid_as_it_ran(tmp_path: Path) -> None:
    """--resume goes on with the reward source the run was paid (recorded in its checkpoints): a lab
    oracle run is not resumed by 01_a2c.py, a run on -r's predictions not by the lab's oracle, and a
    last.pt from before the oracle moved (its settings say reward_oracle) resumes only through the lab."""
    from lib.atari.envs import AtariVec
    from lib.models.policy import AtariA2C, policy_checkpoint
    from lib.store.checkpoints import atomic_torch_save

    env = AtariVec(SEAQUEST, n_envs=1)
    torch.manual_seed(0)
    v0 = policy_checkpoint(AtariA2C(env.obs_shape, env.n_actions), env.env_id, env.game, env.action_meanings)
    atomic_torch_save(v0, tmp_path / "v0.pt")
    ck = reward_checkpoint([RewardModel(env.n_actions).eval()], env.env_id, env.game, env.action_meanings, 0.0, 1.0)
    env.close()
    save_reward_checkpoint({**ck, "score_mean": 0.0, "score_std": 1.0}, tmp_path / "r.pt")
    common = f"-r {tmp_path / 'r.pt'} --envs 2 --test-every 0"

    def lab(name: str, steps: int, *extra: str) -> int:
        words = f"-n {name} {common} --max-steps {steps} " + " ".join(extra)
        return main(["--reward-oracle", "--a2c-args", words])

    def stage1(name: str, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(ROOT / "01_a2c.py"), "-n", name, *common.split(), "--max-steps", str(steps), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)

    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert lab("oracle", 32, "-m", str(tmp_path / "v0.pt"), "--finetune") == 0
        last = tmp_path / "saves" / "oracle" / "last.pt"
        assert torch.load(last, weights_only=True)["reward_source"] == TrueScore.name
        r = stage1("oracle", 64, "--resume")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"was paid {TrueScore.name} through -r's path, this run would be paid -r's predictions" in r.stderr
        assert lab("oracle", 64, "--resume") == 0  # the way it ran

        assert stage1("model", 32).returncode == 0
        with pytest.raises(UserError, match="was paid -r's predictions through -r's path, this run would be paid"):
            lab("model", 64, "--resume")

        old = torch.load(last, weights_only=False)  # as --reward-oracle recorded itself before it moved
        del old["reward_source"]
        old["settings"]["reward_oracle"] = True
        torch.save(old, last)
        r = stage1("oracle", 96, "--resume")
        assert r.returncode == 2 and f"was paid {TrueScore.name}" in r.stderr, r.stderr
        assert lab("oracle", 96, "--resume") == 0
    finally:
        os.chdir(cwd)
