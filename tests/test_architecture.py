"""The layout itself: rooms import only downwards, and long functions say why they are long."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "lace"

# Rooms from the bottom up: world -> embed -> dictionary -> edits -> train -> eval -> report, then the
# experiment layer and what stands on it. A room may import its own rank and below; rooms that share a
# rank (the demo and the study) may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "lazy"),
    ("io", "config", "distributed", "row_random", "progress"),
    ("manifest",),
    ("data",),
    ("encoders",),
    ("embeddings",),
    ("dictionary",),
    ("concepts",),
    ("edits", "local"),
    ("losses", "provenance"),
    ("train",),
    ("eval",),
    ("report",),
    ("experiment",),
    ("demo", "study", "explore"),
    ("commands",),
    ("cli", "__init__"),
    ("__main__",),
)
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}
LONG_FUNCTION_LINES = 60
REASON_MARK = "# long:"


def _room(path: Path, source: Path = SOURCE) -> str:
    return path.relative_to(source).parts[0].removesuffix(".py")


def _imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lace" and len(parts) > 1:
                rooms.add(parts[1])
    return rooms


def import_edges(source: Path = SOURCE) -> dict[tuple[str, str], list[str]]:
    """(room, imported room) -> the files making that import, for every cross-room import under `source`."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(source.rglob("*.py")):
        room = _room(path, source)
        for other in _imported_rooms(path) - {room}:
            edges.setdefault((room, other), []).append(str(path.relative_to(source)))
    return edges


def upward_imports(edges: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
    """The edges that go to a higher room or to another room of the same rank."""
    return {edge: files for edge, files in edges.items() if RANK[edge[1]] >= RANK[edge[0]]}


def import_cycle(edges) -> list[str] | None:
    """One cycle of rooms (first room repeated at the end), or None."""
    graph: dict[str, set[str]] = {}
    for room, other in edges:
        graph.setdefault(room, set()).add(other)
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> list[str] | None:
        state[room] = 1
        for other in sorted(graph.get(room, ())):
            if state.get(other) == 1:
                return path + [room, other]
            if other not in state and (cycle := visit(other, path + [room])):
                return cycle
        state[room] = 2
        return None

    for room in sorted(graph):
        if room not in state and (cycle := visit(room, [])):
            return cycle
    return None


def test_every_room_has_a_rank():
    rooms = {_room(path) for path in SOURCE.rglob("*.py")}
    assert rooms <= set(RANK), f"rooms without a place in LAYERS: {sorted(rooms - set(RANK))}"


def test_no_room_imports_a_higher_or_sibling_room():
    assert upward_imports(import_edges()) == {}


def test_rooms_have_no_import_cycle():
    assert import_cycle(import_edges()) is None


def _module(path: Path, source: Path = SOURCE) -> str:
    """`lace.eval.neighbours` for eval/neighbours.py, `lace.eval` for eval/__init__.py."""
    parts = ("lace",) + path.relative_to(source).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str], source: Path = SOURCE) -> set[str]:
    """The modules of `modules` that the file at `path` imports anywhere in it (inside functions too).

    `from lace.eval import neighbours` imports the submodule when there is one, else the package.
    """
    package = _module(path, source) if path.name == "__init__.py" else _module(path, source).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return found & modules


def module_edges(source: Path = SOURCE) -> dict[str, dict[str, set[str]]]:
    """By room: module -> the modules of the same room it imports."""
    paths = sorted(source.rglob("*.py"))
    room_of = {_module(path, source): _room(path, source) for path in paths}
    rooms: dict[str, dict[str, set[str]]] = {}
    for path in paths:
        room, module = _room(path, source), _module(path, source)
        imported = _imported_modules(path, set(room_of), source)
        rooms.setdefault(room, {})[module] = {other for other in imported if room_of[other] == room} - {module}
    return rooms


def module_cycles(source: Path = SOURCE) -> dict[str, list[str]]:
    """By room: one cycle of its modules importing each other (first module repeated at the end)."""
    cycles = {}
    for room, graph in module_edges(source).items():
        cycle = import_cycle([(module, other) for module, others in graph.items() for other in others])
        if cycle is not None:
            cycles[room] = cycle
    return cycles


def test_modules_of_a_room_have_no_import_cycle():
    """A circle inside a room (even one closed by an import inside a function) means the modules are one
    module in two files, or a lower piece lives in the wrong file."""
    assert module_cycles() == {}


def test_the_module_check_catches_a_circle_closed_inside_a_function(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "__init__.py").write_text("")
    (tmp_path / "eval" / "search.py").write_text(
        "def search():\n    from lace.eval.index import build\n    return build()\n")
    (tmp_path / "eval" / "index.py").write_text("from lace.eval import search\n")
    (tmp_path / "eval" / "plain.py").write_text("from lace.eval.search import search\n")
    assert module_edges(tmp_path)["eval"] == {
        "lace.eval": set(), "lace.eval.search": {"lace.eval.index"}, "lace.eval.index": {"lace.eval.search"},
        "lace.eval.plain": {"lace.eval.search"}}
    assert module_cycles(tmp_path)["eval"] in (["lace.eval.index", "lace.eval.search", "lace.eval.index"],
                                               ["lace.eval.search", "lace.eval.index", "lace.eval.search"])


def test_the_checks_catch_a_violation(tmp_path):
    """The graph checks can fail: a train module importing the demo goes up and closes a cycle."""
    (tmp_path / "train").mkdir()
    (tmp_path / "demo").mkdir()
    (tmp_path / "train" / "loop.py").write_text("from lace.demo.pipeline import run_demo\n")
    (tmp_path / "demo" / "pipeline.py").write_text("from lace.train import train\n")
    edges = import_edges(tmp_path)
    assert set(upward_imports(edges)) == {("train", "demo")}
    assert import_cycle(edges) in (["demo", "train", "demo"], ["train", "demo", "train"])


WRITER_ROOMS = ("report",)
"""Rooms whose functions write one section each: no long function there, whatever the reason."""


def long_functions_without_reason(source: Path = SOURCE, rooms: tuple[str, ...] = (),
                                  reasons: bool = True) -> list[str]:
    """Functions of more than `LONG_FUNCTION_LINES` lines with no '# long: <reason>' comment
    in the lines right above them (or above their decorators); with `reasons=False`, every long
    function. `rooms`: only those rooms (default: all)."""
    found = []
    for path in sorted(source.rglob("*.py")):
        if rooms and _room(path, source) not in rooms:
            continue
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            above = lines[max(0, first - 4): first - 1]
            explained = reasons and any(line.strip().startswith(REASON_MARK) for line in above)
            if length > LONG_FUNCTION_LINES and not explained:
                found.append(f"{path.relative_to(source)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_long_functions_say_why():
    assert long_functions_without_reason() == []


def test_the_length_check_catches_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONG_FUNCTION_LINES + 1))
    (tmp_path / "long.py").write_text(f"def unexplained():\n{body}\n\n\n# long: one table\ndef explained():\n{body}\n")
    assert [entry.split(" ")[1] for entry in long_functions_without_reason(tmp_path)] == ["unexplained"]


def test_report_writers_are_sections_with_no_long_function():
    assert long_functions_without_reason(rooms=WRITER_ROOMS, reasons=False) == []


def test_the_writer_check_takes_no_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONG_FUNCTION_LINES + 1))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "long.py").write_text(f"# long: one table\ndef explained():\n{body}\n")
    (tmp_path / "other.py").write_text(f"def unexplained():\n{body}\n")
    found = long_functions_without_reason(tmp_path, rooms=WRITER_ROOMS, reasons=False)
    assert [entry.split(" ")[1] for entry in found] == ["explained"]


SOURCE_REGISTRY = "lace.train.sources"
REGISTRY_NAMES = {"SOURCES", "build_sources", "register_source", "NegativeSource"}
"""What train/ may take from the registry: the table, the builder, registration and the interface."""


def registry_bypasses(source: Path = SOURCE) -> list[str]:
    """Modules of train/ other than the registry (`lace.train.sources`) that import a source module, or a source
    class through the registry: a run must build its sources only through `build_sources`, so the loop never learns
    which kinds exist. `lace.train.sources.base` (the interface) is open to all."""
    paths = sorted((source / "train").rglob("*.py"))
    modules = {_module(path, source) for path in sorted(source.rglob("*.py"))}
    source_modules = {module for module in modules
                      if module.startswith(SOURCE_REGISTRY + ".") and module != SOURCE_REGISTRY + ".base"}
    found = []
    for path in paths:
        module = _module(path, source)
        if module == SOURCE_REGISTRY:
            continue
        where = str(path.relative_to(source))
        found += [f"{where} imports {name}" for name in sorted(_imported_modules(path, modules, source) & source_modules)]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == SOURCE_REGISTRY:
                found += [f"{where} imports {SOURCE_REGISTRY}.{alias.name}" for alias in node.names
                          if alias.name not in REGISTRY_NAMES and f"{SOURCE_REGISTRY}.{alias.name}" not in modules]
    return found


def test_train_builds_its_sources_only_through_the_registry():
    assert (SOURCE / "train" / "sources" / "__init__.py").is_file()
    assert registry_bypasses() == []


def test_the_registry_check_catches_a_source_built_outside_it(tmp_path):
    sources = tmp_path / "train" / "sources"
    sources.mkdir(parents=True)
    (sources / "__init__.py").write_text("from lace.train.sources.toy import Toy\nSOURCES = {'toy': Toy}\n")
    (sources / "base.py").write_text("class NegativeSource:\n    pass\n")
    (sources / "toy.py").write_text("from lace.train.sources.base import NegativeSource\nclass Toy(NegativeSource):\n"
                                    "    pass\n")
    (tmp_path / "train" / "loop.py").write_text("from lace.train.sources import SOURCES, build_sources\n")
    assert registry_bypasses(tmp_path) == []
    (tmp_path / "train" / "loop.py").write_text("from lace.train.sources.toy import Toy\n")
    (tmp_path / "train" / "paths.py").write_text("def embed():\n    from lace.train.sources import Toy\n")
    (sources / "other.py").write_text("from lace.train.sources import toy\n")
    assert registry_bypasses(tmp_path) == ["train/loop.py imports lace.train.sources.toy",
                                           "train/paths.py imports lace.train.sources.Toy",
                                           "train/sources/other.py imports lace.train.sources.toy"]
