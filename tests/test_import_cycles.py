"""No import cycles in `framework/` or `plugins/` (issue 45): no two modules that import each
other, directly or around a loop.

Every import statement counts, wherever it stands: at module level, inside functions and
methods, in `try` blocks, under `if TYPE_CHECKING:`. A function-local import only delays a
loop to run time, and a `TYPE_CHECKING` import is still a dependency a reader must follow, so
neither hides one here. So does `importlib.import_module("a.b")` with the name written out: an
import statement by another spelling. The files are parsed (`ast`), nothing is imported.

What an import is an edge to:
- `import a.b.c` (or `import_module("a.b.c")`) -> the module `a.b.c`.
- `from a.b import c` -> `a.b.c` when that is a module (a file or a package) of the project,
  else `a.b` (then `c` is a name defined in, or re-exported by, `a.b`).
- relative imports are resolved against the importing module's package first.
- modules outside `framework/` and `plugins/` (torch, the standard library, tests) are no edges.

How package `__init__` modules count: importing `a.b.c` runs `a/__init__` and `a/b/__init__`
first, but that is no edge to them. A module depends on a package's `__init__` only when it uses
a name the `__init__` defines: `from a.b import name` with `name` not a submodule, or
`import a.b` itself. Counting every parent package as an edge would report a loop for every
package whose `__init__` imports its own submodules (`plugins/__init__` imports `plugins.models`,
whose files import nothing from `plugins`), a loop Python never trips on: the `__init__` is
already running, and the submodule needs none of its names. A submodule that does take a name
from an `__init__` which imports it is a real loop (the name may not exist yet), and is counted.

No edges: the names a plugin hands the registry about itself (`declare(group, name,
"module:attr")`, `defer_import("module")`, entry points), which the registry imports later
through a variable. They are the inversion that lets the core build plugins it does not know:
the plugin names itself to the registry, the registry imports it on first use.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("framework", "plugins")


def project_modules(repo: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every `.py` under the roots (a package is its `__init__`)."""
    mods = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in `module` is resolved against."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _import_module_call(node: ast.AST) -> bool:
    """`importlib.import_module("a.b")` (or a bare `import_module`) with the name written out."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name) and f.id == "import_module")


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules that `module`'s import statements (all of them, see the docstring) name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) or _import_module_call(node):
            for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.args[0].value]:
                if name in mods:
                    out.add(name)
                elif name.partition(".")[0] in ROOTS:
                    raise AssertionError(f"{path}: `import {name}` names no module of the project")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module, path)
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base.partition(".")[0] not in ROOTS:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in mods:
                    out.add(sub)
                elif base in mods:
                    out.add(base)
                else:
                    raise AssertionError(f"{path}: `from {base} import {alias.name}` names no module of the project")
    out.discard(module)
    return out


def import_graph(repo: Path = REPO) -> dict[str, set[str]]:
    mods = project_modules(repo)
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit); only components that hold a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    out.append(comp)
    return out


def shortest_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """The shortest loop inside one component (breadth-first from each member), first member
    repeated at the end; ties go to the alphabetically first."""
    best: list[str] | None = None
    for start in sorted(comp):
        parent = {start: None}
        queue = deque([start])
        found = None
        while queue and found is None:
            node = queue.popleft()
            for nxt in sorted(graph[node] & comp):
                if nxt == start:
                    found = node
                    break
                if nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
        if found is None:
            continue
        path = [found]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        cycle = [*reversed(path), start]
        if best is None or len(cycle) < len(best):
            best = cycle
    assert best is not None
    return best


def describe(graph: dict[str, set[str]], comp: set[str]) -> str:
    """The component's shortest loop, `a -> b -> a`, and all its members when it has more."""
    cycle = shortest_cycle(graph, comp)
    loop = " -> ".join(cycle)
    return loop if len(comp) == len(cycle) - 1 else f"{loop}  (component of {len(comp)}: {', '.join(sorted(comp))})"


def test_no_import_cycles_in_framework_or_plugins():
    graph = import_graph()
    loops = [describe(graph, c) for c in strongly_connected(graph)]
    assert not loops, "import cycles (break each by design: move what both sides use to its own module, or invert a dependency):\n" + "\n".join(loops)


# A function-local import defers its cost (or its failure) to the call: only worth it where start-up
# needs it (torch, MLflow, matplotlib: `--help` and a bad override import none) or the dependency is
# optional. Each says which, on its line (`# torch: start-up`); a run of imports on consecutive
# lines says it once, on the first. plugins/schedulers/ is the lead's, being reorganised (issue 45).
LOCAL_IMPORTS_PENDING: tuple[str, ...] = ()


def local_imports_without_reason(path: Path) -> list[int]:
    """Lines of the function-local import statements in `path` that give no reason."""
    text = path.read_text()
    lines = text.splitlines()
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT}
    missing = []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for body in _bodies(fn):
            first = prev = None
            for st in body:
                if not isinstance(st, (ast.Import, ast.ImportFrom)):
                    first = prev = None
                    continue
                if prev is None or st.lineno != prev.end_lineno + 1:
                    first = st
                if first.lineno not in comments and lines[first.lineno - 1].strip():
                    missing.append(st.lineno)
                prev = st
    return sorted(set(missing))


def _bodies(fn: ast.AST):
    """Every statement list inside function `fn` (its own, and those of its if/try/with/for
    blocks), not those of nested functions or classes (walked on their own)."""
    stack = [fn]
    while stack:
        node = stack.pop()
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block:
                if all(isinstance(b, ast.stmt) for b in block):
                    yield block
                stack.extend(b for b in block if not isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
        if isinstance(node, ast.Match):
            stack.extend(node.cases)


def test_every_function_local_import_says_why():
    missing = []
    for module, path in project_modules().items():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(LOCAL_IMPORTS_PENDING):
            continue
        missing += [f"{rel}:{n}: {path.read_text().splitlines()[n - 1].strip()}" for n in local_imports_without_reason(path)]
    assert not missing, "function-local imports with no reason (move them to the top, or say why on the line: `# torch: start-up`):\n" + "\n".join(missing)


# --- the checker itself, on small trees -------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for root in ROOTS:
        (tmp_path / root).mkdir(exist_ok=True)
        (tmp_path / root / "__init__.py").touch()
    return import_graph(tmp_path)


def test_checker_sees_imports_inside_functions_try_and_type_checking(tmp_path):
    graph = _tree(tmp_path, {
        "framework/a.py": "def f():\n    from framework import b\n",
        "framework/b.py": "try:\n    import framework.c\nexcept ImportError:\n    pass\n",
        "framework/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
        "framework/d.py": "import framework.a\n",
        "framework/e.py": "import importlib\ndef load():\n    importlib.import_module('framework.d')\n",
    })
    assert graph["framework.e"] == {"framework.d"}  # a module imported by its written name
    assert graph["framework.a"] == {"framework.b"} and graph["framework.b"] == {"framework.c"}
    assert graph["framework.c"] == {"framework.a"}  # relative, resolved
    comps = strongly_connected(graph)
    assert comps == [{"framework.a", "framework.b", "framework.c"}]
    assert describe(graph, comps[0]) == "framework.a -> framework.b -> framework.c -> framework.a"


def test_checker_counts_a_package_init_only_for_the_names_it_defines(tmp_path):
    graph = _tree(tmp_path, {
        "plugins/pkg/__init__.py": "from plugins.pkg.sub import X\nY = 1\n",
        "plugins/pkg/sub.py": "from plugins.pkg import other\nX = 1\n",  # a submodule: no edge to the __init__
        "plugins/pkg/other.py": "",
    })
    assert graph["plugins.pkg.sub"] == {"plugins.pkg.other"}
    assert strongly_connected(graph) == []
    graph = _tree(tmp_path, {"plugins/pkg/other.py": "from plugins.pkg import Y\n"})  # a name of the __init__
    assert graph["plugins.pkg.other"] == {"plugins.pkg"}
    graph = _tree(tmp_path, {"plugins/pkg/__init__.py": "from plugins.pkg.sub import X\nfrom . import other\n"})
    (comp,) = strongly_connected(graph)  # the __init__ imports its submodules, `other` takes Y from it
    assert shortest_cycle(graph, comp) == ["plugins.pkg", "plugins.pkg.other", "plugins.pkg"]


def test_checker_reports_the_shortest_loop_of_a_component(tmp_path):
    graph = _tree(tmp_path, {
        "framework/a.py": "import framework.b\nimport framework.d\n",
        "framework/b.py": "import framework.c\n",
        "framework/c.py": "import framework.a\n",
        "framework/d.py": "import framework.a\n",
    })
    (comp,) = strongly_connected(graph)
    assert shortest_cycle(graph, comp) == ["framework.a", "framework.d", "framework.a"]
    assert "component of 4" in describe(graph, comp)


def test_checker_finds_local_imports_that_give_no_reason(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import os\n"
        "def a():\n"
        "    import torch  # torch: start-up\n"
        "    import numpy\n"  # the same run of imports: its first line says why
        "\n"
        "    import json\n"  # a new run
        "    try:\n"
        "        import fcntl\n"
        "    except ImportError:\n"
        "        pass\n"
        "    class C:\n"
        "        def m(self):\n"
        "            import re\n"
        "    return '# not a comment'\n"
    )
    assert local_imports_without_reason(f) == [6, 8, 13]
