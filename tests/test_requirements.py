"""requirements.txt holds what the product and its tests import, and nothing else: an installed,
unused dependency costs install time and CVEs (ptan and stable-baselines3 left for that reason)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = [*ROOT.glob("0*.py"), *(p for d in ("lib", "experiments", "bench", "tests") for p in (ROOT / d).rglob("*.py"))]
OWN = {"lib", "experiments", "bench", "tests"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
# requirement -> the module it is imported as
IMPORT_NAME = {"ale-py": "ale_py", "opencv-python-headless": "cv2", "pillow": "PIL", "imageio-ffmpeg": "imageio_ffmpeg"}
# requirements used without an import: the lint tool (make lint) and pytest's asyncio plugin (pyproject.toml)
TOOLS = {"ruff", "pytest-asyncio"}
# imported, and installed by a requirement that exposes them in its own API (NiceGUI's pages and tests)
VIA = {"fastapi": "nicegui", "starlette": "nicegui", "httpx": "nicegui"}


def requirements() -> set[str]:
    names = set()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[\[=<>~! ]", line, maxsplit=1)[0].lower())
    return names


def imported() -> set[str]:
    """Top-level names of every module imported anywhere in the code, lazily or not."""
    out = set()
    for path in CODE:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out - set(sys.stdlib_module_names) - OWN - {"__future__"}


def test_every_requirement_is_imported_or_a_named_tool() -> None:
    used = imported()
    unused = {r for r in requirements() - TOOLS if IMPORT_NAME.get(r, r) not in used}
    assert not unused, f"in requirements.txt but imported nowhere: {sorted(unused)}"


def test_every_import_is_a_requirement() -> None:
    provided = {IMPORT_NAME.get(r, r) for r in requirements()}
    missing = {m for m in imported() - provided if VIA.get(m) not in requirements()}
    assert not missing, f"imported but not in requirements.txt: {sorted(missing)}"
