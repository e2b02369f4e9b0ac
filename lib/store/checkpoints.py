"""Checkpoint files, policy and reward model alike: the one reader of untrusted checkpoint bytes
(``read_checkpoint``), the checks of a checkpoint's fields (``check_ck_fields``) and state dicts,
which kind a checkpoint is, and the atomic save. What each network's checkpoint holds lives in
``lib/models/policy.py`` and ``lib/models/reward.py``."""

from __future__ import annotations

import errno
import os
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lib.core.errors import UserError
from lib.core.files import install, remove_stale_temps, temp_beside
from lib.core.stats import finite

POLICY_FORMAT = "rlhf-atari-policy"
REWARD_FORMAT = "rlhf-atari-reward"
# A checkpoint file, and the tensors it unpacks to, are bounded before torch.load allocates them:
# a policy is ~13 MB (last.pt with Adam's moments ~40 MB), a reward ensemble of 64 full-frame book
# nets ~150 MB. A zip may deflate its entries: their uncompressed sizes count, not the file's.
MAX_CHECKPOINT_BYTES = 512 << 20
MAX_CHECKPOINT_ENTRIES = 100_000
MAX_CHECKPOINT_NODES = 1_000_000  # dicts, lists and values walked after loading
MAX_ACTIONS = 256  # as lib.store.segments.MAX_ACTIONS: no Atari game has more than 18


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


_CLEANED: set[str] = set()  # paths whose stale temp files this process has removed


def trained_elsewhere(ck: dict[str, Any], game: str | None) -> str | None:
    """The env a checkpoint says it was trained on when that is not ``game`` (None: the same game,
    or either one unknown)."""
    ck_game = ck.get("game")
    if game is None or ck_game is None or ck_game == game:
        return None
    return str(ck.get("env_id") or ck_game)


def atomic_torch_save(obj: Any, path: str | os.PathLike, what: str = "checkpoint") -> None:
    """torch.save to a unique temp file, fsync, rename: a crash never leaves a half checkpoint, and
    two runs saving at once never share a temp file. A failed write (disk full) is a UserError
    naming the path; what was there is kept. The first save of a path in a process also removes the
    temp files a killed run left beside it."""
    install(stage_torch_save(obj, path, what), path)


def stage_torch_save(obj: Any, path: str | os.PathLike, what: str = "checkpoint") -> str:
    """The first half of ``atomic_torch_save``: ``obj`` saved and fsynced to a new temp file beside
    ``path``; returns its name for ``lib.core.files.install`` once what goes with it is written. A failed
    write is a UserError, nothing left (a full disk makes ``torch.save`` raise RuntimeError)."""
    key = os.path.abspath(path)
    if key not in _CLEANED:
        _CLEANED.add(key)
        remove_stale_checkpoint_temps(path)
    try:
        return temp_beside(Path(path), lambda f: torch.save(obj, f))
    except (OSError, RuntimeError) as e:
        kept = "the previous file is kept" if os.path.lexists(path) else "nothing was written"
        why = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"cannot write {what} {path}: {why} ({kept})") from None


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
    """Load a checkpoint dict safely; UserError with one line on any problem. The one way every
    stage reads a ``.pt`` it is handed: a regular file (checked by fstat, never opened for a
    blocking read) of at most ``max_bytes``, a zip whose entries unpack to at most ``max_bytes``,
    loaded with ``weights_only`` (no code runs) from the very file that was checked. The fields are
    the caller's to check."""
    path = Path(path)
    max_bytes = MAX_CHECKPOINT_BYTES if max_bytes is None else max_bytes
    with _open_checkpoint(path, what, max_bytes) as f:
        _check_zip(f, path, what, max_bytes)
        try:
            ck = torch.load(f, map_location="cpu", weights_only=True)
        except Exception:
            # Whatever a broken or foreign file makes torch.load raise (UnpicklingError for what
            # weights_only refuses, KeyError for a text file), the message is the same.
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
        ok = _plain_number(v) and finite(v) and (lo < v if lo_open else lo <= v) and v <= hi
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
            return finite(x)
        if depth and isinstance(x, list | tuple):
            return len(x) <= 4096 and all(ok(y, depth - 1) for y in x)
        if depth and isinstance(x, dict):
            return len(x) <= 4096 and all(isinstance(k, str) and ok(y, depth - 1) for k, y in x.items())
        return False

    if not isinstance(v, dict) or not ok(v, 2):
        raise ValueError(f"must be a dict of names to finite numbers or texts, got {_show(v)}")


def _show(v: Any) -> str:
    return f"{type(v).__name__} {repr(v)[:40]}"


def check_ck_fields(ck: dict[str, Any], spec: dict[str, tuple[Check, bool]], where: str) -> None:
    """Check a checkpoint's fields against ``spec``, ``{name: (check, required)}``: a missing
    required field, or a check's ValueError, is a UserError with one line naming ``where`` (e.g.
    "model saves/x.pt") and the field. Fields not in ``spec`` are ignored."""
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


ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def _adam_step(v: Any) -> float | None:
    """A saved Adam step count as a number: a 0-dim real tensor or a plain number (older torch),
    integer-valued and finite; None for anything else."""
    if isinstance(v, torch.Tensor):
        if v.dim() != 0 or v.is_complex() or v.dtype == torch.bool or v.layout != torch.strided:
            return None
        v = v.item()
    if not _plain_number(v) or not finite(v) or v != int(v) or v < 0:
        return None
    return float(v)


def checked_adam_state(
    sd: Any, params: list[torch.Tensor], where: str
) -> tuple[dict[int, dict[str, torch.Tensor]], int]:
    """The per-parameter state of a saved ``torch.optim.Adam`` (its ``state_dict()``), checked
    against the ``params`` it is to drive, and the one step count all of them share. Every
    parameter has its moments (or none has: a run saved before its first update): ``exp_avg`` and
    ``exp_avg_sq`` of the parameter's shape and dtype, finite, the second not negative, and a
    scalar ``step``. Returns ``({index: {"step", "exp_avg", "exp_avg_sq"}}, steps)`` for
    ``load_state_dict``; UserError with one line (``where``: e.g. "checkpoint saves/x/last.pt")
    otherwise. Why: the fused kernel reads a moment by its parameter's size, so one of another
    shape makes it write past the tensor; nothing unchecked may reach it. The hyper-parameters the
    file saved are not read: the caller's optimiser keeps its own."""
    if not isinstance(sd, dict) or not isinstance(sd.get("state"), dict):
        raise UserError(f"{where}: its optimizer state does not fit this network (no per-parameter state)")
    groups = sd.get("param_groups")
    saved = [g.get("params") for g in groups] if isinstance(groups, list) and groups else None
    if saved is None or not all(isinstance(p, list) for p in saved) or sum(map(len, saved)) != len(params):
        raise UserError(
            f"{where}: its optimizer state does not fit this network (it drives another set of parameters "
            f"than the {len(params)} this run trains)"
        )
    state, n = sd["state"], len(params)
    if state and set(state) != set(range(n)):
        raise UserError(f"{where}: its optimizer state does not fit this network (moments for other parameters)")
    out: dict[int, dict[str, torch.Tensor]] = {}
    steps: set[float] = set()
    for i, p in enumerate(params):
        if not state:
            break
        st = state[i]
        if not isinstance(st, dict) or set(st) != {"step", *ADAM_MOMENTS}:
            keys = sorted(map(str, st)) if isinstance(st, dict) else _show(st)
            raise UserError(f"{where}: the optimizer state of parameter {i} holds {keys}, not Adam's step and moments")
        step = _adam_step(st["step"])
        if step is None:
            raise UserError(f"{where}: the optimizer step of parameter {i} is {_show(st['step'])}, not a count")
        steps.add(step)
        for k in ADAM_MOMENTS:
            m = st[k]
            if not isinstance(m, torch.Tensor) or m.layout != torch.strided:
                raise UserError(f"{where}: the optimizer's {k} of parameter {i} is {_show(m)}, not a tensor")
            if m.shape != p.shape or m.dtype != p.dtype:
                raise UserError(
                    f"{where}: the optimizer's {k} of parameter {i} is {m.dtype} {tuple(m.shape)}, its parameter "
                    f"{p.dtype} {tuple(p.shape)}: it does not fit this network"
                )
            if not bool(torch.isfinite(m).all()):
                raise UserError(f"{where}: its optimizer state holds NaN or infinite values")
        if bool((st["exp_avg_sq"] < 0).any()):
            raise UserError(f"{where}: the optimizer's exp_avg_sq of parameter {i} holds negative values")
        out[i] = {"step": torch.tensor(step, dtype=torch.float32), **{k: st[k] for k in ADAM_MOMENTS}}
    if len(steps) > 1:
        raise UserError(f"{where}: its optimizer's parameters have taken different numbers of steps")
    return out, int(steps.pop()) if steps else 0
