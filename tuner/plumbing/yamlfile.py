"""Reading the YAML files users hand to the tool (search spaces, exported configs).

Both formats fail the same ways (missing file, broken YAML, wrong fields, a
version from a newer tool, a hostile file), and each failure must be one line
that names the file, the place and the fix. Hostile files are bounded before
they cost anything: only a regular file is read (a named pipe would block),
its size is checked before reading, and a tree of aliases
that expands past a node budget ("billion laughs") is refused before pydantic
walks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tuner.errors import ConfigurationError
from tuner.plumbing.readfile import read_capped

ModelT = TypeVar("ModelT", bound=BaseModel)
MAX_FILE_BYTES = 1 << 20
MAX_NODES = 200_000


def load_yaml_model(
    path: Path,
    model: type[ModelT],
    what: str,
    fix: str,
    version: int | None = None,
    trusted: bool = False,
    oldest: int | None = None,
) -> ModelT:
    """Parse ``path`` into ``model``; ``what`` names the file's role, ``fix`` says how to repair it.

    ``trusted``: the file decides what root does (an export, a policy), so
    it must pass the trust rule (tuner.plumbing.trust) before it is read.

    With ``version`` (the newest one this tool reads; ``oldest``, the oldest
    it still reads, defaults to it), a file from another version is refused
    by name rather than by a pydantic field error.
    """
    data = _read(path, what, fix, trusted)
    if version is not None:
        found = data.get("version")
        readable = range(version if oldest is None else oldest, version + 1)
        if not isinstance(found, int) or isinstance(found, bool) or found not in readable:
            reads = f"version {version}" if len(readable) == 1 else f"versions {readable[0]} to {version}"
            raise ConfigurationError(
                f"{what} {path} has version {found!r}, this tool reads {reads}: "
                + ("upgrade powertune, or " if isinstance(found, int) and found > version else "")
                + fix
            )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "top level"
        raise ConfigurationError(f"{what} {path} is invalid at {loc} ({first['msg']}): {fix}") from None


def _read(path: Path, what: str, fix: str, trusted: bool) -> dict[str, Any]:
    raw = read_capped(path, what, MAX_FILE_BYTES, fix, trusted=trusted)
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigurationError(f"{what} {path} is not UTF-8 text: {fix}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigurationError(f"{what} {path} is not valid YAML{where}: {fix}") from None
    except RecursionError:
        raise ConfigurationError(f"{what} {path} is nested too deeply: {fix}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{what} {path} must be a YAML mapping: {fix}")
    if _expanded_nodes(data, MAX_NODES) > MAX_NODES:
        raise ConfigurationError(f"{what} {path} expands to more than {MAX_NODES} values (YAML aliases?): {fix}")
    return data


def _expanded_nodes(data: Any, budget: int) -> int:
    """Count the nodes of ``data`` as if aliases were copied, stopping once past ``budget``."""
    count, stack = 0, [data]
    while stack and count <= budget:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count
