"""Workloads: the model zoo, ONNX files, and their FLOP/byte profiles.

Importing this package stays free of torch and onnxruntime; make_runner
imports the one a model needs.
"""

from runners.base import Runner
from runners.factory import make_runner

__all__ = ["Runner", "make_runner"]
