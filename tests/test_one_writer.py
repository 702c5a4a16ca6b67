"""One way to write: every file the product writes goes through tuner/plumbing/atomicfile.py.

The package's source (tuner/ and runners/) is parsed and every call that
could create, change, move or remove a file outside that module fails this
test, unless it is in ALLOWED with the reason it is not a file write.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRITER = "tuner/plumbing/atomicfile.py"

# Methods that write on a path or handle, whatever the receiver (pathlib, matplotlib, numpy, torch, onnx).
WRITE_METHODS = {
    "write_text",
    "write_bytes",
    "mkdir",
    "touch",
    "savefig",
    "symlink_to",
    "hardlink_to",
    "rmdir",
    "to_csv",
    "tofile",
    "mkstemp",
    "mkdtemp",
}
# module.function calls that write.
WRITE_CALLS = (
    {
        ("os", name)
        for name in (
            "mkdir",
            "makedirs",
            "rename",
            "renames",
            "replace",
            "unlink",
            "remove",
            "removedirs",
            "rmdir",
            "symlink",
            "link",
            "chmod",
            "chown",
            "lchown",
            "truncate",
            "mkfifo",
            "mknod",
            "fchmod",
        )
    }
    | {("shutil", name) for name in ("copy", "copy2", "copyfile", "copytree", "copymode", "copystat", "move", "rmtree")}
    | {
        ("tempfile", name)
        for name in (
            "mkstemp",
            "mkdtemp",
            "NamedTemporaryFile",
            "TemporaryFile",
            "TemporaryDirectory",
            "SpooledTemporaryFile",
        )
    }
    | {("np", "save"), ("np", "savez"), ("numpy", "save"), ("torch", "save"), ("onnx", "save"), ("sqlite3", "connect")}
)
WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}

# (file, what) -> why it is not a file this tool writes.
ALLOWED = {
    ("tuner/devices/jetson/sysfs.py", "os.open"): "a board attribute under /sys (hardware, never created)",
    ("tuner/storage/sqlite.py", "sqlite3.connect"): "opened with mode=ro to see whether a study is there",
    ("tuner/serve/rates.py", "os.unlink"): "the governor's own unix socket, removed only if it is still that socket",
    ("tuner/measure/loadgen_run.py", ".outdir="): "LoadGen writes into atomicfile.private_folder, moved by move_file",
    ("tuner/measure/tokens.py", ".outdir="): "LoadGen writes into atomicfile.private_folder, moved by move_file",
}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _mode(call: ast.Call) -> str | None:
    """The mode string of an ``open(...)`` / ``Path.open(...)`` / ``os.fdopen`` call, if written literally."""
    args = [*call.args[1:2]] if _name(call.func) in ("open", "io.open", "os.fdopen") else [*call.args[0:1]]
    args += [k.value for k in call.keywords if k.arg == "mode"]
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return "?"
    return None


def _flags(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in WRITE_FLAGS}


def writes_in(source: str) -> list[tuple[int, str]]:
    """Every call in ``source`` that could write a file: (line, what)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr in ("outdir", "log_dir_path"):
                    found.append((node.lineno, f".{target.attr}="))
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name.startswith("atomicfile."):
            continue
        parts = tuple(name.split("."))
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if name in ("open", "io.open", "os.fdopen") or (method == "open" and name not in ("os.open",)):
            mode = _mode(node)
            if mode is not None and (mode == "?" or set(mode) & set("wax+")):
                found.append((node.lineno, f"{name}(mode={mode!r})"))
        elif name == "os.open":
            if _flags(node) or (len(node.args) > 1 and not isinstance(node.args[1], ast.Attribute | ast.BinOp)):
                found.append((node.lineno, "os.open"))
        elif len(parts) >= 2 and parts[-2:] in WRITE_CALLS:
            found.append((node.lineno, ".".join(parts[-2:])))
        elif method in WRITE_METHODS:
            found.append((node.lineno, f".{method}("))
    return found


def test_the_scanner_sees_each_kind_of_write():
    source = "\n".join(
        [
            "open(p, 'w')",
            "open(p, mode='ab')",
            "p.open('x')",
            "Path(p).write_text('x')",
            "p.write_bytes(b'')",
            "os.open(p, os.O_WRONLY | os.O_CREAT)",
            "fig.savefig(p)",
            "shutil.copy(a, b)",
            "shutil.move(a, b)",
            "p.mkdir(parents=True)",
            "os.makedirs(p)",
            "os.replace(a, b)",
            "tempfile.mkdtemp()",
            "torch.save(m, p)",
            "settings.log_output.outdir = p",
        ]
    )
    assert len(writes_in(source)) == 15
    assert writes_in("open(p)\nopen(p, 'rb')\nos.open(p, os.O_RDONLY)\np.read_text()\ns.replace('a', 'b')") == []


def test_no_product_code_writes_a_file_outside_the_one_writer():
    stray = []
    for root in ("tuner", "runners"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == WRITER:
                continue
            for line, what in writes_in(path.read_text()):
                if (rel, what) not in ALLOWED:
                    stray.append(f"{rel}:{line}: {what}")
    assert stray == [], "write through tuner.plumbing.atomicfile instead:\n" + "\n".join(stray)


def test_every_allowed_exception_is_still_there():
    for (rel, what), _why in ALLOWED.items():
        assert any(w == what for _, w in writes_in((REPO / rel).read_text())), f"{rel}: {what} is gone; drop it"
