"""The CLI's shape: one plain module-level function per command, short functions, each option declared once."""

import ast
import inspect
from collections import Counter
from pathlib import Path

import typer.main

import tuner.cli
from tuner.cli import app

CLI = Path(tuner.cli.__file__).parent
LONGEST = 60  # lines of a function in tuner/cli/, its signature and docstring included


def _trees() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text()) for path in sorted(CLI.glob("*.py"))}


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_no_function_in_the_cli_is_longer_than_the_limit():
    long = [
        f"{name}:{f.name} ({f.end_lineno - f.lineno + 1} lines)"
        for name, tree in _trees().items()
        for f in _functions(tree)
        if f.end_lineno - f.lineno + 1 > LONGEST
    ]
    assert not long, f"split these (at most {LONGEST} lines each): {long}"


def test_every_command_is_a_module_level_function_of_the_cli():
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        function = inspect.unwrap(command.callback)
        assert "<locals>" not in function.__qualname__, f"tune {name} is a closure: {function.__qualname__}"
        module = inspect.getmodule(function)
        assert module.__name__.startswith("tuner.cli."), name
        assert inspect.unwrap(getattr(module, function.__name__)) is function, name


def test_no_command_is_registered_inside_a_function():
    for name, tree in _trees().items():
        for outer in _functions(tree):
            for inner in _functions(outer):
                decorators = [ast.unparse(d) for d in inner.decorator_list]
                assert not any("command" in d for d in decorators), f"{name}:{outer.name} registers {inner.name}"


def _declarations(tree: ast.Module) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "typer"
        and n.func.attr in ("Option", "Argument")
    ]


def test_options_are_declared_once_and_never_inside_a_signature():
    seen: Counter[str] = Counter()
    for name, tree in _trees().items():
        for function in _functions(tree):
            for default in function.args.defaults + [d for d in function.args.kw_defaults if d is not None]:
                assert not _declarations(ast.Module(body=[ast.Expr(default)], type_ignores=[])), (
                    f"{name}:{function.name} declares an option in its signature: name it in tuner/cli/options.py "
                    "(shared) or beside the command"
                )
        for call in _declarations(tree):
            flags = [ast.unparse(a) for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
            help_text = next((ast.unparse(k.value) for k in call.keywords if k.arg == "help"), "")
            seen[f"{flags} {help_text}"] += 1
    repeated = [key for key, count in seen.items() if count > 1]
    assert not repeated, f"declared more than once (share one in tuner/cli/options.py): {repeated}"
