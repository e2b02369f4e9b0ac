"""How every command line of the project declares a setting, once: a dataclass field made by
``setting`` carries its default, ``--help`` text, ``--help`` group, flag names and checks.
``build_parser`` builds the argparse parser from the fields, ``check_fields`` runs the checks (a
``UserError``: one line, exit 2), ``DefaultsOnceFormatter`` writes ``--help``, and ``SEED_CHECKS``
is the one bound on every ``--seed``. Imports no torch, so that ``--help`` stays fast."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, field, fields
from typing import Any

from lib.core.errors import UserError

Check = tuple[Callable[[Any], bool], str]  # (ok(value), message formatted with v and flag)

# The one bound on every --seed. ALE seeds env i with ``seed + i`` as a C++ int, and evaluation uses
# ``seed + EVAL_SEED_OFFSET + i``, so a seed and both offsets must fit in 31 bits; one bound for every
# stage, so a seed one stage takes is never refused by the next.
EVAL_SEED_OFFSET = 10_000  # evaluation games use seeds apart from the training envs'
MAX_SEED = 2**31 - 1 - 2 * EVAL_SEED_OFFSET


# A --seed setting's check: a seed out of 0..MAX_SEED is one line (None: not given).
SEED_CHECKS = ((lambda v: v is None or 0 <= v <= MAX_SEED, f"{{flag}} must be in 0..{MAX_SEED}, got {{v}}"),)


class DefaultsOnceFormatter(argparse.HelpFormatter):
    """``--help`` with each flag's default shown once: appended as ``(default: X)`` unless the help
    text already names its default, and left out where there is none (``None``, a switch, a
    required flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "(default" in text
            or action.required
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def setting(
    default: Any = MISSING,
    help: str | Callable[[], str] = "",
    *,
    group: str,
    flags: tuple[str, ...] = (),
    checks: Iterable[Check] = (),
    positional: bool = False,
    retired: dict[Any, str] | None = None,
    **arg: Any,
) -> Any:
    """One flag, declared once: its default (none: a required flag), its ``--help`` text, the
    ``--help`` group it is listed in, its names (default ``--field-name``), its own checks
    (``(ok(value), message)`` pairs, the message formatted with ``v`` and ``flag``) and what else
    argparse needs (``type``, ``choices``, ``metavar``, ``nargs``, ``action``). ``positional``: an
    argument without a flag name. A value with ``choices`` is checked against them too, so that a
    value set in code is refused as one read from the command line is (a default of None, the flag
    not given, passes). A flag given more than once (``action="append"``) has each value checked.
    ``help`` may be a function, called as the parser is built: a text that names what is true now."""
    if "choices" in arg:  # a value set in code is refused as one argparse read is
        kept = tuple(arg["choices"])
        one_of = (
            lambda v: v in kept or (v is None and default is None),
            f"{{flag}} must be one of {', '.join(map(str, kept))}, got {{v!r}}",
        )
        checks = (*checks, one_of)
    if retired:  # values once among the choices: refused with the line that says why, not argparse's
        refused = tuple((lambda v, r=r: v != r, f"{{flag}} {r} {why}") for r, why in retired.items())
        checks = (*refused, *checks)
        metavar = arg.get("metavar") or "{" + ",".join(map(str, kept)) + "}"
        arg = {**arg, "choices": _Choices(kept, retired), "metavar": metavar}
    meta = {"help": help, "group": group, "flags": flags, "checks": tuple(checks), "arg": arg, "positional": positional}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


class _Choices(tuple):
    """A setting's choices as argparse lists them (the kept ones, in its "invalid choice" line) that
    also let the retired values through, so that its checks refuse those with the line saying why."""

    def __new__(cls, kept: tuple[Any, ...], retired: dict[Any, str]) -> _Choices:
        choices = super().__new__(cls, kept)
        choices.retired = tuple(retired)
        return choices

    def __contains__(self, value: object) -> bool:
        return super().__contains__(value) or value in self.retired


def within(flag: str, lo: float, hi: float, ends: str = "[]") -> tuple[Check]:
    """A check that the value lies between ``lo`` and ``hi``; ``ends`` says which ends belong to
    the range, as the message writes them ("[)": lo does, hi does not)."""

    def ok(v: float) -> bool:
        return (lo <= v if ends[0] == "[" else lo < v) and (v <= hi if ends[1] == "]" else v < hi)

    def text(x: float) -> str:
        return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"

    return ((ok, f"{flag} must be in {ends[0]}{text(lo)}, {text(hi)}{ends[1]}, got {{v}}"),)


def in_range(flag: str, lo: int, hi: int) -> tuple[Check]:
    """A check that a count lies in ``lo..hi``, both ends included, as the message writes it."""
    return ((lambda v: lo <= v <= hi, f"{flag} must be in {lo}..{hi}, got {{v}}"),)


def at_least(flag: str, lo: float = 0) -> tuple[Check]:
    """A check that the value is at least ``lo`` (a count: 0 or more)."""
    return ((lambda v: v >= lo, f"{flag} must be >= {lo:g}, got {{v}}"),)


def flag_of(f: Field) -> str:
    """The name a field's messages give it: its longest flag name, or the field's name if positional."""
    if f.metadata["positional"]:
        return f.name.upper()
    return max(f.metadata["flags"] or (f"--{f.name.replace('_', '-')}",), key=len)


def _argument(f: Field) -> tuple[tuple[str, ...], dict[str, Any]]:
    meta = f.metadata
    kw: dict[str, Any] = {"help": meta["help"]() if callable(meta["help"]) else meta["help"], **meta["arg"]}
    default = (
        f.default
        if f.default is not MISSING
        else (f.default_factory() if f.default_factory is not MISSING else MISSING)
    )  # type: ignore[misc]  # noqa: E501
    if meta["positional"]:
        names: tuple[str, ...] = (f.name,)
        if default is not MISSING:
            kw.setdefault("nargs", "?")
            kw["default"] = default
    else:
        names = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        kw["dest"] = f.name
        if default is MISSING:
            kw["required"] = True
        elif isinstance(default, bool) and "action" not in kw:
            kw["action"] = "store_false" if default else "store_true"
        else:
            kw["default"] = default
    takes_value = kw.get("action") in (None, "store")
    if takes_value and "type" not in kw and default not in (MISSING, None) and not isinstance(default, (str, list)):
        kw["type"] = type(default)
    return names, kw


def build_parser(
    cls: type, prog: str, description: str, groups: dict[str, str | tuple[str, str]], epilog: str | None = None
) -> argparse.ArgumentParser:
    """The parser of ``cls``'s fields, one argument each, in ``groups`` (key: the title ``--help``
    shows, or a (title, description) pair), in the order of the fields; each default shown once."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=DefaultsOnceFormatter,
    )
    made = {
        key: p.add_argument_group(*((title,) if isinstance(title, str) else title)) for key, title in groups.items()
    }
    for f in fields(cls):
        if "group" not in f.metadata:  # a field that is no flag (set by the program)
            continue
        names, kw = _argument(f)
        made[f.metadata["group"]].add_argument(*names, **kw)
    return p


def check_fields(cfg: Any, declared_by: type | None = None) -> None:
    """UserError with one line for the first field whose value fails one of its own checks, in
    ``--help`` order; a repeated flag (``action="append"``, None when not given) value by value.
    ``declared_by``: the settings class whose field of each name declares the checks, for a config
    made from its flags (stage 3's ``TrainConfig`` from ``RewardArgs``)."""
    declared = {f.name: f for f in fields(declared_by or cfg)}
    for name in (f.name for f in fields(cfg)):
        f = declared.get(name)
        if f is None or "checks" not in f.metadata:
            continue
        value = getattr(cfg, name)
        values = (value or []) if f.metadata["arg"].get("action") == "append" else [value]
        for v in values:
            for ok, message in f.metadata["checks"]:
                if not ok(v):
                    raise UserError(message.format(v=v, flag=flag_of(f)))


def check_between(wrong: Iterable[tuple[Any, str]]) -> None:
    """UserError with the message of the first ``(bad, message)`` pair whose ``bad`` holds: the
    checks between two or more settings."""
    for bad, message in wrong:
        if bad:
            raise UserError(message)


class _Retired(argparse.Action):
    """A flag that was retired: giving it is a UserError with the line that says why (its figures
    stay in docs/results.md); it is not listed in ``--help``."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "", **kw: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", help=argparse.SUPPRESS)
        self.why = why

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        raise UserError(f"{option_string} {self.why}")


def retire(parser: argparse.ArgumentParser, retired: dict[str, str]) -> argparse.ArgumentParser:
    """Refuse each retired flag of ``retired`` (flag: the words after it, e.g. "was retired after
    commit abc1234: it lost to the control in every round, docs/results.md") in one line."""
    for flag, why in retired.items():
        parser.add_argument(flag, action=_Retired, why=why)
    return parser
