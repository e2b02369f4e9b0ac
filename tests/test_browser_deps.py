"""scripts/browser_deps.sh, which `make test` and `.ci/run` run before the browser tests: with
chromium and chromedriver on PATH it does nothing; without them, as a user who is not root (or
with ``--check``), it says in one line what to run and exits 2, and never tries to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "browser_deps.sh"
BASH = shutil.which("bash") or "/bin/bash"


def path_with(tmp_path: Path, **tools: str) -> str:
    """A PATH of one folder holding only ``tools``: name -> the real program it links to, or
    "" for an executable that does nothing (the script only asks whether the name is on PATH)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, target in tools.items():
        if target:
            (folder / name).symlink_to(target)
        else:
            (folder / name).write_text("#!/bin/sh\nexit 0\n")
            (folder / name).chmod(0o755)
    return str(folder)


def run(path: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    # The script comes on stdin so that a user without rights to the checkout can run it too.
    cmd = [*prefix, BASH, "-s", "--", *args]
    return subprocess.run(
        cmd, input=SCRIPT.read_text(), env={"PATH": path}, cwd="/", capture_output=True, text=True, timeout=60
    )


def assert_names_the_command(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install chromium chromium-driver" in lines[0], r.stderr
    assert r.stdout == ""


def test_present_is_nothing_to_do(tmp_path: Path) -> None:
    r = run(path_with(tmp_path, chromium="", chromedriver=""))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.parametrize("tools", [{}, {"chromium": ""}, {"chromedriver": ""}])
def test_missing_with_check_says_what_to_run(tmp_path: Path, tools: dict[str, str]) -> None:
    # An apt-get that does nothing: were --check to install, its "installing" line would show.
    assert_names_the_command(run(path_with(tmp_path, **tools, **{"apt-get": ""}), "--check"))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_missing_not_root_says_what_to_run_and_installs_nothing() -> None:
    # Really not root (nobody), with apt-get on PATH: trying to install would fail with apt's own
    # error and exit code, not this one line.
    # The PATH folder must be one that user can read: pytest's tmp_path is not.
    with tempfile.TemporaryDirectory() as shared:
        Path(shared).chmod(0o755)
        path = path_with(Path(shared), **{"apt-get": shutil.which("apt-get") or "/usr/bin/apt-get"})
        nobody = (shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        assert_names_the_command(run(path, prefix=nobody))


def test_unknown_argument_is_a_usage_line(tmp_path: Path) -> None:
    r = run(path_with(tmp_path), "--install-everything")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "usage" in r.stderr
