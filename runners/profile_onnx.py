"""Per-layer FLOPs and bytes of an ONNX model, read from its graph: the roofline's view of a user's model.

A user's .onnx file has no committed profile. Its graph says enough: every
node's operator, its weights (initializers) and, with shapes propagated from
the graph inputs, its activations. The file is read with a small protobuf
decoder, so the core install needs neither ``onnx`` nor ``onnxruntime``; when
the ``onnx`` package is installed, its shape inference fills in the shapes of
operators this module does not propagate itself.

Counting rules follow runners/profiling.py (the zoo's): 2 x multiply-adds for
Conv, Gemm and MatMul; one FLOP per output element for element-wise
operators; the window size per output element for pooling; weights are the
initializers a node reads, activations its other inputs and its outputs, per
sample at fp32. A node whose shapes cannot be known counts no FLOPs and is
named in the profile's notes.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

from runners.profile import LayerProfile, ModelProfile
from tuner.errors import UserError

FP32 = 4
ELEMENTWISE = {
    "Relu", "Sigmoid", "Tanh", "Add", "Sub", "Mul", "Div", "Clip", "BatchNormalization", "Softmax", "Erf",
    "Sqrt", "Pow", "Gelu", "LayerNormalization", "LeakyRelu", "HardSigmoid", "HardSwish", "Exp", "Neg",
    "Abs", "Cast", "Identity", "Dropout", "Elu", "Selu", "Softplus", "Mish", "PRelu", "Reciprocal",
    "InstanceNormalization", "Where", "Max", "Min",
}  # fmt: skip
NO_WORK = {"Shape", "Constant", "Gather", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Concat"}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of one protobuf message; length-delimited values stay bytes."""
    out: list[tuple[int, int, object]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((field, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _ints(entries: list[tuple[int, int, object]], field: int) -> list[int]:
    """A repeated int64 field, packed or not."""
    out: list[int] = []
    for f, wire, value in entries:
        if f != field:
            continue
        if wire == 0:
            out.append(_signed(value))
        else:
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos)
                out.append(_signed(v))
    return out


def _str(entries: list[tuple[int, int, object]], field: int) -> str:
    return next((bytes(v).decode() for f, _, v in entries if f == field), "")


def _tensor(buf: bytes) -> tuple[str, list[int], list[int] | None]:
    """Name, dims and (for int64 tensors) values of a TensorProto."""
    entries = _fields(buf)
    dims = _ints(entries, 1)
    dtype = next((v for f, _, v in entries if f == 2), 0)
    values = None
    if dtype == 7:
        raw = next((v for f, _, v in entries if f == 9), None)
        values = list(struct.unpack(f"<{len(raw) // 8}q", raw)) if raw is not None else _ints(entries, 7)
    return _str(entries, 8), dims, values


Dim = int | str  # a fixed size, or a symbol ("" where the file names none)


def _shape(value_info: bytes) -> tuple[str, list[Dim] | None, int]:
    """Name, shape (a symbol where a dimension is not fixed) and element type of a ValueInfoProto."""
    entries = _fields(value_info)
    name = _str(entries, 1)
    for f, _, t in entries:
        if f != 2:
            continue
        for f2, _, tensor in _fields(t):
            if f2 != 1:
                continue
            fields = _fields(tensor)
            elem_type = next((int(v) for f3, w, v in fields if f3 == 1 and w == 0), 0)
            for f3, _, shape in fields:
                if f3 != 2:
                    continue
                dims: list[Dim] = []
                for f4, _, dim in _fields(shape):
                    if f4 == 1:
                        d = _fields(dim)
                        value = next((v for f5, w, v in d if f5 == 1 and w == 0), None)
                        dims.append(_str(d, 2) if value is None else _signed(int(value)))
                return name, dims, elem_type
            return name, None, elem_type
    return name, None, 0


def graph_inputs(path: Path) -> list[tuple[str, list[Dim] | None, int]]:
    """The graph's inputs (initializers aside): name, shape with its symbols, ONNX element type.

    Read from the file itself, so the space can follow what the file fixes
    (its input types) before anything runs, without onnxruntime.
    """
    try:
        graph = _fields(next(v for f, _, v in _fields(path.read_bytes()) if f == 7))
    except (OSError, StopIteration, ValueError, IndexError) as exc:
        raise UserError(f"cannot read the ONNX graph of {path}: {exc or 'no graph'}") from None
    initialized = {_tensor(v)[0] for f, _, v in graph if f == 5}
    return [_shape(v) for f, _, v in graph if f == 11 and _shape(v)[0] not in initialized]


def _resolved(shape: list[Dim] | None, symbols: dict[str, int]) -> list[int] | None:
    """A shape with every symbol replaced by its value; None while any symbol has none (left to propagation)."""
    if shape is None:
        return None
    out = [d if isinstance(d, int) else symbols.get(d) for d in shape]
    return None if any(d is None or d < 0 for d in out) else out  # type: ignore[misc]


def _attributes(entries: list[tuple[int, int, object]]) -> dict[str, object]:
    attrs: dict[str, object] = {}
    for f, _, value in entries:
        if f != 5:
            continue
        a = _fields(value)
        name = _str(a, 1)
        ints = _ints(a, 8)
        if ints:
            attrs[name] = ints
        elif any(f2 == 3 for f2, _, _ in a):
            attrs[name] = _signed(next(v for f2, _, v in a if f2 == 3))
        elif any(f2 == 5 for f2, _, _ in a):
            attrs[name] = _tensor(next(v for f2, _, v in a if f2 == 5))
    return attrs


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        out.append(max(dims))
    return out


def _infer(op: str, ins: list[list[int] | None], attrs: dict, consts: dict, names: list[str]) -> list[int] | None:
    """Output shape of the operators that matter for FLOPs and bytes; None if it cannot be known here."""
    x = ins[0] if ins else None
    if op in ELEMENTWISE:
        known = [s for s in ins if s is not None]
        return _broadcast(known) if known else None
    if x is None:
        return None
    if op == "Conv" and len(ins) > 1 and ins[1] is not None:
        w = ins[1]
        k = w[2:]
        strides = attrs.get("strides", [1] * len(k))
        pads = attrs.get("pads", [0] * 2 * len(k))
        dil = attrs.get("dilations", [1] * len(k))
        spatial = [
            (x[2 + i] + pads[i] + pads[i + len(k)] - dil[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(len(k))
        ]
        return [x[0], w[0], *spatial]
    if op in ("MaxPool", "AveragePool"):
        k = attrs.get("kernel_shape", [1, 1])
        strides = attrs.get("strides", [1] * len(k))
        pads = attrs.get("pads", [0] * 2 * len(k))
        spatial = [(x[2 + i] + pads[i] + pads[i + len(k)] - k[i]) // strides[i] + 1 for i in range(len(k))]
        return [x[0], x[1], *spatial]
    if op == "GlobalAveragePool":
        return [x[0], x[1], *([1] * (len(x) - 2))]
    if op == "Flatten":
        axis = attrs.get("axis", 1)
        return [math.prod(x[:axis]), math.prod(x[axis:])]
    if op == "Gemm" and ins[1] is not None:
        rows = x[1] if attrs.get("transA") else x[0]
        cols = ins[1][0] if attrs.get("transB") else ins[1][1]
        return [rows, cols]
    if op == "MatMul" and ins[1] is not None:
        a, b = x, ins[1]
        return [*_broadcast([a[:-2] or [1], b[:-2] or [1]]), a[-2], b[-1]] if len(a) > 1 else [b[-1]]
    if op == "Reshape" and len(names) > 1 and names[1] in consts:
        target = list(consts[names[1]])
        total = math.prod(x)
        target = [x[i] if t == 0 else t for i, t in enumerate(target)]
        if -1 in target:
            target[target.index(-1)] = total // max(math.prod(t for t in target if t != -1), 1)
        return target
    if op == "Transpose":
        perm = attrs.get("perm", list(range(len(x)))[::-1])
        return [x[p] for p in perm]
    return None


def _infer_with_onnx(data: bytes) -> bytes:
    """Shapes from the onnx package's inference where it is installed (an optional extra), else the file as is."""
    try:
        import onnx
        from onnx import shape_inference
    except ImportError:
        return data
    try:
        return shape_inference.infer_shapes(onnx.load_from_string(data)).SerializeToString()
    except Exception:  # a model onnx cannot infer is still read with this module's own propagation
        return data


def profile_onnx(path: Path, batch: int = 1, dims: dict[str, int] | None = None) -> ModelProfile:
    """Profile an ONNX file from its graph (per sample, fp32); unreadable files are a user error.

    Every symbolic dimension resolves to a number before anything is counted:
    a graph input's first axis (the batch axis, whatever its symbol) to
    ``batch``, other symbols to their value in ``dims``. An input symbol with
    no value is refused, as the ONNX runner refuses it; a symbol that only
    intermediate shapes carry leaves those shapes to this module's propagation.
    """
    try:
        data = _infer_with_onnx(path.read_bytes())
        model = _fields(data)
        graph = _fields(next(v for f, _, v in model if f == 7))
    except (OSError, StopIteration, ValueError, IndexError) as exc:
        raise UserError(f"cannot read the ONNX graph of {path}: {exc or 'no graph'}") from None
    weights: dict[str, list[int]] = {}
    consts: dict[str, list[int]] = {}
    for f, _, value in graph:
        if f == 5:
            name, tensor_dims, values = _tensor(value)
            weights[name] = tensor_dims
            if values is not None:
                consts[name] = values
    declared = [_shape(v) for f, _, v in graph if f == 11 and _shape(v)[0] not in weights]
    if not declared or declared[0][1] is None or not declared[0][1]:
        raise UserError(f"{path} declares no input shape: export it with a fixed input shape")
    first_axis = declared[0][1][0]
    if isinstance(first_axis, int) and first_axis > 0:
        batch = first_axis
    symbols = dict(dims or {})
    inputs: dict[str, list[int]] = {}
    for name, shape, _ in declared:
        if not shape:
            continue
        if isinstance(shape[0], str) and shape[0]:
            symbols.setdefault(shape[0], batch)
        for axis, d in enumerate(shape[1:], start=1):
            if not isinstance(d, int) and d not in symbols:
                raise UserError(
                    f"input {name!r} of {path.name} has a symbolic dimension {d or '?'!r} at axis {axis}; "
                    "export it with fixed shapes beyond the batch axis"
                )
        head = shape[0] if isinstance(shape[0], int) else batch
        inputs[name] = [head, *(d if isinstance(d, int) else symbols[d] for d in shape[1:])]
    shapes: dict[str, list[int] | None] = dict(weights)
    for f, _, value in graph:
        if f in (12, 13):
            name, shape, _ = _shape(value)
            if name not in weights:
                shapes[name] = _resolved(shape, symbols)
    shapes.update(inputs)
    first = inputs.get(declared[0][0], [batch])
    layers: list[LayerProfile] = []
    unknown: list[str] = []
    for i, (f, _, value) in enumerate(graph):
        if f != 1:
            continue
        entries = _fields(value)
        op = _str(entries, 4)
        ins = [bytes(v).decode() for f2, _, v in entries if f2 == 1]
        outs = [bytes(v).decode() for f2, _, v in entries if f2 == 2]
        attrs = _attributes(entries)
        if op == "Constant" and outs and isinstance(attrs.get("value"), tuple):
            _, const_dims, values = attrs["value"]
            shapes[outs[0]] = const_dims
            if values is not None:
                consts[outs[0]] = values
            continue
        in_shapes = [shapes.get(n) for n in ins if n]
        out_shape = shapes.get(outs[0]) if outs else None
        if out_shape is None:
            out_shape = _infer(op, in_shapes, attrs, consts, ins)
        if outs:
            shapes[outs[0]] = out_shape
        layer = _layer(_str(entries, 3) or f"{op.lower()}_{i}", op, ins, in_shapes, out_shape, weights, batch, attrs)
        if layer is None:
            if op not in NO_WORK:
                unknown.append(op)
            continue
        layers.append(layer)
    if not layers:
        raise UserError(f"{path}: no operator with known shapes was found in the graph")
    notes = "per sample at fp32, read from the ONNX graph"
    if unknown:
        notes += f"; no FLOPs counted for {len(unknown)} node(s) of unknown shape ({', '.join(sorted(set(unknown)))})"
    return ModelProfile(
        model=path.stem,
        task="onnx",
        input_shape=[d for d in first[1:]],
        generated_by=f"runners.profile_onnx from {path.name}",
        notes=notes,
        layers=layers,
    )


def _layer(
    name: str,
    op: str,
    ins: list[str],
    in_shapes: list[list[int] | None],
    out: list[int] | None,
    weights: dict[str, list[int]],
    batch: int,
    attrs: dict,
) -> LayerProfile | None:
    if op in NO_WORK or out is None:
        return None

    def per_sample(shape: list[int]) -> float:
        total = math.prod(shape) if shape else 1
        return total / batch if shape and shape[0] == batch else total

    w_bytes = sum(math.prod(weights[n]) * FP32 for n in ins if n in weights)
    act = sum(per_sample(s) * FP32 for n, s in zip(ins, in_shapes, strict=False) if n not in weights and s) + (
        per_sample(out) * FP32
    )
    out_elems = per_sample(out)
    if op == "Conv":
        w = in_shapes[1]
        macs = out_elems * math.prod(w[1:])
        return LayerProfile(
            name=name,
            op="conv2d",
            flops=2 * macs,
            weight_bytes=w_bytes,
            act_bytes=act,
            matmul=True,
            op_class=_conv_class(w, attrs),
        )
    if op in ("Gemm", "MatMul"):
        a = in_shapes[0]
        depth = a[0] if op == "Gemm" and attrs.get("transA") else a[-1]
        # a product of two activations is attention's (scores, context); one with a weight is a GEMM
        op_class = "gemm" if op == "Gemm" or any(n in weights for n in ins) else "attention"
        return LayerProfile(
            name=name,
            op=op.lower(),
            flops=2 * out_elems * depth,
            weight_bytes=w_bytes,
            act_bytes=act,
            matmul=True,
            op_class=op_class,
        )
    if op in ("MaxPool", "AveragePool"):
        window = math.prod(attrs.get("kernel_shape", [1]))
        return LayerProfile(name=name, op=op.lower(), flops=out_elems * window, weight_bytes=0.0, act_bytes=act)
    if op == "GlobalAveragePool":
        x = in_shapes[0]
        return LayerProfile(name=name, op="avgpool", flops=per_sample(x), weight_bytes=0.0, act_bytes=act)
    if op in ELEMENTWISE:
        shaped = [s for n, s in zip(ins, in_shapes, strict=False) if n not in weights and s]
        broadcast = len(shaped) == 2 and shaped[0] != shaped[1]
        return LayerProfile(
            name=name,
            op=op.lower(),
            flops=out_elems,
            weight_bytes=w_bytes,
            act_bytes=act,
            op_class="broadcast" if broadcast else "elementwise",
        )
    return None


def _conv_class(weight: list[int], attrs: dict) -> str:
    """The kernel family of a Conv node, by the rules runners/profiling.py applies to the zoo's nn.Conv2d."""
    group = attrs.get("group", 1)
    if isinstance(group, int) and group > 1 and weight[1] == 1:
        return "conv_depthwise"
    if group == 1 and math.prod(weight[2:]) == 1:
        return "conv_pointwise"
    return "conv_dense"
