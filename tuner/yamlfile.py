"""Reading the YAML files users hand to the tool (search spaces, exported configs).

Both formats fail the same ways (missing file, broken YAML, wrong fields), and
each failure must be one line that names the file, the place and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tuner.errors import UserError

ModelT = TypeVar("ModelT", bound=BaseModel)


def load_yaml_model(path: Path, model: type[ModelT], what: str, fix: str) -> ModelT:
    """Parse ``path`` into ``model``; ``what`` names the file's role, ``fix`` says how to repair it."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{what} {path} is not valid YAML{where}: {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must be a YAML mapping: {fix}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "top level"
        raise UserError(f"{what} {path} is invalid at {loc} ({first['msg']}): {fix}") from None
