"""Stage 1's ``--resume`` and its checkpoint directory, on the fake game of ``test_a2c_loop`` (a whole
run in about a second): what a ``last.pt`` may hand the optimiser, which schedule and which settings a
resumed run goes on with, and that one live run holds its directory."""

from __future__ import annotations

import copy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_a2c_loop import FakeVec, config

import lib.a2c.config as a2c_config
import lib.a2c.train as a2c
from lib.a2c.run import _optimiser
from lib.core.errors import UserError
from lib.models.policy import AtariA2C

ROOT = Path(__file__).resolve().parents[1]


def _last(tmp_path: Path, **kw) -> tuple[Path, dict]:
    """A finished run of 200 steps (kw: other settings) and its last.pt, loaded."""
    assert a2c.train(config(tmp_path, max_steps=200, **kw), make_env=FakeVec) == 0
    path = tmp_path / "saves" / "last.pt"
    return path, torch.load(path, weights_only=True)


def _resume_refused(tmp_path: Path, make_env: type = FakeVec, **kw) -> str:
    """The one line a resume of the run in ``tmp_path`` (kw: its settings) is refused with."""
    with pytest.raises(UserError) as e:
        a2c.train(config(tmp_path, resume=True, **{"max_steps": 400, **kw}), make_env=make_env)
    assert "\n" not in str(e.value)
    return str(e.value)


# --- the optimiser's state: checked before the fused kernel sees it ------------------------------

IN_A_CHILD = """
import sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from test_a2c_loop import FakeVec, config
import lib.a2c.train as a2c
from lib.core.errors import run_cli
cfg = config(Path(sys.argv[2]), max_steps=int(sys.argv[3]), resume=sys.argv[4] == "resume")
run_cli(lambda: a2c.train(cfg, make_env=FakeVec))
"""


def _child(tmp_path: Path, max_steps: int, resume: bool, **kw) -> list[str]:
    """The command that trains the run in ``tmp_path`` on the fake game in a process of its own."""
    return [sys.executable, "-c", IN_A_CHILD, str(ROOT), str(tmp_path), str(max_steps), "resume" if resume else "new"]


@pytest.mark.parametrize("moment", ["exp_avg", "exp_avg_sq"])
def test_a_moment_of_another_shape_is_one_line_exit_2_not_a_crash(tmp_path: Path, moment: str) -> None:
    """A last.pt whose Adam moment is smaller than its parameter: the fused kernel would write past it
    (munmap_chunk(): invalid pointer, exit 134); the resume runs in a child so that it cannot take
    pytest down with it."""
    path, ck = _last(tmp_path)
    ck["optimizer"]["state"][0][moment] = torch.zeros(3)
    torch.save(ck, path)
    r = subprocess.run(_child(tmp_path, 400, resume=True), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert lines[0].startswith(f"error: checkpoint {path}: the optimizer's {moment} of parameter 0 is ")
    assert "(3,)" in lines[0] and "(32, 4, 8, 8)" in lines[0] and "does not fit this network" in lines[0]


def _state(ck: dict, i: int = 0) -> dict:
    return ck["optimizer"]["state"][i]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda ck: _state(ck).update(exp_avg=_state(ck)["exp_avg"].double()), "is torch.float64 (32, 4, 8, 8)"),
        (lambda ck: _state(ck).update(step=torch.tensor([1.0, 1.0])), "optimizer step of parameter 0 is Tensor"),
        (lambda ck: _state(ck).update(step=torch.tensor(1.5)), "optimizer step of parameter 0 is Tensor"),
        (lambda ck: _state(ck).update(step="1"), "optimizer step of parameter 0 is str"),
        (lambda ck: _state(ck).update(step=torch.tensor(7.0)), "different numbers of steps"),
        (lambda ck: [_state(ck, i).update(step=torch.tensor(7.0)) for i in ck["optimizer"]["state"]],
         "its optimizer has taken 7 steps but its counters say 1"),
        (lambda ck: _state(ck).update(exp_avg_sq=-_state(ck)["exp_avg_sq"] - 1),
         "exp_avg_sq of parameter 0 holds negative"),
        (lambda ck: _state(ck).update(max_exp_avg_sq=_state(ck)["exp_avg_sq"]), "not Adam's step and moments"),
        (lambda ck: _state(ck).pop("exp_avg"), "not Adam's step and moments"),
        (lambda ck: _state(ck).update(exp_avg=[0.0]), "exp_avg of parameter 0 is list"),
        (lambda ck: ck["optimizer"]["state"].pop(3), "moments for other parameters"),
        (lambda ck: ck["optimizer"]["state"].update({99: _state(ck)}), "moments for other parameters"),
        (lambda ck: ck["optimizer"]["param_groups"][0]["params"].pop(), "another set of parameters"),
        (lambda ck: ck["optimizer"].update(state=[]), "no per-parameter state"),
    ],
)  # fmt: skip
def test_every_moment_and_step_is_checked_against_its_parameter(tmp_path: Path, change, message: str) -> None:
    """Shape, dtype, a scalar integral step shared by all (and equal to the run's update count),
    no negative second moment, nothing but Adam's keys: anything else is one line naming the file."""
    path, ck = _last(tmp_path)
    change(ck)
    torch.save(ck, path)
    line = _resume_refused(tmp_path)
    assert line.startswith(f"checkpoint {path}") and message in line, line


# --- Adam's settings and the schedule: the run's own, never the file's ---------------------------


def test_a_resumed_run_steps_with_its_own_adam_settings_and_schedule(tmp_path: Path, monkeypatch) -> None:
    """A last.pt that says maximize, weight decay 0.5, betas (0, 0.5), lr 0.897 in its param group and
    a scheduler at -1e6 resumes with the book's Adam (fused) and the lr its checked fields give at its
    update count; that is also what it writes back."""
    path, ck = _last(tmp_path)
    group = ck["optimizer"]["param_groups"][0]
    group.update(maximize=True, weight_decay=0.5, betas=(0.0, 0.5), lr=0.897, initial_lr=0.897, eps=0.3)
    group.update(fused=None, foreach=None, amsgrad=False)  # as a per-tensor Adam's (before the fused one) says
    ck["scheduler"].update(last_epoch=-(10**6), base_lrs=[0.897], _last_lr=[0.897])
    torch.save(ck, path)
    seen = []
    real = a2c.build_run

    def spy(*args, **kw):
        run = real(*args, **kw)
        seen.append((dict(run.optimizer.param_groups[0]), run.scheduler.last_epoch))
        return run

    monkeypatch.setattr(a2c, "build_run", spy)
    assert a2c.train(config(tmp_path, max_steps=400, resume=True), make_env=FakeVec) == 0
    (first, epoch), updates = seen[0], ck["progress"]["train_steps"]
    book = dict(maximize=False, weight_decay=0.0, betas=(0.9, 0.999), eps=a2c_config.ADAM_EPS, fused=True)
    assert {k: first[k] for k in book} == book
    assert epoch == updates
    # the schedule ended at 200 (its own length): a new one to 400 (--max-steps), at this update count
    assert first["lr"] == pytest.approx(ck["lr"] * (1 - updates / (400 // a2c_config.BATCH_SIZE)))
    again = torch.load(path, weights_only=True)
    saved = again["optimizer"]["param_groups"][0]
    assert {k: saved[k] for k in book} == book and saved["initial_lr"] == ck["lr"] == a2c_config.LEARNING_RATE
    assert again["scheduler"]["last_epoch"] == again["progress"]["train_steps"] > updates


def test_resume_takes_the_moments_of_a_per_tensor_adam_into_the_fused_one(tmp_path: Path) -> None:
    """A last.pt written before the optimiser was torch's fused Adam resumes with its moments and step
    into the fused kernel (its param group, the one that steps, not only the defaults), and the next
    update is the one the per-tensor Adam would have made."""
    torch.manual_seed(0)
    net = AtariA2C((4, 84, 84), 6)
    old = torch.optim.Adam(net.parameters(), lr=7e-4, eps=a2c_config.ADAM_EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(old, lambda it: 1.0)
    grads = [torch.randn_like(p) for p in net.parameters()]
    for _ in range(3):
        for p, g in zip(net.parameters(), grads, strict=True):
            p.grad = g.clone()
        old.step()
    assert old.state_dict()["param_groups"][0]["fused"] is None
    resumed = copy.deepcopy(net)
    ck = {"optimizer": copy.deepcopy(old.state_dict()), "scheduler": sched.state_dict(), "lr": 7e-4}
    cfg = a2c_config.A2CConfig(name="x", save=str(tmp_path))
    optimizer, scheduler, _, _ = _optimiser(cfg, resumed, False, ck)
    assert optimizer.param_groups[0]["fused"] is True and scheduler.last_epoch == 3
    assert all(float(st["step"]) == 3 for st in optimizer.state.values())
    for p, q, g in zip(net.parameters(), resumed.parameters(), grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    old.step()
    optimizer.step()
    for p, q in zip(net.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


# --- the end of the lr schedule ------------------------------------------------------------------


def test_a_resume_at_the_end_of_its_schedule_is_refused_saying_how_to_go_on(tmp_path: Path) -> None:
    """A run of 200 steps decays its lr to 0 at step 200: resumed there with nowhere further to go
    it would train at lr 0 and call it finished (weights bit-identical)."""
    path, ck = _last(tmp_path)
    assert ck["lr_decay_steps"] == 200
    line = _resume_refused(tmp_path, max_steps=200)
    assert line == (
        f"--resume: {path} is at step 200, the end of its lr schedule (200 agent steps), where the lr is 0: give "
        f"--max-steps beyond 200 (its lr then decays to 0 there), or start a new run from it with -m {path} -n NEW"
    )
    assert torch.load(path, weights_only=True)["progress"] == ck["progress"]


def test_a_resume_past_the_end_of_its_schedule_decays_to_the_new_max_steps_and_says_so(tmp_path: Path, capsys) -> None:
    path, ck = _last(tmp_path)
    capsys.readouterr()
    assert a2c.train(config(tmp_path, max_steps=600, resume=True), make_env=FakeVec) == 0
    updates, lr = ck["progress"]["train_steps"], ck["lr"] * (1 - 1 / (600 // a2c_config.BATCH_SIZE))
    assert updates == 1
    out = capsys.readouterr().out
    assert (
        f"--resume: the lr decays to 0 at step 600 (--max-steps; its own ended at 200): lr {lr:.3g} at step 200" in out
    )
    again = torch.load(path, weights_only=True)
    assert again["lr_decay_steps"] == 600 and again["lr"] == ck["lr"]
    assert any(not torch.equal(v, again["state_dict"][k]) for k, v in ck["state_dict"].items())  # it learned


def test_lr_decay_steps_given_to_a_resume_is_its_new_schedule(tmp_path: Path, capsys) -> None:
    path, ck = _last(tmp_path, lr_decay_steps=10_000)
    line = _resume_refused(tmp_path, lr_decay_steps=128)
    assert line == f"--resume: --lr-decay-steps 128 ends the lr schedule before step 200, where {path} is"
    capsys.readouterr()
    assert a2c.train(config(tmp_path, max_steps=400, resume=True, lr_decay_steps=20_000), make_env=FakeVec) == 0
    assert (
        "--resume: the lr decays to 0 at step 20,000 (--lr-decay-steps; its own ran to 10,000)"
        in capsys.readouterr().out
    )
    assert torch.load(path, weights_only=True)["lr_decay_steps"] == 20_000
    # given again as recorded, or not at all: the run's own schedule, nothing said
    assert a2c.train(config(tmp_path, max_steps=600, resume=True, lr_decay_steps=20_000), make_env=FakeVec) == 0
    assert a2c.train(config(tmp_path, max_steps=800, resume=True), make_env=FakeVec) == 0
    assert "the lr decays" not in capsys.readouterr().out
    assert torch.load(path, weights_only=True)["lr_decay_steps"] == 20_000


# --- how the run learns: recorded, and gone on with ----------------------------------------------


class FramesVec(FakeVec):
    """The fake game with frames a reward model's conv layers take (48x48)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.frames = np.zeros((self.n_envs, 48, 48, 3), dtype=np.uint8)


FINE_TUNE = dict(reward_norm="window", kl_target=0.1, terminal="none", gamma=0.98)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> Path:
    """A fine-tune of 400 steps on a learned reward (-m v0 -r r.pt with FINE_TUNE's flags): a
    directory each test copies."""
    from lib.models.reward import RewardModel, reward_checkpoint, save_reward_checkpoint

    root = tmp_path_factory.mktemp("fine_tuned")
    torch.manual_seed(0)
    model = RewardModel(3, (48, 48, 3)).eval()
    ck = reward_checkpoint([model], "SeaquestNoFrameskip-v4", "seaquest", None, norm_mean=0.0, norm_std=1.0)
    save_reward_checkpoint(ck, root / "r.pt")
    v0 = config(root / "v0", max_steps=280, test_every=280, test_episodes=2)
    assert a2c.train(v0, make_env=FakeVec) == 0
    (best,) = (root / "v0" / "saves").glob("best_*.pt")
    cfg = config(root, model=str(best), reward=str(root / "r.pt"), max_steps=400, **FINE_TUNE)
    assert a2c.train(cfg, make_env=FramesVec) == 0
    return root


def _copy(fine_tuned: Path, tmp_path: Path) -> Path:
    shutil.copytree(fine_tuned, tmp_path, dirs_exist_ok=True)
    return tmp_path / "saves" / "last.pt"


def _resumed_run(tmp_path: Path, monkeypatch, **kw):
    """Resume the run in ``tmp_path`` to step 600 (kw: flags given again); returns its Run, with
    ``kl_coef`` as it was built (the controller moves it as the run goes)."""
    runs = []
    real = a2c.build_run

    def spy(*args, **kwargs):
        run = real(*args, **kwargs)
        runs.append((run, run.kl_coef))
        return run

    monkeypatch.setattr(a2c, "build_run", spy)
    assert a2c.train(config(tmp_path, resume=True, **{"max_steps": 600, **kw}), make_env=FramesVec) == 0
    ((run, kl_coef),) = runs
    run.kl_coef = kl_coef
    return run


def test_last_pt_records_how_the_run_learned_and_a_resume_goes_on_with_it(
    fine_tuned: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A fine-tune with -r MODEL --reward-norm window --kl-target 0.1 --terminal none, resumed without
    those flags, goes on learning from the model, with that norm, terminal and KL controller (was: the
    game score with a fixed KL of 1, and no word)."""
    from lib.a2c.reward_env import RewardModelWrapper

    path = _copy(fine_tuned, tmp_path)
    ck = torch.load(path, weights_only=True)
    reward = str((fine_tuned / "r.pt").resolve())  # recorded resolved: the copy names the same model
    assert ck["settings"]["reward"] == reward
    assert {k: ck["settings"][k] for k in FINE_TUNE} == FINE_TUNE
    capsys.readouterr()
    run = _resumed_run(tmp_path, monkeypatch)
    assert run.cfg.reward == reward and isinstance(run.env, RewardModelWrapper)
    assert {k: getattr(run.cfg, k) for k in FINE_TUNE} == FINE_TUNE
    assert run.kl_coef == pytest.approx(ck["kl_coef"]) and run.kl_coef != 1.0  # the controller's, moved
    out = capsys.readouterr().out
    said = f"--resume: goes on with what {path} records: --reward {reward} --reward-norm window --terminal none "
    assert said + "--kl-target 0.1 --gamma 0.98" in out
    # given again as they were: the same run, nothing contradicts
    run = _resumed_run(tmp_path, monkeypatch, max_steps=800, reward=reward, **FINE_TUNE)
    assert {k: getattr(run.cfg, k) for k in FINE_TUNE} == FINE_TUNE


@pytest.mark.parametrize(
    "given, words",
    [
        (dict(reward_norm="labels"), "learned with --reward-norm window; --reward-norm labels contradicts it"),
        (dict(kl_target=0.5), "learned with --kl-target 0.1; --kl-target 0.5 contradicts it"),
        (dict(gamma=0.9), "learned with --gamma 0.98; --gamma 0.9 contradicts it"),
        (dict(reward_scale=0.05), "learned with --reward-scale 1; --reward-scale 0.05 contradicts it"),
        (dict(reward_plus_score=True), "learned with no --reward-plus-score; --reward-plus-score contradicts it"),
        (dict(lr=1e-3), "learned with --lr 0.0007; --lr 0.001 contradicts it"),
        (dict(finetune=True), "learned with no --finetune; --finetune contradicts it"),
    ],
)
def test_a_flag_that_contradicts_how_the_run_learned_is_one_line(
    fine_tuned: Path, tmp_path: Path, given: dict, words: str
) -> None:
    path = _copy(fine_tuned, tmp_path)
    line = _resume_refused(tmp_path, FramesVec, **given)
    flag = words.split("; ")[1].split()[0]
    assert line == f"--resume: {path} {words}: resume without {flag}, or start a new run from it with -m {path} -n NEW"


def test_another_reward_model_is_a_contradiction(fine_tuned: Path, tmp_path: Path) -> None:
    path = _copy(fine_tuned, tmp_path)
    (tmp_path / "other.pt").write_bytes((fine_tuned / "r.pt").read_bytes())
    line = _resume_refused(tmp_path, FramesVec, reward=str(tmp_path / "other.pt"))
    assert line.startswith(f"--resume: {path} learned with --reward {(fine_tuned / 'r.pt').resolve()}; --reward ")


def test_a_last_pt_from_before_the_record_resumes_with_the_settings_as_given(
    fine_tuned: Path, tmp_path: Path, monkeypatch
) -> None:
    path = _copy(fine_tuned, tmp_path)
    ck = torch.load(path, weights_only=True)
    del ck["settings"]
    torch.save(ck, path)
    run = _resumed_run(tmp_path, monkeypatch)
    assert run.cfg.reward is None and run.cfg.terminal == "life" and run.cfg.kl_target is None  # as given
    assert torch.load(path, weights_only=True)["settings"]["reward"] is None  # the run as it went on, from now on
    line = _resume_refused(tmp_path, FramesVec, max_steps=800, reward=str(fine_tuned / "r.pt"))
    assert line.startswith(f"--resume: {path} learned with no --reward; --reward ")


@pytest.mark.parametrize(
    "record, words",
    [
        ({"gamma": "abc"}, "its recorded --gamma is str 'abc'"),
        ({"n_steps": 2.5}, "its recorded --n-steps is float 2.5"),
        ({"reward_plus_score": 1}, "its recorded --reward-plus-score is int 1"),
        ({"gamma": 5.0}, "records: --gamma must be in (0, 1], got 5.0"),
        ({"terminal": "game"}, "records: --terminal game was retired after commit"),
    ],
)
def test_a_crafted_record_of_settings_is_one_line(tmp_path: Path, record: dict, words: str) -> None:
    path, ck = _last(tmp_path)
    ck["settings"].update(record)
    torch.save(ck, path)
    line = _resume_refused(tmp_path)
    assert line.startswith(("checkpoint ", "--resume with what ")) and str(path) in line and words in line, line


# --- one live run per checkpoint directory -------------------------------------------------------


def _started(child: subprocess.Popen) -> None:
    """Wait until the child's run is built (it announces itself), so holds its directory."""
    for line in child.stdout:
        if line.startswith("A2C on "):
            return
    raise AssertionError(f"the child ended before its run started: {child.wait()}")


def test_a_live_run_holds_its_checkpoint_directory(tmp_path: Path) -> None:
    """While a run lives, a second run of its directory (--resume, --force, or new while it has no
    checkpoint yet) is refused in one line naming it, and writes nothing: was, the second trained to
    its end and the first then wrote its last.pt over the second's. Once it ends, the run resumes."""
    one, two = tmp_path / "one", tmp_path / "two"
    path, _ = _last(one)
    kept = sorted((p.name, p.read_bytes()) for p in path.parent.glob("*.pt"))
    live = subprocess.Popen(_child(one, 10**9, resume=True), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    new = subprocess.Popen(_child(two, 10**9, resume=False), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        _started(live)
        _started(new)
        for kw in (dict(resume=True), dict(force=True)):
            with pytest.raises(UserError) as e:
                a2c.train(config(one, max_steps=400, test_every=200, **kw), make_env=FakeVec)
            line = str(e.value)
            assert line.startswith(f"{one / 'saves'} is in use by another run (pid {live.pid} on "), line
            assert line.endswith(": wait until it ends, or pick another -n") and "\n" not in line
        with pytest.raises(UserError, match=f"^{two / 'saves'} is in use by another run \\(pid {new.pid} on "):
            a2c.train(config(two, max_steps=400, test_every=200), make_env=FakeVec)  # no checkpoint there yet
        assert sorted((p.name, p.read_bytes()) for p in path.parent.glob("*.pt")) == kept
    finally:
        for child in (live, new):
            child.send_signal(signal.SIGTERM)
            child.communicate(timeout=120)
    assert live.returncode == new.returncode == 0
    step = torch.load(path, weights_only=True)["progress"]["step"]
    assert step > 200  # the live run's own last.pt; and now the directory is free again
    assert a2c.train(config(one, max_steps=step + 200, resume=True), make_env=FakeVec) == 0
