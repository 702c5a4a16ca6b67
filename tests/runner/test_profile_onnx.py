"""ONNX files profiled from their graph: FLOPs and bytes per layer without the onnx package."""

import struct

import pytest

from runners.profile_onnx import profile_onnx
from tuner.errors import UserError
from tuner.models import model_profile


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _f(num: int, payload: bytes | int | str) -> bytes:
    """One protobuf field: ints as varints, text and messages length-delimited."""
    if isinstance(payload, int):
        return _varint(num << 3) + _varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, dims: list[int]) -> bytes:
    count = 1
    for d in dims:
        count *= d
    return b"".join(_f(1, d) for d in dims) + _f(2, 1) + _f(8, name) + _f(9, struct.pack(f"<{count}f", *[0.0] * count))


def _value_info(name: str, dims: list[int | str], elem: int = 1) -> bytes:
    """A ValueInfoProto: a str dimension is symbolic (dim_param), as exporters write a dynamic axis."""
    shape = b"".join(_f(1, _f(2, d) if isinstance(d, str) else _f(1, d)) for d in dims)
    return _f(1, name) + _f(2, _f(1, _f(1, elem) + _f(2, shape)))


def _node(op: str, ins: list[str], outs: list[str], ints: dict | None = None) -> bytes:
    body = b"".join(_f(1, i) for i in ins) + b"".join(_f(2, o) for o in outs) + _f(3, f"{op}_0") + _f(4, op)
    for name, values in (ints or {}).items():
        if isinstance(values, list):
            body += _f(5, _f(1, name) + _f(8, b"".join(_varint(v) for v in values)) + _f(20, 7))
        else:
            body += _f(5, _f(1, name) + _f(3, values) + _f(20, 2))
    return body


def tiny_cnn_onnx(path, batch: int | str = 1, elem: int = 1):
    """Conv(3->8, 3x3, pad 1) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(8->10) on a 3x16x16 input.

    ``batch`` a str: a dynamic batch axis of that name, on the input, the output and (as onnx's shape
    inference writes them) every intermediate's value_info; ``elem``: the input's ONNX element type.
    """
    infos = (
        []
        if isinstance(batch, int)
        else [
            _f(13, _value_info(name, [batch, *dims]))
            for name, dims in (("c", [8, 16, 16]), ("r", [8, 16, 16]), ("g", [8, 1, 1]), ("f", [8]))
        ]
    )
    graph = b"".join(
        [
            _f(1, _node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]})),
            _f(1, _node("Relu", ["c"], ["r"])),
            _f(1, _node("GlobalAveragePool", ["r"], ["g"])),
            _f(1, _node("Flatten", ["g"], ["f"], {"axis": 1})),
            _f(1, _node("Gemm", ["f", "w2", "b2"], ["y"], {"transB": 1})),
            _f(2, "tiny"),
            _f(5, _tensor("w", [8, 3, 3, 3])),
            _f(5, _tensor("b", [8])),
            _f(5, _tensor("w2", [10, 8])),
            _f(5, _tensor("b2", [10])),
            _f(11, _value_info("x", [batch, 3, 16, 16], elem)),
            _f(12, _value_info("y", [batch, 10])),
            *infos,
        ]
    )
    path.write_bytes(_f(1, 8) + _f(7, graph))
    return path


def test_onnx_graph_gives_flops_and_bytes_per_layer(tmp_path):
    profile = profile_onnx(tiny_cnn_onnx(tmp_path / "tiny.onnx"))
    ops = [layer.op for layer in profile.layers]
    assert ops == ["conv2d", "relu", "avgpool", "gemm"]
    conv, relu, _, gemm = profile.layers
    assert conv.flops == 2 * 8 * 16 * 16 * 3 * 3 * 3 and conv.weight_bytes == (8 * 27 + 8) * 4
    assert conv.act_bytes == (3 * 16 * 16 + 8 * 16 * 16) * 4 and conv.matmul
    assert relu.flops == 8 * 16 * 16
    assert gemm.flops == 2 * 10 * 8 and gemm.weight_bytes == (80 + 10) * 4
    assert profile.input_shape == [3, 16, 16] and profile.task == "onnx"


def test_model_profile_says_where_a_profile_comes_from(tmp_path):
    profile, source = model_profile(str(tiny_cnn_onnx(tmp_path / "net.onnx")))
    assert profile is not None and "ONNX graph" in source
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\xff\xff\xff")
    assert model_profile(str(bad))[0] is None
    with pytest.raises(UserError, match="cannot read the ONNX graph"):
        profile_onnx(bad)
    assert model_profile("resnet50")[1].startswith("committed profile")


def test_torch_exported_onnx_is_profiled(tmp_path):
    """Where torch and onnx are installed: a real exporter's file is read the same way."""
    torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    pytest.importorskip("onnx", reason="needs onnx (pip install onnx)")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten())
    path = tmp_path / "exported.onnx"
    torch.onnx.export(model, torch.randn(1, 3, 16, 16), str(path), dynamo=False)
    conv = next(layer for layer in profile_onnx(path).layers if layer.op == "conv2d")
    assert conv.flops == 2 * 8 * 16 * 16 * 27


def test_a_dynamic_batch_axis_resolves_to_the_batch_profiled_everywhere_in_the_graph(tmp_path):
    """Symbolic dims on the input and on every intermediate (onnx's inference writes them) count as the batch."""
    fixed = profile_onnx(tiny_cnn_onnx(tmp_path / "fixed.onnx"))
    dynamic = profile_onnx(tiny_cnn_onnx(tmp_path / "dynamic.onnx", batch="batch"))
    assert [layer.model_dump() for layer in dynamic.layers] == [layer.model_dump() for layer in fixed.layers]
    assert dynamic.input_shape == [3, 16, 16]
    unnamed = profile_onnx(tiny_cnn_onnx(tmp_path / "unnamed.onnx", batch=""))
    assert unnamed.flops_per_sample == fixed.flops_per_sample


def test_a_symbolic_dim_beyond_the_batch_axis_needs_a_stated_value(tmp_path):
    graph = b"".join(
        [
            _f(1, _node("Relu", ["x"], ["y"])),
            _f(11, _value_info("x", ["batch", "seq"])),
            _f(12, _value_info("y", ["batch", "seq"])),
        ]
    )
    path = tmp_path / "seq.onnx"
    path.write_bytes(_f(1, 8) + _f(7, graph))
    with pytest.raises(UserError, match="symbolic dimension 'seq' at axis 1"):
        profile_onnx(path)
    assert profile_onnx(path, dims={"seq": 128}).layers[0].flops == 128
