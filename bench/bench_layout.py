"""The layout, measured: lines per package, what each stage's script reaches, and the imports that
break the layering rules (docs/design.md, "The layout"). It reads the code's imports as text (every
``import`` in a file, those inside functions too) and runs nothing of the project.

    python -m bench.bench_layout            # the table
    python -m bench.bench_layout --edges    # also every import between our modules

A stage's reach is every module of ours its numbered script imports, directly or through others; a
package's ``__init__.py`` adds its lines but is not counted as a module. ``tests/test_layout.py``
holds the rules with the same reader. It reads ``import`` statements: a module imported by name at
run time (``importlib``) is not seen, and nothing of ours does that.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, field
from pathlib import Path

from lib.core.table import print_table

ROOT = Path(__file__).resolve().parent.parent
OURS = ("lib", "experiments", "bench")
STAGES = {"01_a2c.py": "a2c", "02_label_ui.py": "label_ui", "03_reward_train.py": "reward", "04_play.py": "play"}
# The shared layers, lowest first: a module may import its own package and the layers below it.
LAYERS = ("core", "atari", "store", "models")
STAGE_PKGS = {f"lib.{s}" for s in STAGES.values()}
KNOWN = STAGE_PKGS | {f"lib.{layer}" for layer in LAYERS} | {"lib"}  # every place of lib/ the layout has


@dataclass
class Module:
    """One file of ours: its dotted name, lines, and the modules of ours it imports."""

    name: str
    path: Path
    lines: int
    imports: set[str] = field(default_factory=set)

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def read_modules(root: Path = ROOT) -> dict[str, Module]:
    """Every .py file under lib/, experiments/ and bench/, plus the numbered stage scripts (named by
    their file names), with the imports each makes of the others."""
    files = [p for top in OURS for p in sorted((root / top).rglob("*.py")) if "__pycache__" not in p.parts]
    mods = {module_name(p, root): Module(module_name(p, root), p, 0) for p in files}
    for script in STAGES:
        mods[script] = Module(script, root / script, 0)
    for m in mods.values():
        text = m.path.read_text()
        m.lines = len(text.splitlines())
        m.imports = _imports(ast.parse(text), m, mods)
    return mods


def _imports(tree: ast.AST, m: Module, mods: dict[str, Module]) -> set[str]:
    out: set[str] = set()
    package = m.name if m.is_package else m.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # ``import lib.a.b`` runs lib/__init__, lib/a/__init__ and lib/a/b: each is imported.
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in mods and prefix != m.name:
                    out.add(prefix)
    return out


def reach(start: str, mods: dict[str, Module]) -> set[str]:
    """Every module of ours ``start`` imports, directly or through others (``start`` left out)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in mods[todo.pop()].imports:
            if dep not in seen and dep != start:
                seen.add(dep)
                todo.append(dep)
    return seen


def count(names: set[str], mods: dict[str, Module]) -> tuple[int, int]:
    """(modules, lines) of ``names``: package ``__init__`` files add lines, not modules."""
    return sum(not mods[n].is_package for n in names), sum(mods[n].lines for n in names)


def place(m: Module) -> str:
    """Where a module stands in the layout: 'lib.<package>', 'lib' (lib/__init__.py or a module flat
    in lib/), 'experiments', 'bench', or a stage script's name."""
    parts = m.name.split(".")
    if parts[0] == "lib":
        return "lib" if len(parts) == 1 or m.path.parent.name == "lib" else f"lib.{parts[1]}"
    return parts[0] if parts[0] in OURS else m.name


def flat(mods: dict[str, Module]) -> list[str]:
    """The modules left flat in lib/ (beside its ``__init__.py``)."""
    return sorted(n for n, m in mods.items() if n != "lib" and place(m) == "lib")


def broken_rules(mods: dict[str, Module]) -> list[str]:
    """Each import against the rules, as 'a -> b: why'; and each module left flat in lib/."""
    out = [f"{n}: a module flat in lib/ (put it in a package)" for n in flat(mods)]
    out += [
        f"{n}: in {place(m)}, which is not in the layout"
        for n, m in sorted(mods.items())
        if place(m).startswith("lib.") and place(m) not in KNOWN
    ]
    for n in sorted(mods):
        src = place(mods[n])
        deps = mods[n].imports
        # ``from lib.x import y`` imports lib/x/__init__ too: named once, by the module it reached
        for dep in sorted(d for d in deps if not (mods[d].is_package and any(e.startswith(d + ".") for e in deps))):
            dst = place(mods[dep])
            why = _why(src, dst)
            if why:
                out.append(f"{n} -> {dep}: {why}")
    return out


def _why(src: str, dst: str) -> str | None:
    if dst.startswith("lib.") and dst not in KNOWN and src != dst:
        return f"{dst} is not in the layout (a shared layer or a stage's package)"
    if src in STAGES:
        ok = (f"lib.{STAGES[src]}", "lib.core", "lib")
        return None if dst in ok else f"a stage's script goes past its own package and core ({dst})"
    if src == dst or dst == "lib":
        return None
    if src.startswith("lib"):
        if dst in ("experiments", "bench"):
            return f"lib/ never imports {dst}/"
        if src in STAGE_PKGS:
            return f"a stage imports another stage ({dst})" if dst in STAGE_PKGS else None
        level = LAYERS.index(src[4:]) if src[4:] in LAYERS else None
        if level is None:
            return None
        if dst in STAGE_PKGS:
            return f"a shared layer imports a stage ({dst})"
        if dst[4:] in LAYERS and LAYERS.index(dst[4:]) > level:
            return f"{src[4:]} imports the layer above it ({dst[4:]})"
        return None
    if {src, dst} == {"experiments", "bench"}:
        return f"{src}/ never imports {dst}/"
    return None


def circles(mods: dict[str, Module]) -> list[list[str]]:
    """Groups of modules that import each other in a loop (Tarjan's strongly connected components of
    size > 1). A package importing its own modules from ``__init__`` is not a loop worth naming, so
    the edges from a package's ``__init__`` to its own modules are left out."""
    graph = {n: {d for d in m.imports if not (m.is_package and d.startswith(n + "."))} for n, m in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def rows(mods: dict[str, Module]) -> list[tuple[str, str, str, str]]:
    out = []
    lib = {n for n in mods if n == "lib" or n.startswith("lib.")}
    out.append(("lib/ lines", f"{count(lib, mods)[1]:,}", "lines", f"{count(lib, mods)[0]} modules"))
    for pkg in sorted({place(mods[n]) for n in lib}):
        inside = {n for n in lib if place(mods[n]) == pkg}
        k, n_lines = count(inside, mods)
        where = "lib/ (flat)" if pkg == "lib" else pkg.replace(".", "/") + "/"
        out.append((where, f"{n_lines:,}", "lines", f"{k} modules"))
    for script in STAGES:
        k, n_lines = count(reach(script, mods), mods)
        out.append((f"{script} reaches", f"{k}", "modules", f"{n_lines:,} lines"))
    out.append(("imports against the rules", f"{len(broken_rules(mods))}", "imports", "tests/test_layout.py"))
    out.append(("circles", f"{len(circles(mods))}", "loops", "modules importing each other"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--edges", action="store_true", help="also print every import between our modules")
    p.add_argument("--rules", action="store_true", help="also print each import against the rules")
    a = p.parse_args()
    mods = read_modules()
    print_table("layout", rows(mods))
    if a.rules:
        for line in broken_rules(mods):
            print("  " + line)
    for c in circles(mods):
        print("  circle: " + " -> ".join(c))
    if a.edges:
        for n in sorted(mods):
            for d in sorted(mods[n].imports):
                print(f"  {n} -> {d}")


if __name__ == "__main__":
    main()
