"""The shipped package stands alone: nothing under tuner/ or runners/ imports the lab around it."""

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTSIDE = {"benchmarks", "scripts", "tests", "tools", "twin_calibration", "twin_checks", "clirun", "conftest"}


def test_product_code_imports_nothing_from_benchmarks_scripts_or_tests():
    offenders = []
    for source in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "runners").rglob("*.py")]):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            offenders += [f"{source.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in OUTSIDE]
    assert offenders == []


HISTORY = re.compile(r"\b(\w+th round|round \d+|calls? \d+\b|issue #?\d+)", re.IGNORECASE)


def _unit(path: Path) -> str:
    """The diagram's name for a module: a top-level file (``study.py``) or a package (``devices/``)."""
    parts = path.relative_to(REPO / "tuner").parts
    return parts[0] if len(parts) == 1 else parts[0] + "/"


def _imported_units(source: Path) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(source.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "tuner" or len(parts) < 2:
                continue
            if (REPO / "tuner" / parts[1]).is_dir():
                units.add(parts[1] + "/")
            elif (REPO / "tuner" / f"{parts[1]}.py").is_file():
                units.add(parts[1] + ".py")
    return units


def _diagram() -> dict[str, int]:
    """docs/architecture.md's diagram: each module named on it, with its line (0 = the top)."""
    text = (REPO / "docs" / "architecture.md").read_text().split("# Architecture", 1)[1]
    block = [line for line in text.split("\n- ", 1)[0].splitlines() if line.startswith("    ")]
    lines = {}
    for number, line in enumerate(block):
        for word in line.split():
            if word.endswith((".py", "/")):
                assert (REPO / "tuner" / word).exists(), f"docs/architecture.md names tuner/{word}: none"
                lines[word] = number
    return lines


def test_readme_architecture_matches_the_imports():
    diagram = _diagram()
    units = {_unit(p) for p in (REPO / "tuner").rglob("*.py")} - {"__init__.py", "__main__.py"}
    assert units - diagram.keys() == set(), "modules missing from docs/architecture.md's diagram"
    upward = []
    for source in sorted((REPO / "tuner").rglob("*.py")):
        unit = _unit(source)
        if unit not in diagram:
            continue
        for target in _imported_units(source) - {unit}:
            if diagram[target] <= diagram[unit]:
                upward.append(f"{source.relative_to(REPO)} imports {target}, drawn on the same line or above")
    assert upward == []


def test_product_docstrings_comments_and_parameter_sources_name_no_round_call_or_issue():
    found = []
    for source in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "runners").rglob("*.py")]):
        text = source.read_text()
        pieces = [
            tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT
        ]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                pieces.append(ast.get_docstring(node) or "")
        found += [f"{source.relative_to(REPO)}: {m.group(0)}" for piece in pieces for m in HISTORY.finditer(piece)]
    for data in sorted([*(REPO / "tuner").rglob("*.json"), *(REPO / "runners").rglob("*.json")]):
        found += [f"{data.relative_to(REPO)}: {m.group(0)}" for m in HISTORY.finditer(data.read_text())]
    assert found == []


def _root(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def test_benchmarks_and_scripts_write_nothing_into_product_objects():
    """A strategy's or twin's settings go through its constructor; no script patches a product object."""
    writes = []
    for source in sorted([*(REPO / "benchmarks").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]):
        tree = ast.parse(source.read_text())
        libraries = {"self"}  # attributes of a script's own objects and of other libraries' modules are its own
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                libraries |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("tuner")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                writes.append(f"{source.relative_to(REPO)}:{node.lineno} setattr")
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and _root(target) not in libraries:
                    writes.append(f"{source.relative_to(REPO)}:{node.lineno} assigns {ast.unparse(target)}")
    assert writes == []


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(module: str, package: str, text: str, modules: set[str]) -> set[str]:
    """The tuner modules a module's text imports anywhere: typing-only, relative and in-function imports too.

    ``from tuner.a import b`` names the submodule tuner.a.b when there is one,
    else tuner.a; a relative import is resolved against ``package``.
    """

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    targets = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets |= {known(a.name) for a in node.names if a.name.split(".")[0] == "tuner"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] == "tuner":
                targets |= {known(f"{base}.{a.name}") for a in node.names}
    return targets - {module}


def _module_graph() -> dict[str, set[str]]:
    """Each module under tuner/ with the tuner modules it imports."""
    files = {_module(p): p for p in (REPO / "tuner").rglob("*.py")}
    return {
        module: _imports(
            module, module if path.name == "__init__.py" else module.rpartition(".")[0], path.read_text(), set(files)
        )
        for module, path in files.items()
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_circle_between_any_two_modules_of_tuner():
    """Imports flow one way inside a package too; an import only for typing still counts."""
    assert _circles(_module_graph()) == []


def test_the_circle_check_sees_typing_only_relative_and_in_function_imports():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    graph = _module_graph()
    assert "tuner.devices.jetson.persist" in graph["tuner.devices.jetson.device"]
    persist, package = "tuner.devices.jetson.persist", "tuner.devices.jetson"
    for text in (
        "if TYPE_CHECKING:\n    from tuner.devices.jetson.device import JetsonDevice",
        "from .device import JetsonDevice",
        "from . import device",
        "def f():\n    import tuner.devices.jetson.device",
    ):
        graph[persist] = _imports(persist, package, text, set(graph))
        assert graph[persist] == {"tuner.devices.jetson.device"}, text
        assert _circles(graph) == [["tuner.devices.jetson.device", "tuner.devices.jetson.persist"]], text


MAX_MODULE_LINES = 500


def test_no_module_of_the_package_is_over_500_lines():
    """A module longer than that has several jobs."""
    over = {}
    for source in sorted([*(REPO / "tuner").rglob("*.py"), *(REPO / "runners").rglob("*.py")]):
        name = str(source.relative_to(REPO))
        lines = len(source.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            over[name] = lines
    assert over == {}, f"over {MAX_MODULE_LINES} lines: split them"


MAX_FLOORS = 10


def _unit_graph() -> dict[str, set[str]]:
    """The diagram's units (a top-level module or package of tuner/) with the units each imports."""
    graph: dict[str, set[str]] = {}
    for source in (REPO / "tuner").rglob("*.py"):
        unit = _unit(source)
        if unit in ("__init__.py", "__main__.py"):
            continue
        graph.setdefault(unit, set()).update(_imported_units(source) - {unit, "__init__.py", "__main__.py"})
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    return graph


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports, top first: its length is the number of floors the units stand on."""
    below: dict[str, list[str]] = {}

    def chain(unit: str) -> list[str]:
        if unit not in below:
            below[unit] = [unit, *max((chain(t) for t in sorted(graph[unit])), key=len, default=[])]
        return below[unit]

    return max((chain(u) for u in sorted(graph)), key=len, default=[])


def test_the_package_stands_on_at_most_10_floors_of_imports():
    """Each floor is a unit importing one below it; plumbing (tuner/plumbing/) is one floor, not four."""
    chain = _longest_chain(_unit_graph())
    assert len(chain) <= MAX_FLOORS, f"{len(chain)} floors: " + " -> ".join(chain)


def test_the_floors_are_the_longest_chain_of_imports():
    assert _longest_chain({"a": {"b", "d"}, "b": {"c"}, "c": set(), "d": set()}) == ["a", "b", "c"]
    assert len(_longest_chain(_unit_graph())) >= 3  # launch.py -> cli/ -> ... -> errors.py at the least
