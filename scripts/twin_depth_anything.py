"""Replay of the scales-hardware devkit's Depth Anything V2 base runs on the AGX Orin twin (a held-out check).

What the source ran (BroncoSpace-Lab/scales-hardware at 510a7bc, docs/ML_Jetson_Performance.md): the
HuggingFace depth-estimation pipeline on depth-anything/Depth-Anything-V2-Base-hf (97.5M parameters), 1,000
test images of CIFAR-100 one at a time (total inference time x FPS = 1,000 in every row), eager PyTorch fp32,
each nvpmodel mode at its defaults. The pipeline's image processor resizes every image to 518 x 518 (the
DPT processor of Depth Anything: size 518, keep_aspect_ratio, ensure_multiple_of 14; a square 32 x 32 image
becomes 518 x 518), so the encoder sees 37 x 37 = 1369 patches plus the class token.

The layer table is built from the architecture (no torch needed):
- encoder: DINOv2 ViT-B/14 (Depth Anything V2's README model_configs 'vitb'; DINOv2 paper, Oquab et al.
  2023, table of architectures): patch 14, 12 layers, width 768, 12 heads, MLP 3072, pre-norm blocks with
  LayerScale, eager attention (scores, scale, softmax, context) as the bert-base profile counts it;
- DPT head (Depth Anything V2 README 'vitb': features 128, out_channels 96, 192, 384, 768; transformers'
  DepthAnythingConfig: reassemble factors 4, 2, 1, 0.5, head_hidden_size 32, the backbone's stages 3, 6, 9,
  12 with a layer norm each): per stage a 1x1 projection, a resize (transposed conv k=s=4 and 2, identity,
  3x3 stride-2 conv), a 3x3 conv to 128; four fusion blocks (residual conv units of two 3x3 convs,
  bilinear x2, 1x1 projection); the head's 3x3 conv 128 -> 64, bilinear to 518, 3x3 conv 64 -> 32, 1x1 to 1.

Counted as in runners/profiles (per sample, fp32, FLOPs = 2 x MACs, act_bytes = input plus output). The
pipeline's CPU pre- and post-processing (PIL resize to 518, normalisation, the depth map back to the image
size) is not counted: the twin has no model of it.

The replay itself (each mode's defaults on sim:orin against the devkit's rows) is
scripts/twin_rails.py:saturated_rows, whose table docs/twin.md carries; this script prints the layer
table's totals against the model card:

    python scripts/twin_depth_anything.py
"""

from __future__ import annotations

from runners.profile import LayerProfile, ModelProfile

WORKLOAD = "depth-anything-v2-base"
IMAGE = 518
PATCH = 14
WIDTH = 768
DEPTH = 12
HEADS = 12
MLP = 3072
OUT_STAGES = (3, 6, 9, 12)
NECK = (96, 192, 384, 768)
FUSION = 128
HEAD_HIDDEN = 32
F32 = 4


def _layer(name: str, op: str, flops: float, weights: float, act: float, op_class: str, matmul: bool) -> LayerProfile:
    return LayerProfile(
        name=name, op=op, flops=flops, weight_bytes=weights * F32, act_bytes=act * F32, matmul=matmul, op_class=op_class
    )


def _linear(name: str, tokens: int, d_in: int, d_out: int) -> LayerProfile:
    flops = 2.0 * tokens * d_in * d_out
    return _layer(name, "linear", flops, d_in * d_out + d_out, tokens * (d_in + d_out), "gemm", True)


def _elementwise(name: str, op: str, elements: int, inputs: int = 1, weights: float = 0.0) -> LayerProfile:
    return _layer(name, op, float(elements), weights, elements * (inputs + 1), "elementwise", False)


def _conv(name: str, c_in: int, c_out: int, k: int, h_out: int, h_in: int) -> LayerProfile:
    op_class = "conv_pointwise" if k == 1 else "conv_dense"
    flops = 2.0 * k * k * c_in * c_out * h_out * h_out
    act = c_in * h_in**2 + c_out * h_out**2
    return _layer(name, "conv2d", flops, k * k * c_in * c_out + c_out, act, op_class, True)


def _conv_transpose(name: str, channels: int, k: int, h_in: int) -> LayerProfile:
    """A transposed conv with kernel = stride = k: each input pixel scatters one k x k block."""
    flops = 2.0 * k * k * channels * channels * h_in * h_in
    act = channels * h_in**2 + channels * (k * h_in) ** 2
    return _layer(name, "conv_transpose2d", flops, k * k * channels * channels + channels, act, "conv_dense", True)


def _encoder_block(i: int, tokens: int) -> list[LayerProfile]:
    p = f"layers.{i}"
    n = tokens * WIDTH
    scores = HEADS * tokens * tokens
    return [
        _elementwise(f"{p}.norm1", "layernorm", n, weights=2 * WIDTH),
        _linear(f"{p}.attention.query", tokens, WIDTH, WIDTH),
        _linear(f"{p}.attention.key", tokens, WIDTH, WIDTH),
        _linear(f"{p}.attention.value", tokens, WIDTH, WIDTH),
        _layer(f"{p}.attention.scores", "matmul", 2.0 * tokens * tokens * WIDTH, 0, 2 * n + scores, "attention", True),
        _elementwise(f"{p}.attention.scale", "scale", scores),
        _elementwise(f"{p}.attention.softmax", "softmax", scores),
        _layer(f"{p}.attention.context", "matmul", 2.0 * tokens * tokens * WIDTH, 0, scores + 2 * n, "attention", True),
        _linear(f"{p}.attention.output", tokens, WIDTH, WIDTH),
        _elementwise(f"{p}.layer_scale1", "mul", n, weights=WIDTH),
        _elementwise(f"{p}.attn_add", "add", n, inputs=2),
        _elementwise(f"{p}.norm2", "layernorm", n, weights=2 * WIDTH),
        _linear(f"{p}.mlp.fc1", tokens, WIDTH, MLP),
        _elementwise(f"{p}.mlp.gelu", "gelu", tokens * MLP),
        _linear(f"{p}.mlp.fc2", tokens, MLP, WIDTH),
        _elementwise(f"{p}.layer_scale2", "mul", n, weights=WIDTH),
        _elementwise(f"{p}.out_add", "add", n, inputs=2),
    ]


def _residual_unit(p: str, h: int) -> list[LayerProfile]:
    n = FUSION * h * h
    return [
        _elementwise(f"{p}.relu1", "relu", n),
        _conv(f"{p}.conv1", FUSION, FUSION, 3, h, h),
        _elementwise(f"{p}.relu2", "relu", n),
        _conv(f"{p}.conv2", FUSION, FUSION, 3, h, h),
        _elementwise(f"{p}.add", "add", n, inputs=2),
    ]


def depth_anything_v2_base() -> ModelProfile:
    """Depth Anything V2 base at 518 x 518, eager fp32, per sample (see the module docstring for sources)."""
    grid = IMAGE // PATCH
    tokens = grid * grid + 1
    layers = [
        _conv("embeddings.patch", 3, WIDTH, PATCH, grid, IMAGE).model_copy(
            update={"flops": 2.0 * PATCH * PATCH * 3 * WIDTH * grid * grid}
        ),
        _elementwise("embeddings.cls_cat", "cat", tokens * WIDTH),
        _elementwise("embeddings.pos_add", "add", tokens * WIDTH, inputs=2, weights=tokens * WIDTH),
    ]
    for i in range(DEPTH):
        layers += _encoder_block(i, tokens)
        if i + 1 in OUT_STAGES:
            layers.append(_elementwise(f"backbone.norm.stage{i + 1}", "layernorm", tokens * WIDTH, weights=2 * WIDTH))
    sizes = []
    for s, ch in enumerate(NECK):
        p = f"neck.reassemble.{s}"
        layers.append(_conv(f"{p}.projection", WIDTH, ch, 1, grid, grid))
        if s in (0, 1):
            factor = 4 // (s + 1)
            h = grid * factor
            layers.append(_conv_transpose(f"{p}.resize", ch, factor, grid))
        elif s == 2:
            h = grid
        else:
            h = (grid + 1) // 2
            layers.append(_conv(f"{p}.resize", ch, ch, 3, h, grid))
        layers.append(_conv(f"neck.convs.{s}", ch, FUSION, 3, h, h))
        sizes.append(h)
    # Fusion from the coarsest stage up: each block's output is upsampled to the next stage's size (x2 at the top).
    for f, s in enumerate(reversed(range(len(NECK)))):
        h = sizes[s]
        p = f"neck.fusion.{f}"
        if f > 0:
            layers += _residual_unit(f"{p}.residual1", h)
            layers.append(_elementwise(f"{p}.skip_add", "add", FUSION * h * h, inputs=2))
        layers += _residual_unit(f"{p}.residual2", h)
        up = sizes[s - 1] if s > 0 else 2 * h
        layers.append(_elementwise(f"{p}.upsample", "interpolate", FUSION * up * up))
        layers.append(_conv(f"{p}.projection", FUSION, FUSION, 1, up, up))
    top = 2 * sizes[0]
    layers += [
        _conv("head.conv1", FUSION, FUSION // 2, 3, top, top),
        _elementwise("head.upsample", "interpolate", FUSION // 2 * IMAGE * IMAGE),
        _conv("head.conv2", FUSION // 2, HEAD_HIDDEN, 3, IMAGE, IMAGE),
        _elementwise("head.relu", "relu", HEAD_HIDDEN * IMAGE * IMAGE),
        _conv("head.conv3", HEAD_HIDDEN, 1, 1, IMAGE, IMAGE),
        _elementwise("head.relu_out", "relu", IMAGE * IMAGE),
    ]
    return ModelProfile(
        model=WORKLOAD,
        task="depth-estimation",
        input_shape=[3, IMAGE, IMAGE],
        generated_by="scripts/twin_depth_anything.py",
        notes="per sample at fp32 from the architecture (DINOv2 ViT-B/14 + DPT head, 518 x 518); "
        "no CPU pre- or post-processing",
        layers=layers,
    )


def main() -> None:
    profile = depth_anything_v2_base()
    print(
        f"{profile.model}: {profile.flops_per_sample / 1e9:.1f} GFLOP/frame, {len(profile.layers)} layers,"
        f" {profile.weight_bytes / F32 / 1e6:.1f} M parameters (the model card: 97.5 M)"
    )


if __name__ == "__main__":
    main()
