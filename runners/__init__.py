"""Workloads: the model zoo, user PyTorch models, ONNX files, TensorRT engines, and FLOP/byte profiles.

Importing this package stays free of torch and onnxruntime; make_runner
imports the one a model needs.
"""

from runners.base import Runner
from runners.factory import make_runner

__all__ = ["Runner", "make_runner"]
