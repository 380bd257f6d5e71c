"""The package's import graph: no cycles among modules or among packages, and each package
or top-level module imports only what lies below it on the road (README, "What is in it").

Every ``import`` and ``from ... import`` of every module under ``bert_jax/`` counts, at module
level and inside functions alike (a deferred import is still a dependency)."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "bert_jax"

# The road, lowest stage first: each package or top-level module ("unit", the first name
# under bert_jax; "" is bert_jax/__init__.py) imports only units on stages below its own,
# never one beside or above it. Every unit of the package is on it (a new one must be placed).
ROAD: list[set[str]] = [
    {"errors", "allocator", "shutdown"},         # process start and end: stdlib only
    {"storage"},                                 # every user path, local or gs://
    {"fileio", "textio", "protowire", "validation", "xla_flags", "compilation_cache"},
    {"config", "startup", "corpus", "sharding"},  # config: model config, pure data
    {"", "kernels", "parallel", "tokenization"},
    {"modeling", "data"},                        # encoder and heads; tf.data pipeline
    {"checkpoint"},
    {"runs", "inference"},                       # what every run shares; embed, fill-mask
    {"training", "tasks"},                       # pretraining; task definitions
    {"finetuning"},                              # trainer, buckets, evaluate
    {"analysis", "tpu"},
    {"cli"},                                     # the bert-jax command
    {"__main__"},
]
STAGE = {unit: stage for stage, units in enumerate(ROAD) for unit in units}
# config.py is pure data: of bert_jax, it imports only errors and, to read and write its
# JSON files wherever they are, the storage layer.
CONFIG_MAY_IMPORT = {"bert_jax.errors", "bert_jax.storage", "bert_jax.fileio"}
# The storage layer: the only modules that open, list, rename or delete paths with os, open,
# shutil or glob. Elsewhere a line that does so must say why the path is always local
# (``# local: <reason>``: a staging folder, a system file, this machine's cache).
STORAGE_LAYER = {"bert_jax.storage", "bert_jax.fileio"}
FILE_OPERATIONS = re.compile(
    r"(?<![\w.])open\(|\bos\.(makedirs|mkdir|rename|replace|remove|unlink|rmdir|listdir|scandir|"
    r"walk|stat|utime|chmod|fdopen)\(|\bos\.path\.(exists|isdir|isfile|getsize|getmtime|"
    r"samefile)\(|\bshutil\.\w+\(|\bglob\.glob\(|\bpathlib\.Path\(")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The bert_jax module an imported dotted name refers to (a module, or a name inside
    one), or None outside the package."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The bert_jax modules ``module`` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module pkg.mod where there is one, else a
            # name defined by pkg (its __init__ for a package).
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.add(target)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    # Importing bert_jax.x.y runs bert_jax/x/__init__.py first; that edge is Python's, not the
    # module's: only written imports count.
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def unit(module: str) -> str:
    """The package or top-level module (its name under bert_jax) a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between units: one arrow for any import between their modules."""
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        units.setdefault(unit(module), set()).update(
            unit(t) for t in targets if unit(t) != unit(module))
    return units


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def road_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs beside or back up the road, and each of config.py's imports
    beyond what pure data may use."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = unit(module), unit(target)
            if here != there and STAGE[there] >= STAGE[here]:
                found.append(f"{module} imports {target}")
            elif module == "bert_jax.config" and target not in CONFIG_MAY_IMPORT:
                found.append(f"{module} imports {target}")
    return found


def test_the_graph_sees_every_kind_of_import():
    """Absolute, relative and function-level imports are all edges (the checker is able to
    fail)."""
    graph = import_graph()
    assert "bert_jax.errors" in graph["bert_jax.config"]
    assert "bert_jax.kernels.fused_norm" in graph["bert_jax.modeling.encoder"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert road_violations({"bert_jax.kernels.flash": {"bert_jax.modeling.ops"},
                            "bert_jax.config": {"bert_jax.parallel", "bert_jax.storage"},
                            "bert_jax.training.loop": {"bert_jax.tasks.glue"},
                            "bert_jax.cli.pretrain": {"bert_jax.training.loop"}}) == [
        "bert_jax.config imports bert_jax.parallel",
        "bert_jax.kernels.flash imports bert_jax.modeling.ops",
        "bert_jax.training.loop imports bert_jax.tasks.glue"]
    assert unit_graph({"bert_jax.a.x": {"bert_jax.b.y", "bert_jax.a.z"},
                       "bert_jax.b.y": {"bert_jax.a.z"}}) == {"a": {"b"}, "b": {"a"}}
    assert find_cycle(unit_graph({"bert_jax.a.x": {"bert_jax.b.y"},
                                  "bert_jax.b.y": {"bert_jax.a.z"}})) == ["a", "b", "a"]


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / "bert_jax" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n    from ..errors import E\n")
    modules = {"bert_jax.sub": pkg / "__init__.py", "bert_jax.sub.a": pkg / "a.py",
               "bert_jax.sub.b": pkg / "b.py", "bert_jax.errors": tmp_path / "e.py"}
    (pkg / "c.py").write_text("from bert_jax.sub import b, name\n")
    assert imports_of("bert_jax.sub.a", pkg / "a.py", modules) == {
        "bert_jax.sub.b", "bert_jax.errors"}
    assert imports_of("bert_jax.sub.c", pkg / "c.py", modules) == {
        "bert_jax.sub.b", "bert_jax.sub"}


def test_no_import_cycles_between_files():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_no_import_cycles_between_packages():
    cycle = find_cycle(unit_graph(import_graph()))
    assert cycle is None, " -> ".join(name or "bert_jax" for name in cycle)


def test_every_package_and_module_is_on_the_road():
    units = {unit(m) for m in _modules()}
    assert units - set(STAGE) == set(), "place these on ROAD"
    assert set(STAGE) - units == set(), "no longer in the package: take these off ROAD"
    assert sum(map(len, ROAD)) == len(STAGE), "a unit is on two stages"


@pytest.mark.parametrize("name", sorted(STAGE))
def test_no_import_runs_back_up_the_road(name):
    graph = import_graph()
    mine = {m: t for m, t in graph.items() if unit(m) == name}
    assert mine, name
    assert road_violations(mine) == []


def file_operations_outside_storage() -> list[str]:
    """``file:line`` of each os/open/shutil/glob file operation outside the storage layer
    that does not say why its path is local."""
    found = []
    for module, path in _modules().items():
        if module in STORAGE_LAYER:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if FILE_OPERATIONS.search(code) and "# local:" not in line:
                found.append(f"{path.relative_to(ROOT.parent)}:{number}: {line.strip()}")
    return found


def test_user_paths_go_through_the_storage_layer():
    assert file_operations_outside_storage() == []


def test_the_storage_rule_sees_file_operations(tmp_path, monkeypatch):
    package = tmp_path / "bert_jax"
    package.mkdir()
    (package / "ok.py").write_text("import os\nos.path.join('a', 'b')\nstorage.exists(p)\n"
                                   "os.makedirs(d)  # local: staging\n")
    (package / "bad.py").write_text("import os, shutil\nwith open(p) as f:\n    pass\n"
                                    "os.listdir(d)\nshutil.rmtree(d)\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", package)
    assert [f.split(":")[1] for f in file_operations_outside_storage()] == ["2", "4", "5"]
