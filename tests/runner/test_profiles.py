"""The committed profiles: valid, faithful to the published model sizes, and reproducible."""

from __future__ import annotations

import json

import pytest
from locations import REPO

from runners.profile import ModelProfile, load_profile, profile_names
from tuner.errors import UserError

RESNET50_FLOPS = 8206316544  # shared/reference/calibration.json (Pagoda's count)
ZOO = ["bert-base", "bert-large", "efficientnet_b0", "mobilenet_v2", "resnet50", "tiny-cnn"]


def test_every_zoo_model_has_a_valid_profile():
    assert profile_names() == ZOO
    for name in ZOO:
        profile = load_profile(name)
        assert profile.model == name
        assert profile.generated_by.startswith("python scripts/make_profiles.py")
        assert profile.torch_version
        assert len({layer.name for layer in profile.layers}) == len(profile.layers)


def test_unknown_profile_lists_known_models():
    with pytest.raises(UserError, match="resnet50"):
        load_profile("resnet51")


def test_resnet50_matches_the_calibration_count():
    profile = load_profile("resnet50")
    assert profile.flops_per_sample == pytest.approx(RESNET50_FLOPS, rel=0.03)
    macs = sum(layer.flops for layer in profile.layers if layer.matmul) / 2
    assert macs == pytest.approx(4.089e9, rel=0.001)
    assert profile.weight_bytes / 4 == pytest.approx(25.557e6, rel=0.001)


@pytest.mark.parametrize(
    ("name", "gflops", "params_m"),
    [("mobilenet_v2", 0.6, 3.50), ("efficientnet_b0", 0.8, 5.29), ("bert-base", 22.4, 85.6)],
)
def test_model_sizes_match_published_figures(name, gflops, params_m):
    profile = load_profile(name)
    assert profile.flops_per_sample / 1e9 == pytest.approx(gflops, rel=0.1)
    # BERT's embedding tables are activation traffic, so its weights are the encoder's.
    assert profile.weight_bytes / 4 / 1e6 == pytest.approx(params_m, rel=0.02)


def test_bert_profiles_count_attention_and_note_sequence_length():
    base, large = load_profile("bert-base"), load_profile("bert-large")
    assert large.flops_per_sample / base.flops_per_sample == pytest.approx(3.5, rel=0.05)
    matmuls = [layer for layer in base.layers if layer.op == "matmul"]
    assert len(matmuls) == 2 * 12
    # QK^T at 128 tokens: 128 x 128 x 768 MACs.
    assert matmuls[0].flops == 2 * 128 * 128 * 768
    assert sum(layer.op == "softmax" for layer in base.layers) == 12
    assert "sequence length 128" in base.notes
    assert base.input_shape == [128]


def test_cnn_profiles_count_residual_and_se_ops():
    ops = {name: [layer.op for layer in load_profile(name).layers] for name in ZOO}
    assert ops["resnet50"].count("add") == 16
    assert ops["mobilenet_v2"].count("add") == 10
    assert ops["efficientnet_b0"].count("mul") == 16
    assert ops["efficientnet_b0"].count("silu") > 0


def test_generator_reproduces_the_committed_tiny_cnn_profile():
    pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    from runners.profiling import profile_model

    committed = load_profile("tiny-cnn")
    fresh = profile_model("tiny-cnn", generated_by=committed.generated_by)
    assert fresh.layers == committed.layers
    assert fresh.input_shape == committed.input_shape


def test_make_profiles_script_writes_a_valid_json(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    import importlib.util

    script = REPO / "scripts" / "make_profiles.py"
    spec = importlib.util.spec_from_file_location("make_profiles", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    module.main(["tiny-cnn"])
    written = ModelProfile.model_validate(json.loads((tmp_path / "tiny-cnn.json").read_text()))
    assert written.layers == load_profile("tiny-cnn").layers


@pytest.mark.parametrize("name", ["tiny-cnn", "resnet50", "mobilenet_v2", "efficientnet_b0", "bert-base"])
def test_profile_matches_its_model(name):
    torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    from runners import zoo

    model = zoo.build_model(name)
    profile = load_profile(name)
    assert profile.input_shape == list(zoo.spec(name).input_shape)
    dense = [
        p
        for module in model.modules()
        if not isinstance(module, torch.nn.Embedding)
        for p in module.parameters(recurse=False)
    ]
    assert profile.weight_bytes == 4 * sum(p.numel() for p in dense)
    kinds = (torch.nn.Conv2d, torch.nn.Linear, zoo.MatMul)
    matmuls = {n for n, module in model.named_modules() if isinstance(module, kinds)}
    assert {layer.name for layer in profile.layers if layer.matmul} == matmuls
