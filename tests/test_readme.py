"""Every command the README and docs/*.md show must parse.

A line in a fenced code block that starts (after an optional ``$ ``) with ``python``,
``.venv/bin/python``, ``make`` or ``torchrun`` is a command. ``python 0N_*.py ARGS``,
``python -m experiments.X ARGS`` and ``python -m bench.X ARGS`` have ARGS parsed by that
program's own argparse parser, without running the program; ``make X`` must name a target of
the Makefile. Placeholders are fine where argparse does not look at files
(``saves/v0/best_<step>.pt``); ``[...]`` around optional flags is read as the flags themselves,
and ``...`` is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("python", "python3", ".venv/bin/python", "make", "torchrun")
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}
EXTERNAL_MODULES = {"pytest", "pip", "venv", "ruff", "tensorboard"}  # python -m X of other projects
OWN_PACKAGES = ("lib", "experiments", "bench")


def fenced_commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of every command line in the fenced code blocks of ``path``;
    a line ending in a backslash continues on the next."""
    out: list[tuple[int, str]] = []
    fenced = False
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if raw.lstrip().startswith("```"):
            fenced, pending = not fenced, None
            continue
        if not fenced:
            continue
        line = raw.strip()
        if pending is not None:
            start, text = pending
            line = text + " " + line
        else:
            start = n
        if line.endswith("\\"):
            pending = (start, line[:-1].rstrip())
            continue
        pending = None
        if line.startswith("$ "):
            line = line[2:].lstrip()
        if line.split(" ", 1)[0] in PROGRAMS:
            out.append((start, line))
    return out


def tokens(command: str) -> list[str]:
    """Shell words of ``command`` up to its first operator, comments, brackets and ``...`` removed."""
    words = []
    for w in shlex.split(command, comments=True):
        if w in OPERATORS:
            break
        w = w.strip("[]")
        if w and w not in {"...", "…"}:
            words.append(w)
    return words


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)} - {".PHONY"}


_loaded: dict[str, ModuleType] = {}


def load_script(path: Path) -> ModuleType:
    """Import a numbered script (not importable by name) as a module; its __main__ guard keeps
    it from running."""
    key = str(path)
    if key not in _loaded:
        spec = importlib.util.spec_from_file_location(f"readme_cmd_{path.stem}", path)
        assert spec is not None and spec.loader is not None, f"cannot import {path}"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[key] = module
    return _loaded[key]


class _Parsed(Exception):
    """Raised by the patched argparse once a program's main() has parsed its arguments."""


def _intercept_main(main: Callable[..., object], prog: str) -> Callable[[list[str]], None]:
    """Parse by calling ``main()`` with argparse patched to parse ``argv`` and stop right there."""

    def parse(argv: list[str]) -> None:
        orig_args, orig_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
        inside = [False]

        def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN202
            inside[0] = True
            try:
                ns = orig_args(self, argv, namespace)
            finally:
                inside[0] = False
            raise _Parsed(ns)

        def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN202
            if inside[0]:
                return orig_known(self, args, namespace)
            raise _Parsed(orig_known(self, argv, namespace))

        old_argv = sys.argv
        argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
        sys.argv = [prog, *argv]
        try:
            main()
        except _Parsed:
            return
        finally:
            argparse.ArgumentParser.parse_args = orig_args  # type: ignore[method-assign]
            argparse.ArgumentParser.parse_known_args = orig_known  # type: ignore[method-assign]
            sys.argv = old_argv
        raise AssertionError(f"{prog}: main() returned without parsing its arguments")

    return parse


def _own(obj: object) -> ModuleType | None:
    """The module of ``obj`` when it is one of this repository's packages."""
    name = getattr(obj, "__module__", None)
    if name and name.split(".")[0] in OWN_PACKAGES:
        return sys.modules.get(name)
    return None


def find_parser(module: ModuleType, prog: str, depth: int = 0) -> Callable[[list[str]], None]:
    """How to parse a program's arguments without running it: its ``build_parser()``, a
    ``parse_args(argv)`` of its own, the ``build_parser`` beside a ``parse_*`` function it imported,
    the module its ``main`` comes from, or, last, its own ``main()`` with argparse intercepted."""
    build = getattr(module, "build_parser", None)
    if callable(build):
        return lambda argv: build().parse_args(argv)
    parse_args = getattr(module, "parse_args", None)
    if inspect.isfunction(parse_args):
        return lambda argv: parse_args(argv)
    for name, obj in vars(module).items():
        if not name.startswith("parse_"):
            continue
        home = _own(obj)
        if home is not None and home is not module and callable(getattr(home, "build_parser", None)):
            return lambda argv: home.build_parser().parse_args(argv)
    main = getattr(module, "main", None)
    if callable(main):
        home = _own(main)
        if home is not None and home is not module and depth < 3:
            return find_parser(home, prog, depth + 1)
        return _intercept_main(main, prog)
    raise AssertionError(f"{prog}: found no build_parser, parse_args or main to parse its arguments with")


def check_command(command: str) -> None:
    """Parse ``command`` as its program would; AssertionError naming the command if it does not."""
    words = tokens(command)
    program, args = words[0], words[1:]
    if program == "make":
        targets = make_targets()
        for t in args:
            if not t.startswith("-") and "=" not in t:
                assert t in targets, f"`{command}`: the Makefile has no target {t!r}"
        return
    if program == "torchrun":
        scripts = [i for i, w in enumerate(args) if w.endswith(".py")]
        assert scripts, f"`{command}`: torchrun runs no .py script"
        args = args[scripts[0] :]
    if args[:1] == ["-c"] or (args[:1] == ["-m"] and args[1:2] and args[1] in EXTERNAL_MODULES):
        return
    if args[:1] == ["-m"]:
        assert len(args) > 1, f"`{command}`: python -m without a module"
        name, argv = args[1], args[2:]
        assert name.split(".")[0] in ("experiments", "bench"), f"`{command}`: unknown module {name}"
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise AssertionError(f"`{command}`: cannot import {name}: {e}") from None
        prog = f"python -m {name}"
    else:
        assert args, f"`{command}`: no script"
        script = ROOT / args[0]
        assert script.is_file(), f"`{command}`: no such script {args[0]}"
        module, prog, argv = load_script(script), args[0], args[1:]
    parse = find_parser(module, prog)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            raise AssertionError(f"`{command}` does not parse: {err.getvalue().strip()}") from None
    except AssertionError:
        raise
    except Exception as e:  # a parser whose error() raises (02_label_ui.py's UserError)
        raise AssertionError(f"`{command}` does not parse: {type(e).__name__}: {e}") from None


COMMANDS = [(p.relative_to(ROOT).as_posix(), n, c) for p in DOCS for n, c in fenced_commands(p)]


@pytest.mark.parametrize(("doc", "line", "command"), COMMANDS, ids=[f"{d}:{n}" for d, n, _ in COMMANDS])
def test_command_parses(doc: str, line: int, command: str) -> None:
    try:
        check_command(command)
    except AssertionError as e:
        raise AssertionError(f"{doc}:{line}: {e}") from None


def test_readme_shows_commands() -> None:
    """The README shows every stage and the make targets a newcomer starts with."""
    shown = " ".join(c for d, _, c in COMMANDS if d == "README.md")
    for needed in ("make setup", "make demo", "make test", "01_a2c.py", "02_label_ui.py", "03_reward_train.py"):
        assert needed in shown, f"README.md shows no `{needed}` command"
    assert "04_play.py" in shown


@pytest.mark.parametrize(
    "command",
    [
        "python 01_a2c.py -n v0 --no-such-flag 1",
        "python 02_label_ui.py --pairs 5",  # -d is required
        "python 03_reward_train.py -n v0 -o saves/reward db/v0 --arch nope",
        "python 04_play.py -n 3",  # -m is required
        "python -m experiments.round --teacher nobody",
        "python 05_missing.py -n v0",
        "make no-such-target",
        "torchrun --standalone --nproc-per-node 2 01_a2c.py --envs 8",  # -n is required
    ],
)
def test_a_bad_command_fails(command: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(command.split(" #")[0].strip())):
        check_command(command)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


LINKS = [
    (p.relative_to(ROOT).as_posix(), m.group(1))
    for p in DOCS
    for m in re.finditer(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", p.read_text(encoding="utf-8"), flags=re.S))
    if not re.match(r"[a-z]+:", m.group(1))
]


@pytest.mark.parametrize(("doc", "target"), LINKS, ids=[f"{d}->{t}" for d, t in LINKS])
def test_link_resolves(doc: str, target: str) -> None:
    """Every relative link and picture of the README and docs/ points at a file that is there,
    and at a heading of it that is there."""
    path, _, anchor = target.partition("#")
    file = (ROOT / doc).parent / path if path else ROOT / doc
    assert ROOT in file.resolve().parents, f"{doc}: link to {target} leaves the repository (a user has only the clone)"
    assert file.exists(), f"{doc}: link to {target}: no file {file.relative_to(ROOT)}"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), f"{doc}: link to {target}: no such heading in {file.name}"


def test_readme_order() -> None:
    """What it is, quick start, a round stage by stage, what it has shown (terms before results),
    layout, where the rest is: the order a newcomer reads in."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.*)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)
    assert sections == ["Quick start", "A round, stage by stage", "What it has shown", "Layout", "Where the rest is"]
    shown = text[text.index("## What it has shown") :]
    assert shown.index("**Terms.**") < shown.index("| round |"), "the results' terms come before the table"


@pytest.mark.parametrize("package", ["experiments", "bench"])
def test_packages_run_as_modules_and_say_so(package: str) -> None:
    """experiments/ and bench/ import their package (python -m PKG.NAME); a shebang would promise
    ./PKG/NAME.py, which cannot import it."""
    shebang = [p.name for p in (ROOT / package).glob("*.py") if p.read_text(encoding="utf-8").startswith("#!")]
    assert not shebang, f"{package}/{shebang}: run as python -m {package}.NAME, no shebang"
