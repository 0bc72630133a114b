"""The layering holds (docs/architecture.md): the core (gpudoctor/) imports nothing of the packages above it
(checks, fixes, sample_train, watch, diagnose), and no two modules import each other, directly or round a circle —
counting imports made inside functions, which hide a circle without removing it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Installed names of the source folders (pyproject's package-dir).
FOLDERS = {"gpudoctor": ROOT / "gpudoctor", "gpudoctor.checks": ROOT / "checks", "gpudoctor.fixes": ROOT / "fixes"}
FOLDERS["gpudoctor.sample_train"] = ROOT / "sample_train"
FOLDERS["gpudoctor.watch"] = ROOT / "watch"
FOLDERS["gpudoctor.diagnose"] = ROOT / "diagnose"
ABOVE_THE_CORE = (
    "gpudoctor.checks",
    "gpudoctor.fixes",
    "gpudoctor.sample_train",
    "gpudoctor.watch",
    "gpudoctor.diagnose",
)


def modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            if prefix == "gpudoctor" and parts and parts[0] in ("checks", "fixes", "sample_train", "watch", "diagnose"):
                continue  # not a folder of the core (none exists today; kept explicit)
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports anywhere in its file (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


@functools.cache  # each test reads the same graph (1.5-2 CPU-s of parsing); none changes it
def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def in_core(name: str) -> bool:
    return not name.startswith(ABOVE_THE_CORE)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            # a package's __init__ importing its own submodules is not a circle of the layering
            if w.startswith(v + "."):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_core_imports_nothing_above_it():
    edges = graph()
    upward = sorted(f"{a} -> {b}" for a, targets in edges.items() if in_core(a) for b in targets if not in_core(b))
    assert upward == []


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_graph_sees_real_imports():
    edges = graph()
    # guards the walker itself: a module-level, a function-level and a relative import are all seen
    assert "gpudoctor.model" in edges["gpudoctor.runner"]
    assert "gpudoctor.job.env" in edges["gpudoctor.runner"]  # imported inside a function
    assert "gpudoctor.job.world" in edges["gpudoctor.sample_train.worker"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_smoke_judgement_imports_no_torch():
    """sample_train/judge/ is pure: no torch, and nothing of the torch side above it (docs/architecture.md)."""
    torch_side = {f"gpudoctor.sample_train.{m}" for m in ("bench", "parts", "worker", "launch", "model", "data")}
    edges = graph()
    for name, path in modules().items():
        if name.startswith("gpudoctor.sample_train.judge"):
            tree = ast.parse(path.read_text())
            named = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            named |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not any(m == "torch" or m.startswith("torch.") for m in named), name
            assert not torch_side & edges[name], name


# readers/ and job/ are pure (docs/architecture.md): what a script, a config, a job is. They run nothing and
# render nothing, so they import no probe, runner, report, registry, command or CLI, and no subprocess.
PURE = ("gpudoctor.readers", "gpudoctor.job")
NOT_FROM_PURE = (
    "gpudoctor.probe",
    "gpudoctor.runner",
    "gpudoctor.report",
    "gpudoctor.registry",
    "gpudoctor.cli",
    "gpudoctor.commands",
    "gpudoctor.inputs",
    "gpudoctor.verdict",
)


def _stdlib_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_readers_and_job_are_pure():
    edges = graph()
    mods = modules()
    pure = [name for name in edges if name.startswith(PURE)]
    assert "gpudoctor.readers.sbatch.reader" in pure and "gpudoctor.job.target" in pure  # the walker sees them
    impure = sorted(f"{a} -> {b}" for a in pure for b in edges[a] if b.startswith(NOT_FROM_PURE))
    assert impure == []
    runs = sorted(a for a in pure if "subprocess" in _stdlib_imports(mods[a]))
    assert runs == []
