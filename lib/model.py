"""The A2C policy network (the book's AtariA2C) and its checkpoints.

A checkpoint is a plain dict loadable with ``torch.load(..., weights_only=True)``:
``{"format", "version", "state_dict", "env_id", "game", "obs_shape", "n_actions",
"action_meanings", "step", "metrics", ...}``; ``last.pt`` adds the optimizer, scheduler and
counters for ``--resume``. A bare state dict (the book's format) also loads; then env and
shapes come from the caller.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lib.errors import UserError
from lib.files import atomic_write, remove_stale_temps

POLICY_FORMAT = "rlhf-atari-policy"
REWARD_FORMAT = "rlhf-atari-reward"
# A checkpoint file, and the tensors it unpacks to, are bounded before torch.load allocates them:
# a policy is ~13 MB (last.pt with Adam's moments ~40 MB), a reward ensemble of 64 full-frame book
# nets ~150 MB. A zip may deflate its entries: their uncompressed sizes count, not the file's.
MAX_CHECKPOINT_BYTES = 512 << 20
MAX_CHECKPOINT_ENTRIES = 100_000
MAX_CHECKPOINT_NODES = 1_000_000  # dicts, lists and values walked after loading
MAX_ACTIONS = 256  # as lib.segments.MAX_ACTIONS: no Atari game has more than 18


def checkpoint_kind(ck: dict[str, Any]) -> str:
    """What a checkpoint dict holds: "policy" or "reward" (our formats), "bare policy" (the book's
    A2C state dict) or "bare reward" (the book's reward-net state dict), else "unknown"."""
    fmt = ck.get("format")
    if fmt in (POLICY_FORMAT, REWARD_FORMAT):
        return "policy" if fmt == POLICY_FORMAT else "reward"
    if ck and all(isinstance(v, torch.Tensor) for v in ck.values()):
        if "out.0.weight" in ck:
            return "bare reward"
        if "policy.2.weight" in ck:
            return "bare policy"
    return "unknown"


def wrong_kind(path: str | os.PathLike, ck: dict[str, Any], want: str) -> UserError | None:
    """The one message for a policy given where a reward model is wanted, and the other way round."""
    kind = checkpoint_kind(ck).removeprefix("bare ")
    if want == "policy" and kind == "reward":
        return UserError(f"{path} is a reward model, not a policy: pass it with --reward (-r), the policy with -m")
    if want == "reward" and kind == "policy":
        return UserError(f"{path} is a policy, not a reward model: pass it with -m, the reward model with -r")
    return None


def policy_conv(channels: int) -> nn.Sequential:
    """The policy's 3 conv layers (Mnih et al. 2015), flattened: (B, channels, 84, 84) float in [0, 1]
    -> (B, 3136). ``AtariA2C.conv``, and the encoder a reward model can borrow from a policy
    (``DiffRewardModel(encoder=True)``)."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, kernel_size=3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )


class AtariA2C(nn.Module):
    """Actor-critic: 3 conv layers shared, a 512-unit policy head and a 512-unit value head.

    forward: (B, 4, 84, 84) uint8 -> logits (B, n_actions) float32, values (B,) float32
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.conv = policy_conv(obs_shape[0])
        with torch.no_grad():
            size = self.conv(torch.zeros(1, *obs_shape)).shape[1]
        self.policy = nn.Sequential(nn.Linear(size, 512), nn.ReLU(), nn.Linear(512, n_actions))
        self.value = nn.Sequential(nn.Linear(size, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fx = self.conv(x.float() / 255.0)
        return self.policy(fx), self.value(fx).squeeze(-1)

    def freeze_conv(self) -> None:
        """Fine-tuning: keep the learned features, train only the heads."""
        for p in self.conv.parameters():
            p.requires_grad_(False)


def resolve_device(dev: str | torch.device) -> torch.device:
    """``--dev`` of every stage: 'cpu', 'cuda' or 'cuda:N' -> a device that exists here;
    UserError with one line otherwise (e.g. --dev cuda on a machine without a GPU)."""
    name = str(dev)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise UserError(f"--dev must be cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--dev {name} given but no CUDA GPU is available here: use --dev cpu")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--dev {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def policy_checkpoint(
    net: AtariA2C, env_id: str, game: str, action_meanings: tuple[str, ...], **extra: Any
) -> dict[str, Any]:
    ck = {
        "format": POLICY_FORMAT,
        "version": 1,
        "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()},
        "env_id": env_id,
        "game": game,
        "obs_shape": list(net.obs_shape),
        "n_actions": net.n_actions,
        "action_meanings": list(action_meanings),
    }
    ck.update(extra)
    return ck


BEST_GLOB = "best_*.pt"  # 01_a2c.py's best checkpoints: best_<step, 9 digits>_score<mean>_len<mean>.pt
LAST_NAME = "last.pt"  # 01_a2c.py's latest state (what --resume continues)


def best_checkpoint_name(step: int, score_mean: float, length_mean: float) -> str:
    """The file name of a best checkpoint: the step first, zero-padded, so that a listing reads in
    step order (up to 9 digits; ``best_checkpoints`` sorts by the parsed step)."""
    return f"best_{step:09d}_score{score_mean:.1f}_len{length_mean:.0f}.pt"


BEST_NAME = re.compile(r"best_(\d+)_score.*\.pt")  # what best_checkpoint_name writes


def best_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """A run's best checkpoints, by the step parsed from the name (past 9 digits a name is longer,
    and text order would put step 1,000,000,128 before 999,999,872); other best_*.pt are not ours."""
    steps = {p: m[1] for p in Path(save_dir).glob(BEST_GLOB) if (m := BEST_NAME.fullmatch(p.name))}
    return sorted(steps, key=lambda p: (int(steps[p]), p.name))


def best_checkpoint(save_dir: str | os.PathLike) -> Path | None:
    """A run's best policy: its last best_*.pt written (each beat every earlier evaluation), by the
    step in its name; None when the run has none (it never finished an evaluation)."""
    best = best_checkpoints(save_dir)
    return best[-1] if best else None


def run_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints 01_a2c.py wrote in a run directory: its best ones (by step) and last.pt."""
    last = Path(save_dir) / LAST_NAME
    return best_checkpoints(save_dir) + ([last] if os.path.lexists(last) else [])


def remove_run_checkpoints(save_dir: str | os.PathLike) -> int:
    """Remove a run's checkpoints (``run_checkpoints``: ``--force`` starts the run over, and an old
    best must not stand for the new run); returns how many. Other files stay."""
    found = run_checkpoints(save_dir)
    for p in found:
        try:
            p.unlink()
        except OSError as e:
            raise UserError(f"--force cannot remove the old run's {p}: {e.strerror or e}") from None
    return len(found)


def policy_file(path: str | os.PathLike) -> Path:
    """``-m`` of 01_a2c.py and 04_play.py: a checkpoint file as given, or a run directory (such as
    saves/v0), which stands for its best policy (``best_checkpoint``), else its last.pt."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = best_checkpoint(path) or (path / LAST_NAME if (path / LAST_NAME).is_file() else None)
    if found is None:
        raise UserError(f"-m {path}: a directory without a policy ({BEST_GLOB} or {LAST_NAME})")
    return found


_CLEANED: set[str] = set()  # paths whose stale temp files this process has removed


def atomic_torch_save(obj: Any, path: str | os.PathLike, what: str = "checkpoint") -> None:
    """torch.save to a unique temp file, fsync, rename: a crash never leaves a half checkpoint,
    and two runs saving at once never share a temp file. A failed write (disk full) is a
    UserError naming the path and saying that what was there is kept. The first save of a path
    in a process also removes the temp files a killed earlier run left beside it."""
    key = os.path.abspath(path)
    if key not in _CLEANED:
        _CLEANED.add(key)
        remove_stale_checkpoint_temps(path)
    try:
        atomic_write(path, lambda f: torch.save(obj, f))
    except OSError as e:
        kept = "the previous file is kept" if os.path.lexists(path) else "nothing was written"
        raise UserError(f"cannot write {what} {path}: {e.strerror or e} ({kept})") from None


def remove_stale_checkpoint_temps(path: str | os.PathLike, started: float | None = None) -> int:
    """Remove the temp files a killed ``atomic_torch_save`` of ``path`` left beside it
    (``.<name>.*.tmp``, regular files older than ``started``); returns how many."""
    path = Path(path)
    return remove_stale_temps(path.parent, f".{path.name}.", ".tmp", started)


# --- reading a checkpoint: untrusted bytes -----------------------------------------------------


def _open_checkpoint(path: Path, what: str, max_bytes: int) -> Any:
    """A binary file object of a regular file of at most ``max_bytes``; UserError otherwise. Opened
    with O_NONBLOCK and checked with fstat: a FIFO, device or socket never hangs or floods us."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UserError(f"{what} file not found: {path}") from None
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise UserError(f"{what} {path} is not a regular file (a socket or FIFO): pass a .pt file") from None
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{what} path is a directory, expected a .pt file: {path}")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{what} {path} is not a regular file (a FIFO, device or socket): pass a .pt file")
        if st.st_size > max_bytes:
            raise UserError(f"{what} {path} has {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_zip(f: Any, path: Path, what: str, max_bytes: int) -> None:
    """A PyTorch checkpoint is a zip: its entries' uncompressed sizes (what torch.load allocates)
    are bounded before anything is inflated."""
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise UserError(f"{what} {path} is corrupt or not a PyTorch checkpoint") from None
    if len(infos) > MAX_CHECKPOINT_ENTRIES:
        raise UserError(f"{what} {path} holds {len(infos):,} entries: not a checkpoint")
    total = sum(i.file_size for i in infos)
    if total > max_bytes:
        raise UserError(f"{what} {path} unpacks to {total:,} bytes, more than the {max_bytes:,} a checkpoint may have")
    f.seek(0)


def _tensor_bytes(obj: Any, path: Path, what: str) -> int:
    """Bytes of the distinct storages of the tensors in ``obj`` (dicts, lists, tuples walked)."""
    seen: set[int] = set()
    total, nodes, stack = 0, 0, [obj]
    while stack:
        x = stack.pop()
        nodes += 1
        if nodes > MAX_CHECKPOINT_NODES:
            raise UserError(f"{what} {path} holds more than {MAX_CHECKPOINT_NODES:,} values: not a checkpoint")
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return total


def read_checkpoint(path: str | os.PathLike, what: str = "model", max_bytes: int | None = None) -> dict[str, Any]:
    """Load a checkpoint dict safely; UserError with one line on any problem.

    The one way every stage reads a ``.pt`` it is handed (policy, reward model, ``last.pt``): a
    regular file (a FIFO or device is refused by fstat, never opened for a blocking read) of at
    most ``max_bytes``, a zip whose entries unpack to at most ``max_bytes``, loaded with
    ``weights_only`` (no code runs) from the very file that was checked. The fields are the
    caller's to check (``check_fields``, ``check_state_dict``)."""
    path = Path(path)
    max_bytes = MAX_CHECKPOINT_BYTES if max_bytes is None else max_bytes
    with _open_checkpoint(path, what, max_bytes) as f:
        _check_zip(f, path, what, max_bytes)
        try:
            ck = torch.load(f, map_location="cpu", weights_only=True)
        except Exception:
            # Whatever a broken or foreign file makes torch.load raise (UnpicklingError also covers
            # a file that weights_only refuses to load because it would run code; a text file can
            # give KeyError), it is the same message.
            raise UserError(f"{what} {path} is corrupt or not a PyTorch checkpoint") from None
    if not isinstance(ck, dict):
        raise UserError(f"{what} {path} is not a checkpoint dict")
    if _tensor_bytes(ck, path, what) > max_bytes:
        raise UserError(f"{what} {path} holds more than {max_bytes:,} bytes of tensors")
    return ck


# --- checking a checkpoint's fields --------------------------------------------------------------

Check = Callable[[Any], None]


def _plain_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def int_in(lo: int, hi: int) -> Check:
    """An int (not a bool, not a float) in [lo, hi]."""

    def check(v: Any) -> None:
        if type(v) is not int or not lo <= v <= hi:
            raise ValueError(f"must be an integer in {lo}..{hi}, got {_show(v)}")

    return check


def float_in(lo: float, hi: float, lo_open: bool = False) -> Check:
    """A finite number in [lo, hi] (``lo_open``: (lo, hi])."""

    def check(v: Any) -> None:
        ok = _plain_number(v) and math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi
        if not ok:
            raise ValueError(f"must be a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {_show(v)}")

    return check


def text(max_len: int = 4096) -> Check:
    def check(v: Any) -> None:
        if not isinstance(v, str) or len(v) > max_len:
            raise ValueError(f"must be a text of at most {max_len} characters, got {_show(v)}")

    return check


def is_bool(v: Any) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {_show(v)}")


def is_dict(v: Any) -> None:
    if not isinstance(v, dict):
        raise ValueError(f"must be a dict, got {_show(v)}")


def optional(check: Check) -> Check:
    """``check``, or None."""

    def opt(v: Any) -> None:
        if v is not None:
            check(v)

    return opt


def list_of(check: Check, min_len: int = 0, max_len: int = 1 << 16) -> Check:
    """A list (or tuple) of ``min_len``..``max_len`` items, each passing ``check``."""

    def lst(v: Any) -> None:
        if not isinstance(v, list | tuple) or not min_len <= len(v) <= max_len:
            n = f"{min_len}" if min_len == max_len else f"{min_len}..{max_len}"
            raise ValueError(f"must be a list of {n} items, got {_show(v)}")
        for i, x in enumerate(v):
            try:
                check(x)
            except ValueError as e:
                raise ValueError(f"item {i} {e}") from None

    return lst


def plain_values(v: Any) -> None:
    """A dict of metrics or settings: string keys, values None, bool, str, finite numbers (or
    lists/dicts of them, two levels deep)."""

    def ok(x: Any, depth: int) -> bool:
        if x is None or isinstance(x, bool | str):
            return True
        if _plain_number(x):
            return math.isfinite(x)
        if depth and isinstance(x, list | tuple):
            return len(x) <= 4096 and all(ok(y, depth - 1) for y in x)
        if depth and isinstance(x, dict):
            return len(x) <= 4096 and all(isinstance(k, str) and ok(y, depth - 1) for k, y in x.items())
        return False

    if not isinstance(v, dict) or not ok(v, 2):
        raise ValueError(f"must be a dict of names to finite numbers or texts, got {_show(v)}")


def _show(v: Any) -> str:
    return f"{type(v).__name__} {repr(v)[:40]}"


def check_fields(ck: dict[str, Any], spec: dict[str, tuple[Check, bool]], where: str) -> None:
    """Check a checkpoint's fields against ``spec``: ``{name: (check, required)}``. A missing
    required field, or a field whose check raises ValueError, is a UserError with one line
    naming ``where`` (e.g. "model saves/x.pt") and the field. Fields not in ``spec`` are
    ignored. Example: ``check_fields(ck, {"lr": (float_in(0, 1, lo_open=True), True),
    "optimizer": (is_dict, True), "env_steps": (optional(list_of(int_in(0, 10**12))), False)},
    f"checkpoint {path}")``."""
    for name, (check, required) in spec.items():
        if name not in ck:
            if required:
                raise UserError(f"{where} has no {name!r} field: not a usable checkpoint")
            continue
        try:
            check(ck[name])
        except ValueError as e:
            raise UserError(f"{where}: field {name!r} {e}") from None


def check_state_dict(sd: Any, where: str) -> dict[str, torch.Tensor]:
    """A state dict of named tensors whose floating-point values are all finite; UserError with
    one line otherwise (a NaN or inf weight never reaches a network)."""
    if not isinstance(sd, dict) or not sd or len(sd) > 4096:
        raise UserError(f"{where} holds no state dict of weights")
    for k, v in sd.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise UserError(f"{where}: its state dict holds {_show(k)}: not a tensor of weights")
        if (v.is_floating_point() or v.is_complex()) and not bool(torch.isfinite(v).all()):
            raise UserError(f"{where}: weight {k[:60]!r} holds NaN or infinite values: retrain or use another file")
    return sd


def state_is_finite(sd: dict[str, torch.Tensor]) -> bool:
    """Whether every floating-point tensor of a state dict is finite."""
    return all(
        bool(torch.isfinite(v).all()) for v in sd.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
    )


MAX_OBS_SIDE = 256  # the policy sees 84x84: larger observations would build a giant network
POLICY_FIELDS: dict[str, tuple[Check, bool]] = {
    "version": (int_in(0, 1000), False),
    "state_dict": (is_dict, True),
    "obs_shape": (list_of(int_in(1, MAX_OBS_SIDE), 3, 3), True),
    "n_actions": (int_in(1, MAX_ACTIONS), True),
    "env_id": (optional(text(200)), False),
    "game": (optional(text(200)), False),
    "action_meanings": (optional(list_of(text(64), 1, MAX_ACTIONS)), False),
    "step": (optional(float_in(0, 1e15)), False),
    "metrics": (optional(is_dict), False),  # evaluation figures (NaN allowed): shown, never used
}


def load_policy(
    path: str | os.PathLike,
    env_id: str | None = None,
    game: str | None = None,
    obs_shape: tuple[int, ...] | None = None,
    n_actions: int | None = None,
    ck: dict[str, Any] | None = None,
) -> tuple[AtariA2C, dict[str, Any]]:
    """Load a policy checkpoint and check it fits the env (game, obs shape, action count).

    Returns (net, checkpoint dict). For a bare state dict, obs_shape and n_actions must be given.
    ``ck``: the file's dict when the caller has read it already (``read_checkpoint``).
    """
    ck = read_checkpoint(path, "model") if ck is None else ck
    if ck.get("format") == POLICY_FORMAT:
        check_fields(ck, POLICY_FIELDS, f"model {path}")
        state = ck["state_dict"]
        ck_shape = tuple(ck["obs_shape"])
        ck_actions = int(ck["n_actions"])
        if ck_shape[0] > 16 or min(ck_shape[1:]) < 36:
            raise UserError(f"model {path} declares observations {ck_shape}: not an Atari policy's")
        ck_game = ck.get("game")
        if game is not None and ck_game is not None and ck_game != game:
            raise UserError(
                f"model {path} was trained on {ck.get('env_id', ck_game)}, not {env_id or game}: "
                f"pass --env {ck.get('env_id', ck_game)} or another model"
            )
        if obs_shape is not None and tuple(obs_shape) != ck_shape:
            raise UserError(f"model {path} expects observations {ck_shape}, the env gives {tuple(obs_shape)}")
        if n_actions is not None and n_actions != ck_actions:
            raise UserError(f"model {path} has {ck_actions} actions, the env {env_id or game} has {n_actions}")
    elif ck and all(isinstance(v, torch.Tensor) for v in ck.values()):
        # The book's format: a bare state dict.
        if obs_shape is None or n_actions is None:
            raise UserError(f"model {path} is a bare state dict: the env must give its shapes")
        state, ck_shape, ck_actions = ck, tuple(obs_shape), n_actions
        ck = {"state_dict": state}
    else:
        raise wrong_kind(path, ck, "policy") or UserError(f"model {path} is not a policy checkpoint")
    check_state_dict(state, f"model {path}")
    net = AtariA2C(ck_shape, ck_actions)
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"model {path} does not fit the A2C network ({str(e).splitlines()[0][:120]})") from None
    return net, ck
