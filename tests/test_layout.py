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
    """README's Architecture diagram: each module named on it, with its line (0 = the top)."""
    text = (REPO / "README.md").read_text().split("## Architecture", 1)[1]
    block = [line for line in text.split("\n- ", 1)[0].splitlines() if line.startswith("    ")]
    lines = {}
    for number, line in enumerate(block):
        for word in line.split():
            if word.endswith((".py", "/")):
                assert (REPO / "tuner" / word).exists(), f"README names tuner/{word}, which does not exist"
                lines[word] = number
    return lines


def test_readme_architecture_matches_the_imports():
    diagram = _diagram()
    units = {_unit(p) for p in (REPO / "tuner").rglob("*.py")} - {"__init__.py", "__main__.py"}
    assert units - diagram.keys() == set(), "modules missing from README's Architecture diagram"
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
