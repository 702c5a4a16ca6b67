"""The shipped package stands alone: nothing under tuner/ or runners/ imports the lab around it."""

import ast
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
