"""A2C on Atari (the book's settings), optionally recording segments or learning from a reward
model. Reads top to bottom: the loss, one learner step (``Learner``), the progress log, and
``train``, the loop. Unlike SB3, ``train`` is the whole loop and ``Learner.learn`` one gradient
step. Settings: ``lib/a2c/config.py``; command line: ``lib/a2c/cli.py``; the run's state and files:
``lib/a2c/run.py``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lib.a2c.config import BATCH_SIZE, A2CConfig
from lib.a2c.distributed import Dist, RankLost, env_uniforms
from lib.a2c.experience import BOOT_FINAL, BOOT_NEXT, NStepCollector, Transitions
from lib.a2c.run import (
    GameStats,
    Hooks,
    NonFiniteError,
    Run,
    autocast,
    build_run,
    evaluate_and_save,
)
from lib.atari.envs import VecStep
from lib.atari.saved_states import vec_env
from lib.core.signals import SignalStop
from lib.core.stats import StepCorrelation
from lib.models.policy import AtariA2C, StartPolicy, kl_to_start
from lib.models.reward_path import score_pay

# How the run reports.
LOG_PERIOD_S = 10.0  # a progress line and the charts/ scalars this often
LOSS_MEAN_OF = 10  # losses/* in TensorBoard: the mean of this many learner steps


# --- the loss -----------------------------------------------------------------------------------


def a2c_loss(
    net: AtariA2C,
    batch: Transitions,
    boot_values: np.ndarray,
    device: torch.device,
    entropy_beta: float,
    bf16: bool = False,
    weight: float = 1.0,
    start: StartPolicy | None = None,
    kl_beta: float = 0.0,
    marked_as: str = "marked",
) -> tuple[torch.Tensor, dict[str, float]]:
    """A2C loss on a batch of n-step transitions: target = returns + discount * V(s_boot), with
    ``boot_values`` (B,) float32 computed without gradient (0 where the episode terminated).
    ``weight`` scales the returned loss, not the metrics: with K ranks B / (all ranks' B), so the
    summed gradients are those of the global mean. ``start``: a fine-tune's start policy; its KL is
    reported (``finetune/kl_to_start``) and ``kl_beta`` times it added to the loss (``--kl``); on
    ``batch.marked``'s steps alone too, as ``finetune/kl_<marked_as>``. ``batch.features``: the
    frozen trunk's features from the acting forward; the heads run on them and the trunk is not run
    again (the same loss: the frozen weights have not moved since)."""
    kept = batch.features
    if kept is not None and not net.conv_frozen:
        raise ValueError("a2c_loss: batch.features given but the conv layers train (kept features need --finetune)")
    # the frames are read only where a forward needs them: the trunk, or a start policy with its own
    states = None
    if kept is None or (start is not None and not start.shared):
        states = torch.from_numpy(batch.obs).to(device)
    actions = torch.from_numpy(batch.actions).to(device)
    target = torch.from_numpy(batch.returns + batch.discount * boot_values).to(device)

    with autocast(device, bf16):
        fx = net.features(states) if kept is None else kept.to(device)
        logits, values = net.heads(fx)
        start_logits = None if start is None else start.logits(fx.detach(), states)
    logits, values = logits.float(), values.float()
    # Critic: regress V(s) on the n-step target.
    loss_value = F.mse_loss(values, target)
    # Actor: raise log pi(a|s) in proportion to the advantage (no gradient through the critic).
    log_prob = F.log_softmax(logits, dim=1)
    adv = target - values.detach()
    loss_policy = -(adv * log_prob[torch.arange(len(actions), device=device), actions]).mean()
    # Entropy bonus keeps the policy exploring (the book's beta 0.01).
    entropy = -(log_prob.exp() * log_prob).sum(dim=1).mean()
    loss = loss_policy + loss_value - entropy_beta * entropy
    kl = None
    if start_logits is not None:
        # KL(pi || pi_start): a pull toward the start policy (--kl), the over-optimisation axis of
        # Gao et al. 2022 (how far the policy went against what the proxy reward gave it)
        kl = kl_to_start(log_prob, start_logits)
        if kl_beta:
            loss = loss + kl_beta * kl
        marked = None if batch.marked is None else torch.from_numpy(batch.marked).to(device)
        if marked is not None and bool(marked.any()):  # a readout's steps (StepMarks): their KL apart
            kl_marked = kl_to_start(log_prob.detach()[marked], start_logits[marked])
    metrics = {
        "losses/policy": loss_policy.item(),
        "losses/value": loss_value.item(),
        "losses/entropy": entropy.item(),
        "losses/total": loss.item(),
        "losses/advantage": adv.mean().item(),
    }
    if kl is not None:
        metrics["finetune/kl_to_start"] = kl.item()
        if marked is not None and bool(marked.any()):
            metrics[f"finetune/kl_{marked_as}"] = kl_marked.item()
    return loss * weight, metrics


KL_HORIZON = 10_000  # samples over which the controller may move the coefficient by e^0.2 at most


def adapt_kl_coef(coef: float, kl: float, target: float, samples: int, horizon: int = KL_HORIZON) -> float:
    """``--kl-target``: Ziegler et al. 2019's proportional controller (as TRL's
    AdaptiveKLController): error = clip(KL / target - 1, -0.2, 0.2), coefficient times 1 + error *
    samples / horizon. A KL above the target raises the coefficient, one below lowers it."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * samples / horizon)


def act(
    net: AtariA2C,
    obs: np.ndarray,
    device: torch.device,
    bf16: bool,
    uniforms: np.ndarray,
    keep_features: bool = False,
) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None]:
    """One batched forward for all envs: (actions sampled from the policy, V(obs), the trunk's
    features (N, 3136) on ``device`` where ``keep_features``, else None). ``uniforms`` (N,) in [0,
    1), one per env (``env_uniforms``), pick each action by inverse CDF. Actions and values come back
    together: one device synchronisation per vector step. The features are in the autocast's dtype
    (bfloat16 under ``bf16``), as the learner's own trunk forward would give them to the heads."""
    with torch.no_grad(), autocast(device, bf16):
        fx = net.features(torch.from_numpy(obs).to(device, non_blocking=True))
        logits, values = net.heads(fx)
        cum = F.softmax(logits.float(), dim=1).cumsum(dim=1)
        u = torch.from_numpy(uniforms).to(device, dtype=torch.float32)[:, None]
        actions = (cum < u).sum(dim=1).clamp_max(logits.shape[1] - 1)
        both = torch.stack([actions.float(), values.float()]).cpu().numpy()
    return both[0].astype(np.int64), both[1], fx if keep_features else None


def _values(net: AtariA2C, obs: np.ndarray, device: torch.device, bf16: bool = False) -> np.ndarray:
    with torch.no_grad(), autocast(device, bf16):
        return net(torch.from_numpy(obs).to(device))[1].float().cpu().numpy()


# --- one learner step ---------------------------------------------------------------------------


class MeanTracker:
    """Averages noisy per-train-step scalars over ``every`` values before writing them to
    TensorBoard; ``flush()`` writes what is left, so a short run still logs its losses."""

    def __init__(self, writer: Any, every: int = LOSS_MEAN_OF):
        self.writer, self.every = writer, every
        self._values: dict[str, list[float]] = {}
        self._step = 0

    def track(self, name: str, value: float, step: int) -> None:
        vals = self._values.setdefault(name, [])
        vals.append(value)
        self._step = step
        if len(vals) >= self.every:
            self.writer.add_scalar(name, float(np.mean(vals)), step)
            vals.clear()

    def flush(self) -> None:
        for name, vals in self._values.items():
            if vals:
                self.writer.add_scalar(name, float(np.mean(vals)), self._step)
                vals.clear()


class Learner:
    """Turns transitions into A2C updates, one per BATCH_SIZE transitions over all ranks. The next
    step's acting forward computes the V(obs) the completed transitions bootstrap from, so ``learn``
    takes them from there: one forward + backward per batch, not two forwards; with the trunk frozen
    (--finetune) the acting forward's features too, so the learner runs the heads alone. Under torchrun one
    small all-reduce per vector step sums the ranks' counts and stop requests, so all ranks update
    on the same step; gradients are summed before the optimiser step."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.params = [p for p in run.net.parameters() if p.requires_grad]
        self.waiting: Transitions | None = None
        self.ready: list[Transitions] = []
        self.ready_boot: list[np.ndarray] = []
        self.metrics: dict[str, float] = {}
        self.tracker = MeanTracker(run.writer, every=LOSS_MEAN_OF)

    def learn(self, values: np.ndarray, stop: bool = False) -> bool:
        """Bootstrap the waiting transitions with ``values`` (V of the current obs, per env) and take
        an optimiser step when a batch is full. ``stop``: this process wants to stop (Ctrl-C);
        returns whether any rank does, so that all stop on the same step."""
        waiting, self.waiting = self.waiting, None
        run = self.run
        if waiting is not None and len(waiting):
            boot = np.zeros(len(waiting), dtype=np.float32)  # 0 where the episode terminated
            nxt = waiting.boot_mode == BOOT_NEXT
            boot[nxt] = values[waiting.env[nxt]]
            fin = waiting.boot_mode == BOOT_FINAL  # truncated: the episode's own last obs
            if fin.any():
                boot[fin] = _values(run.net, waiting.boot_obs[fin], run.device, run.cfg.bf16)
            self.ready.append(waiting)
            self.ready_boot.append(boot)
        local = sum(len(t) for t in self.ready)
        total, stops = run.dist.all_sum([float(local), float(stop)])
        if total >= BATCH_SIZE:
            self._update(local, total)
        return stops > 0

    def _update(self, local: int, total: float) -> None:
        run = self.run
        run.optimizer.zero_grad(set_to_none=False)  # a rank with nothing yet still adds zeros
        m: dict[str, float] = {}
        if local:
            batch, boot_all = Transitions.concat(self.ready), np.concatenate(self.ready_boot)
            self.ready, self.ready_boot = [], []
            weight = local * run.dist.world / total  # the mean over every rank's transitions
            loss, m = a2c_loss(
                run.net,
                batch,
                boot_all,
                run.device,
                run.cfg.entropy,
                run.cfg.bf16,
                weight,
                run.start,
                run.kl_coef,
                marked_as=run.hooks.marks.name if run.hooks.marks else "marked",
            )
            loss.backward()
        run.dist.sum_grads(self.params)
        if run.dist.active:
            for p in self.params:
                p.grad.div_(run.dist.world)  # summed gradients of weighted means -> the global mean
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, run.cfg.clip_grad).item()
        if not math.isfinite(grad_norm) or any(not math.isfinite(v) for v in m.values()):
            raise NonFiniteError(
                f"non-finite loss or gradient at step {run.progress.step:,} (loss {m.get('losses/total', 'n/a')}, "
                f"grad norm {grad_norm}): stopped before the optimiser step; lower --lr or check the reward model"
            )
        m["losses/grad_norm"] = grad_norm
        if run.start is not None:
            m["finetune/kl_coef"] = run.kl_coef  # the coefficient this update used
            if run.cfg.kl_target is not None:
                kl_sum, n = run.dist.all_sum([m.get("finetune/kl_to_start", 0.0) * local, float(local)])
                run.kl_coef = adapt_kl_coef(run.kl_coef, kl_sum / max(n, 1.0), run.cfg.kl_target, int(total))
        run.optimizer.step()
        run.scheduler.step()
        run.progress.train_steps += 1
        self.metrics = m
        for k, v in m.items():
            self.tracker.track(k, v, run.progress.step)


def _fmt_time(sec: float) -> str:
    sec = int(max(sec, 0))
    return f"{sec // 3600}:{sec % 3600 // 60:02d}:{sec % 60:02d}"


class ProgressLog:
    """Every LOG_PERIOD_S: one console line and the charts/, recorder/ and reward_model/ scalars.
    Evaluation time is left out of the speed and the ETA."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.t_start = self.t_last = time.time()
        self.start_step = self.step_last = run.progress.step
        self.eval_seconds = 0.0

    def skip(self, seconds: float) -> None:
        """``seconds`` of evaluation just passed: not training time."""
        self.eval_seconds += seconds
        self.t_last, self.step_last = time.time(), self.run.progress.step

    def tick(self, games: GameStats, learner: Learner) -> None:
        now, run = time.time(), self.run
        if now - self.t_last < LOG_PERIOD_S:
            return
        step, w = run.progress.step, run.writer
        sps = (step - self.step_last) / (now - self.t_last)
        w.add_scalar("charts/steps_per_sec", sps, step)
        w.add_scalar("charts/lr", run.scheduler.get_last_lr()[0], step)
        line = f"step {step:>11,} | {sps:6,.0f} steps/s"
        if games.recent:
            line += f" | games {run.progress.games:,}, score(last {len(games.recent)}) {np.mean(games.recent):7.1f}"
        if learner.metrics:
            line += f" | loss {learner.metrics['losses/total']:.3f} ent {learner.metrics['losses/entropy']:.2f}"
            if (kl := learner.metrics.get("finetune/kl_to_start")) is not None:
                line += f" kl {kl:.3f}"
                if run.cfg.kl_target is not None:
                    line += f" (coef {run.kl_coef:.3g})"
        if run.recorder is not None:
            w.add_scalar("recorder/segments", run.recorder.segments_written, step)
            line += f" | segments {run.recorder.segments_written:,}"
        if run.cfg.reward:
            for k, v in run.env.stats().items():
                w.add_scalar(f"reward_model/{k}", v, step)
            if (corr := games.true_vs_pred_corr()) is not None:
                w.add_scalar("reward_model/true_vs_pred_corr", corr, step)
            if (corr := games.step_corr.value()) is not None:
                w.add_scalar("reward_model/step_corr", corr, step)
                line += f" | step corr {corr:+.2f}"
            games.step_corr = StepCorrelation()
        if run.cfg.max_steps:
            rate = (step - self.start_step) / max(now - self.t_start - self.eval_seconds, 1e-6)
            line += f" | ETA {_fmt_time((run.cfg.max_steps - step) / max(rate, 1e-6))}"
        print(line, flush=True)
        self.t_last, self.step_last = now, step


# --- the loop -----------------------------------------------------------------------------------


def train(
    cfg: A2CConfig, make_env: Callable[..., Any] = vec_env, dist: Dist | None = None, hooks: Hooks | None = None
) -> int:
    """Train until --max-steps or Ctrl-C; evaluate and save along the way; report where things are.
    The env steps in its C++ threads while this thread works: once a step's results are in, the next
    actions are chosen and sent, and the bookkeeping and update run while the env steps. The result
    is that of act -> learn -> step in order: the update bootstraps from that same forward pass."""
    run = build_run(cfg, make_env, dist, hooks)
    if run.dist.is_main:
        announce(run)
    collector = NStepCollector(cfg.envs, run.base_env.obs_shape, cfg.n_steps, cfg.gamma)
    learner, games, log = Learner(run), GameStats(cfg.envs, finetune=run.start is not None), ProgressLog(run)
    clip = not cfg.reward  # the score is sign-clipped (DeepMind); a learned reward is scaled by its wrapper
    # a fine-tune's KL to its start is also logged on the steps a readout marks (an experiment's hook)
    marks = run.hooks.marks if run.start is not None else None
    test_every = cfg.test_every
    next_test = (run.progress.step // test_every + 1) * test_every if test_every else None
    status, failure = "finished", None
    # ranks other than 0 say nothing (torchrun sends the signal to all)
    message = "{signal}: finishing the current step and saving..." if run.dist.is_main else None
    with SignalStop(message=message) as stopper:
        obs = run.env.reset()  # a Ctrl-C while the games reset stops at the first step, cleanly
        run.net.train()
        try:
            marked = marks(run.env.frames) if marks else None
            actions, values, fx = act_step(run, obs)
            while True:
                st = run.env.step_wait()
                prev_obs, prev_actions, prev_marked, prev_fx, obs = obs, actions, marked, fx, st.obs
                run.progress.step += run.global_envs
                if next_test is not None and run.progress.step >= next_test:
                    next_test += test_every
                    if run.dist.is_main:
                        log.skip(evaluate_and_save(run, stopper))
                done = bool(cfg.max_steps) and run.progress.step >= cfg.max_steps
                if not done:
                    marked = marks(run.env.frames) if marks else None  # the frames ``obs`` was made of
                    actions, values, fx = act_step(run, obs)  # the env steps from here while this thread works
                st.complete()  # a diff reward model's forward on this step (RewardModelWrapper)
                games.update(st, run.progress, run.writer)
                if run.dist.is_main:
                    log.tick(games, learner)
                rewards = score_pay(st.rewards) if clip else st.rewards
                ends = learner_terminal(st, cfg.terminal)
                learner.waiting = collector.add(
                    prev_obs, prev_actions, rewards, ends, st.truncated, st.obs, st.final_obs, prev_marked, prev_fx
                )
                if done:
                    break
                if learner.learn(values, stopper()):  # all ranks stop on the same step
                    run.env.step_wait()
                    status = "interrupted"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
        except NonFiniteError as e:
            status, failure = "stopped", e
        except RankLost as e:  # another rank is gone: this one's state is whole, last.pt is saved
            status, failure = "stopped", e
        finally:
            try:
                run.close()
                if not isinstance(failure, NonFiniteError):
                    run.save_last()
                learner.tracker.flush()
                run.writer.close()
            finally:
                run.release()  # the checkpoint dir, once its last last.pt is written
    if run.dist.is_main:
        report(run, status, log)
    if isinstance(failure, RankLost):
        raise failure.ended(run.progress.step, cfg.save_dir)
    if failure is not None:
        raise failure
    return 0


def learner_terminal(st: VecStep, terminal: str) -> np.ndarray:
    """(N,) bool: where the learner's episode ends (``--terminal``), no bootstrap past it; the game
    resets as always. ``life``: at every lost life (DeepMind's); ``none``: never, one continuous
    episode, as Christiano et al. 2017 and Ibarz et al. 2018 give a learned reward (with a terminal
    and a centred reward, dying can be the way out of a stretch paid below the centre). A time-limit
    cut is a truncation in every mode."""
    if terminal == "life":
        return st.terminated
    if terminal == "none":
        return np.zeros_like(st.terminated)
    raise ValueError(f"unknown terminal {terminal!r}")


def act_step(run: Run, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None]:
    """Choose this vector step's actions (per-env random streams: ``env_uniforms``), start the env
    stepping with them, and return (actions, V(obs), the trunk's features of obs or None). With
    the trunk frozen (--finetune) the features are kept: the learner runs only the heads on them."""
    t = run.progress.step // run.global_envs
    u = env_uniforms(run.cfg.seed, run.env_ids, t)
    actions, values, fx = act(run.net, obs, run.device, run.cfg.bf16, u, keep_features=run.net.conv_frozen)
    run.env.step_async(actions)
    return actions, values, fx


def announce(run: Run) -> None:
    cfg = run.cfg
    print(
        f"A2C on {cfg.env} ({run.game}), {cfg.envs} envs, {run.base_env.n_actions} actions, device {run.device}"
        + (f", finetune from {cfg.model}" if run.finetune and cfg.model else "")
        + (f", resumed at step {run.progress.step:,}" if run.resumed else "")
        + (f", reward model {cfg.reward}" if cfg.reward else "")
        + (f" (sent through its path: {run.hooks.reward_source.name})" if run.hooks.reward_source else "")
        + (f", reward std {cfg.reward_scale:g} ({cfg.reward_norm} stats)" if cfg.reward else "")
        + (f", terminal at {cfg.terminal}" if cfg.terminal != "life" else "")
        + (", bf16 forward passes" if cfg.bf16 else "")
        + (f", KL {cfg.kl:g} to the start policy" if cfg.kl and cfg.kl_target is None else "")
        + (
            f", KL to the start policy adapted toward {cfg.kl_target:g} a step from {run.kl_coef:g}"
            if cfg.kl_target
            else ""
        )
        + (f", recording into {cfg.db_path} (p={cfg.record_prob})" if cfg.db_path else ""),
        flush=True,
    )
    print(f"TensorBoard: tensorboard --logdir {cfg.runs_dir}   (this run: {run.tb_dir})", flush=True)


def report(run: Run, status: str, log: ProgressLog) -> None:
    cfg, step = run.cfg, run.progress.step
    elapsed = time.time() - log.t_start
    print(
        f"{status} at step {step:,} after {_fmt_time(elapsed)} "
        f"({(step - log.start_step) / max(elapsed, 1e-6):,.0f} steps/s incl. evaluation)",
        flush=True,
    )
    print(
        f"  checkpoints: {cfg.save_dir}/ (last.pt for --resume"
        + (", best_*.pt by eval score)" if cfg.test_every else ")")
    )
    if run.recorder is not None:
        failed = run.recorder.segments_failed
        lost = f", {failed} could not be written: see the warning above" if failed else ""
        print(f"  segments:    {cfg.db_path} ({run.recorder.segments_written} written this run{lost})")
    print(f"  TensorBoard: {run.tb_dir}")
    if run.recorder is not None and run.recorder.segments_written:
        print(f"next: label them with  python 02_label_ui.py -d {cfg.db_path}")
