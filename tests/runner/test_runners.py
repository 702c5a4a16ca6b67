"""Runners: zoo models on the CPU, weights files, ONNX files, and their errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runners import Runner, make_runner
from tuner.errors import UserError

torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")

from runners import zoo  # noqa: E402
from runners.torch_runner import TorchRunner  # noqa: E402

pytestmark = pytest.mark.slow  # PyTorch models built and run on this CPU


@pytest.mark.parametrize("model", ["tiny-cnn", "resnet50"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zoo_model_infers_on_cpu(model, precision):
    runner = make_runner(model, "cpu")
    assert isinstance(runner, Runner)
    assert (runner.name, runner.device) == (model, "cpu")
    runner.prepare(1, precision, {"channels_last": model == "resnet50"})
    runner.infer()
    runner.infer()
    runner.close()


def test_prepare_again_switches_batch_and_precision():
    runner = TorchRunner("tiny-cnn")
    runner.prepare(2, "bf16", {})
    first = runner._active
    (batch,) = first.inputs
    assert batch.shape == (2, 3, 32, 32) and batch.dtype == torch.bfloat16
    runner.prepare(8, "fp32", {"channels_last": True})
    (batch,) = runner._active.inputs
    assert batch.shape == (8, 3, 32, 32) and batch.dtype == torch.float32
    assert batch.is_contiguous(memory_format=torch.channels_last)
    # The pristine fp32 model is untouched by the casts.
    assert next(runner._base.parameters()).dtype == torch.float32
    runner.infer()
    # Coming back to a configuration reuses its prepared variant: no rebuild, no recompilation.
    runner.prepare(2, "bf16", {"channels_last": False, "graph": "eager"})
    assert runner._active is first


def test_compiled_variants_are_compiled_once_per_configuration(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)
    runner = TorchRunner("tiny-cnn")
    for batch in (1, 2, 1, 2, 1):
        runner.prepare(batch, "fp32", {"graph": "compile"})
        runner.infer()
    # One compiled model serves every maximum batch size; its ladder sizes are warmed in prepare().
    assert len(compiled) == runner.compiles == 1
    runner.prepare(1, "fp32", {"graph": "eager"})
    runner.prepare(2, "bf16", {"graph": "compile"})
    assert len(compiled) == 2


class CountingModel(torch.nn.Module):
    """Records the batch size of every forward call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.batches: list[int] = []
        self.threads: set[int] = set()

    def forward(self, x):
        import threading

        self.batches.append(x.shape[0])
        self.threads.add(threading.get_ident())
        return self.linear(x)


def _counting_runner(model_thread: bool | None = None):
    from runners.torch_runner import ModelSource

    model = CountingModel()
    source = ModelSource("counting", lambda: model, lambda batch, dtype: (torch.zeros(batch, 4, dtype=dtype),))
    return TorchRunner(source, model_thread=model_thread)


def test_eager_runs_the_batch_that_arrived_and_warms_every_size_before_a_window():
    runner = _counting_runner(model_thread=True)  # as on a GPU
    runner.prepare(8, "fp32", {})
    model = runner._active.model
    # prepare() ran the maximum and every smaller size, so no size meets its first run inside a window
    assert set(model.batches) == set(range(1, 9))
    model.batches.clear()
    assert [runner.infer(n) for n in (1, 3, 8)] == [1, 3, 8]
    assert runner.infer() == 8
    assert model.batches == [1, 3, 8, 8]
    with pytest.raises(ValueError, match="maximum of 8"):
        runner.infer(9)
    # Warm-ups and batches, whichever thread asks for them, run on the runner's one model thread,
    # where per-thread kernel caches (cuDNN's execution plans) were warmed.
    import threading

    other = threading.Thread(target=runner.infer, args=(5,))
    other.start()
    other.join()
    assert model.batches[-1] == 5 and model.threads == {runner._thread.ident}
    runner.close()


def test_eager_warms_only_the_sizes_a_window_will_run():
    """Offline windows run full batches; a Server window the sizes up to its limit, then the ladder."""
    runner = _counting_runner()
    runner.warm_upto = 0
    runner.prepare(16, "fp32", {})
    model = runner._active.model
    assert set(model.batches) == {16}
    runner.warm_upto = 3
    runner.prepare(16, "fp32", {})
    assert set(model.batches) == {1, 2, 3, 4, 8, 16}
    runner.close()


def test_sizes_to_warm_follow_the_scenario_and_the_bound():
    from tuner.measure.settings import WindowSettings, sizes_to_warm

    assert sizes_to_warm(WindowSettings(), 512) == 0
    server = {"scenario": "server", "options": {"server_target_qps": 3000.0}}
    assert sizes_to_warm(WindowSettings(**server), 512) == 511  # no bound: every size
    assert sizes_to_warm(WindowSettings(**server, bound_ms=10.0), 512) == 61  # 2 x 3000 q/s x 10 ms, + 1
    assert sizes_to_warm(WindowSettings(**server, bound_ms=10.0), 16) == 15


def test_graph_ladder_runs_the_smallest_prepared_size_and_is_kept_across_maxima(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)
    runner = _counting_runner()
    runner.prepare(12, "fp32", {"graph": "compile"})
    variant = runner._active
    assert sorted(variant.sizes) == [1, 2, 4, 8, 12]
    variant.model.batches.clear()
    assert [runner.infer(n) for n in (1, 3, 5, 9, 12)] == [1, 4, 8, 12, 12]
    assert variant.model.batches == [1, 4, 8, 12, 12]
    # A smaller maximum reuses the sizes already prepared; a larger one adds only its new sizes.
    runner.prepare(4, "fp32", {"graph": "compile"})
    assert runner._active is variant and runner.infer(3) == 4
    variant.model.batches.clear()
    runner.prepare(16, "fp32", {"graph": "compile"})
    assert sorted(variant.sizes) == [1, 2, 4, 8, 12, 16] and set(variant.model.batches) == {16}
    assert len(compiled) == 1


def test_infer_before_prepare_is_a_bug():
    with pytest.raises(RuntimeError, match="prepare"):
        TorchRunner("tiny-cnn").infer()


@pytest.mark.parametrize(
    ("precision", "options", "message"),
    [
        ("fp16", {}, "bf16 or fp32"),
        ("fp32", {"graph": "cudagraphs"}, "CUDA device"),
        ("fp32", {"graph": "xla"}, "eager, cudagraphs, compile"),
        ("int8", {}, "TensorRT"),
        ("fp32", {"tensorrt": True}, "known options are"),
    ],
)
def test_cpu_refuses_what_it_cannot_run(precision, options, message):
    runner = TorchRunner("tiny-cnn")
    with pytest.raises(UserError, match=message):
        runner.prepare(1, precision, options)


def test_a_failing_precision_or_option_becomes_a_user_error(monkeypatch):
    runner = TorchRunner("tiny-cnn")

    def broken(model, shape, pool):
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setattr(runner, "_warm_up", broken)
    with pytest.raises(UserError, match="precision bf16 on cpu"):
        runner.prepare(1, "bf16", {})
    assert runner._active is None and not runner._variants
    with pytest.raises(RuntimeError, match="no kernel"):
        runner.prepare(1, "fp32", {})


def test_bad_batch_size_and_device():
    with pytest.raises(UserError, match="batch size"):
        TorchRunner("tiny-cnn").prepare(0, "fp32", {})
    with pytest.raises(UserError, match="cpu, cuda or cuda:N"):
        make_runner("tiny-cnn", "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA GPU"):
            make_runner("tiny-cnn", "cuda:0")


def test_unknown_model_lists_known_names():
    with pytest.raises(UserError) as info:
        make_runner("resnet51")
    for name in zoo.model_names():
        assert name in str(info.value)
    assert ".onnx" in str(info.value)


def test_zoo_inputs_and_outputs_have_the_standard_shapes():
    assert zoo.model_names() == [
        "bert-base", "bert-large", "efficientnet_b0", "mobilenet_v2", "resnet50", "tiny-cnn"
    ]  # fmt: skip
    ids = zoo.input_for("bert-base", 2, "cpu", torch.float16)
    assert ids.shape == (2, 128) and ids.dtype == torch.int64
    assert int(ids.max()) < zoo.BERT_VOCAB
    with torch.inference_mode():
        for name, out in [("mobilenet_v2", 1000), ("efficientnet_b0", 1000), ("tiny-cnn", 10)]:
            batch = zoo.input_for(name, 1)
            assert zoo.build_model(name)(batch).shape == (1, out)
        assert zoo.build_model("bert-base")(ids).shape == (2, 768)


def test_builds_are_reproducible_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = zoo.build_model("tiny-cnn"), zoo.build_model("tiny-cnn")
    assert torch.rand(1) == before
    for pa, pb in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb)


def test_weights_file_round_trip(tmp_path):
    trained = zoo.build_model("tiny-cnn", seed=7)
    path = tmp_path / "tiny.pt"
    torch.save(trained.state_dict(), path)
    runner = TorchRunner("tiny-cnn", weights=path)
    for key, value in trained.state_dict().items():
        assert torch.equal(runner._base.state_dict()[key], value)
    assert not torch.equal(
        runner._base.state_dict()["fc.weight"],
        zoo.build_model("tiny-cnn").state_dict()["fc.weight"],
    )
    wrapped = tmp_path / "wrapped.pt"
    torch.save({"state_dict": trained.state_dict(), "epoch": 3}, wrapped)
    runner = make_runner("tiny-cnn", "cpu", str(wrapped))
    assert torch.equal(runner._base.fc.bias, trained.fc.bias)
    runner.prepare(1, "fp32", {})
    runner.infer()


def test_weights_file_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        TorchRunner("tiny-cnn", weights=tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot read weights file"):
        TorchRunner("tiny-cnn", weights=garbage)
    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), tensor)
    with pytest.raises(UserError, match="not a state_dict"):
        TorchRunner("tiny-cnn", weights=tensor)
    other = tmp_path / "other.pt"
    torch.save({"conv.weight": torch.zeros(1)}, other)
    with pytest.raises(UserError, match="does not fit model 'tiny-cnn'"):
        TorchRunner("tiny-cnn", weights=other)
    reshaped = zoo.build_model("tiny-cnn").state_dict()
    reshaped["fc.weight"] = torch.zeros(3, 3)
    torch.save(reshaped, other)
    with pytest.raises(UserError, match="does not fit model 'tiny-cnn'"):
        TorchRunner("tiny-cnn", weights=other)


def test_channels_last_leaves_models_without_convolutions_alone():
    """A space's channels_last knob reaches every model; for BERT it must change nothing, not fail."""
    runner = TorchRunner("bert-base")
    runner.prepare(1, "fp32", {"channels_last": True})
    (ids,) = runner._active.inputs
    assert ids.shape == (1, 128) and ids.is_contiguous()
    runner.close()


def test_missing_onnxruntime_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(UserError, match=r"pip install 'powertune\[onnx\]'"):
        make_runner(str(tmp_path / "model.onnx"))


def test_importing_runners_does_not_import_torch():
    code = "import runners, runners.profile, sys; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _onnx_file(path, inputs, nodes, outputs, initializers=()):
    """Write a small graph with onnx.helper, independent of torch's exporters."""
    onnx = pytest.importorskip("onnx", reason="needs onnx (pip install onnx)")
    helper = onnx.helper
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in inputs],
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _image_model(path, batch="batch", elem=None):
    onnx = pytest.importorskip("onnx", reason="needs onnx (pip install onnx)")
    elem = onnx.TensorProto.FLOAT if elem is None else elem
    return _onnx_file(
        path,
        [("images", elem, [batch, 3, 32, 32])],
        [onnx.helper.make_node("GlobalAveragePool", ["images"], ["pooled"])],
        [("pooled", elem, [batch, 3, 1, 1])],
    )


def test_onnx_runner_feeds_images_with_the_batch_axis_set(tmp_path):
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install onnxruntime)")
    path = _image_model(tmp_path / "pool.onnx")
    runner = make_runner(path, "cpu")
    assert isinstance(runner, Runner)
    assert (runner.name, runner.device) == ("pool", "cpu")
    runner.prepare(5, "fp32", {})
    assert runner._feeds["images"].shape == (5, 3, 32, 32)
    runner.infer()
    assert runner.infer(2) == 2  # the batch axis is dynamic: a smaller batch runs at its own size
    with pytest.raises(UserError, match="fixes the precision"):
        runner.prepare(5, "bf16", {})
    with pytest.raises(UserError, match="does not support channels_last"):
        runner.prepare(5, "fp32", {"channels_last": True})
    with pytest.raises(UserError, match="carries its own weights"):
        make_runner(path, "cpu", weights="w.pt")
    runner.close()


def test_onnx_runner_feeds_token_ids(tmp_path):
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install onnxruntime)")
    onnx = pytest.importorskip("onnx", reason="needs onnx (pip install onnx)")
    table = onnx.helper.make_tensor("table", onnx.TensorProto.FLOAT, [10, 4], [0.5] * 40)
    path = _onnx_file(
        tmp_path / "embed.onnx",
        [("ids", onnx.TensorProto.INT64, ["batch", 16])],
        [onnx.helper.make_node("Gather", ["table", "ids"], ["vectors"])],
        [("vectors", onnx.TensorProto.FLOAT, ["batch", 16, 4])],
        [table],
    )
    runner = make_runner(path)
    runner.prepare(3, "fp32", {})
    assert runner._feeds["ids"].shape == (3, 16)
    assert str(runner._feeds["ids"].dtype) == "int64"
    runner.infer()


def test_onnx_runner_refuses_shapes_it_cannot_fill(tmp_path):
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install onnxruntime)")
    onnx = pytest.importorskip("onnx", reason="needs onnx (pip install onnx)")
    runner = make_runner(_image_model(tmp_path / "fixed.onnx", batch=2))
    runner.prepare(2, "fp32", {})
    with pytest.raises(UserError, match="fixed batch size of 2"):
        runner.prepare(4, "fp32", {})
    symbolic = _onnx_file(
        tmp_path / "seq.onnx",
        [("x", onnx.TensorProto.FLOAT, ["batch", "seq"])],
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        [("y", onnx.TensorProto.FLOAT, ["batch", "seq"])],
    )
    with pytest.raises(UserError, match="symbolic dimension 'seq'"):
        make_runner(symbolic).prepare(1, "fp32", {})
    half = make_runner(_image_model(tmp_path / "half.onnx", elem=onnx.TensorProto.FLOAT16))
    with pytest.raises(UserError, match="computes in fp16"):
        half.prepare(1, "fp32", {})


def test_onnx_runner_refuses_bad_files(tmp_path):
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install onnxruntime)")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot load ONNX file"):
        make_runner(str(broken))
    with pytest.raises(UserError, match="does not exist"):
        make_runner(str(tmp_path / "absent.onnx"))
    with pytest.raises(UserError, match="cpu, cuda or cuda:N"):
        make_runner(str(broken), "gpu")


USER_MODULE = '''
"""A user's own model, written outside the repository."""
import torch
from torch import nn


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.net(x)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 8)

    def forward(self, ids, weights):
        return self.embed(ids).sum(1) * weights


def build():
    return Scorer(), (16,)


def build_tokens():
    return Tagger(), [{"shape": [12], "dtype": "int64", "high": 100}, {"shape": [8]}]


def build_with_function():
    return Scorer(), lambda batch: torch.randn(batch, 16)


def build_wrong():
    return "not a module"
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    """The module above saved in a folder of the user's, which is the current directory."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "my_models.py").write_text(USER_MODULE)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_models", raising=False)
    return folder


def test_user_model_factories_describe_their_inputs_three_ways(user_models):
    for spec, shapes in [
        ("py:my_models:build", [(3, 16)]),
        ("py:my_models:build_tokens", [(3, 12), (3, 8)]),
        ("py:my_models:build_with_function", [(3, 16)]),
    ]:
        runner = make_runner(spec, "cpu")
        runner.prepare(3, "bf16", {"graph": "eager"})
        assert [tuple(t.shape) for t in runner._active.inputs] == shapes
        runner.infer()
    (ids, weights) = runner_inputs = make_runner("py:my_models:build_tokens")._source.make_batch(2, torch.bfloat16)
    assert ids.dtype == torch.int64 and int(ids.max()) < 100 and weights.dtype == torch.bfloat16
    assert len(runner_inputs) == 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("py:my_models", "py:mypackage.models:build"),
        ("py:no_such_module:build", "cannot find module 'no_such_module'"),
        ("py:my_models:absent", "has no function 'absent'"),
        ("py:my_models:build_wrong", r"must return \(torch.nn.Module, input\)"),
    ],
)
def test_user_model_mistakes_are_one_line_errors(user_models, spec, message):
    from tuner.models import check_model

    with pytest.raises(UserError, match=message):
        check_model(spec)
        make_runner(spec, "cpu")


def test_a_users_own_model_is_tuned_from_the_cli(user_models, rapl_at_15w, capsys, monkeypatch):
    """tune run --model py:my_models:build on the CPU, in-process, from the user's folder."""
    import json

    from tuner.cli import main

    argv = ["tune", "run", "--model", "py:my_models:build", "--device", "cpu", "--max-latency", "500ms",
            "--trials", "2", "--batch-sizes", "1,8", "--window", "0.5", "--min-window", "0.3",
            "--sampler", "random", "--seed", "0", "--json"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    main()
    payload = json.loads(capsys.readouterr().out)
    assert payload["measured"] == 2 and payload["best"]["meter"] == "rapl"
    assert payload["results"].endswith("cpu/my_models.build")
    assert (user_models / "studies" / "cpu" / "my_models.build" / "pareto.json").is_file()
    # Each trial records why its window ended and the interval it reached.
    import optuna

    storage = f"sqlite:///{user_models / 'studies' / 'tune.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(storage)[0].study_name, storage=storage)
    for trial in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        extra = trial.user_attrs["extra"]
        assert extra["stop_rule"] in ("ci", "max-duration", "queries-exhausted", "costs-more")
        # a confirmed trial's figures end with a confirming window, which aims at sqrt(3) x the interval (these
        # windows are too short to judge their own, so the first is taken at the 1% it aimed at)
        confirmed = trial.user_attrs["measurements"] > 1
        assert extra["ci_target"] == pytest.approx(0.01 * (3**0.5 if confirmed else 1)) and extra["max_window_s"] == 0.5


# ------------------------------------------------------------ TensorRT (fake)


from fake_tensorrt import cpu_torch as _cpu_torch  # noqa: E402
from fake_tensorrt import onnx_file as _fake_onnx  # noqa: E402


@pytest.fixture
def fake_trt(monkeypatch):
    import fake_tensorrt

    module = fake_tensorrt.module()
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    return module


def test_tensorrt_dla_engines_run_beside_the_gpu_one_per_core_batch_and_precision(fake_trt, tmp_path):
    from runners.tensorrt_runner import TensorRTRunner

    fake_trt.Builder.num_DLA_cores = 2  # an AGX Orin
    runner = TensorRTRunner(_fake_onnx(tmp_path / "net.onnx"), "cuda:0", trt=fake_trt, torch=_cpu_torch())
    runner.prepare(16, "int8", {"dla_cores": 2, "dla_batch_size": 8})
    built = {(b["device"], b["dla_core"], b["inputs"][0]["profile"][2][0]) for b in fake_trt.Builder.built}
    assert built == {("GPU", -1, 16), ("DLA", 0, 8), ("DLA", 1, 8)}
    dla = [b for b in fake_trt.Builder.built if b["device"] == "DLA"]
    assert all("GPU_FALLBACK" in b["flags"] and "INT8" in b["flags"] for b in dla)
    lanes = runner.lanes()
    assert [(name, size) for name, size, _ in lanes] == [("gpu", 16), ("dla0", 8), ("dla1", 8)]
    assert runner._bound["dla1"].engine.dla_core == 1
    lanes[2][2]()
    assert runner._bound["dla1"].context.runs == 2 and runner._bound["dla0"].context.runs == 1
    runner.prepare(16, "int8", {"dla_cores": 1, "dla_batch_size": 8})
    assert runner.builds == 3  # every engine was cached
    runner.prepare(16, "int8", {"dla_cores": 1, "dla_batch_size": 2})
    assert runner.builds == 4 and [n for n, _, _ in runner.lanes()] == ["gpu", "dla0"]
    with pytest.raises(UserError, match="DLA runs fp16 or int8"):
        runner.prepare(16, "fp32", {"dla_cores": 1, "dla_batch_size": 2})
    fake_trt.Builder.num_DLA_cores = 0  # an Orin Nano
    with pytest.raises(UserError, match="0 DLA core"):
        runner.prepare(16, "fp16", {"dla_cores": 1, "dla_batch_size": 4})
    with pytest.raises(UserError, match="dla_cores must be an integer from 0 to 2"):
        runner.prepare(16, "fp16", {"dla_cores": 3})


def test_tensorrt_builds_one_engine_per_batch_size_and_precision(fake_trt, tmp_path):
    from runners.tensorrt_runner import TensorRTRunner

    runner = TensorRTRunner(_fake_onnx(tmp_path / "net.onnx"), "cuda:0", trt=fake_trt, torch=_cpu_torch())
    runner.prepare(4, "fp16", {})
    assert fake_trt.Builder.built[-1]["flags"] == ["FP16"]
    gpu = runner._bound["gpu"]
    assert gpu.buffers["images"].shape == (4, 3, 8, 8) and gpu.buffers["logits"].shape == (4, 10)
    assert gpu.context.addresses.keys() == {"images", "logits"}
    runner.infer()
    assert gpu.context.runs == 2 and gpu.stream.synced == 2  # prepare runs one batch
    assert runner.lanes() == []  # the GPU alone: the window runs infer()
    runner.prepare(4, "int8", {})
    assert fake_trt.Builder.built[-1]["flags"] == ["FP16", "INT8"] and fake_trt.Builder.built[-1]["int8_ranges"]
    runner.prepare(4, "fp16", {})
    runner.prepare(8, "fp32", {})
    assert runner.builds == 3 and fake_trt.Builder.built[-1]["flags"] == []
    assert fake_trt.Builder.built[-1]["inputs"][0]["profile"] == ((1, 3, 8, 8), (8, 3, 8, 8), (8, 3, 8, 8))
    for precision, options, message in [
        ("bf16", {}, "fp32, fp16 or int8"),
        ("fp16", {"graph": "cudagraphs"}, "does not support graph"),
    ]:
        with pytest.raises(UserError, match=message):
            runner.prepare(4, precision, options)


def test_tensorrt_runs_the_arrived_batch_within_its_optimization_profile(fake_trt, tmp_path):
    from runners.tensorrt_runner import TensorRTRunner

    runner = TensorRTRunner(_fake_onnx(tmp_path / "net.onnx"), "cuda:0", trt=fake_trt, torch=_cpu_torch())
    runner.prepare(8, "fp16", {})
    context = runner._bound["gpu"].context
    assert [runner.infer(n) for n in (1, 3, 3, 8)] == [1, 3, 3, 8]
    assert runner.infer() == 8
    # prepare ran the maximum once; each batch then ran at the size that arrived, on the same buffers
    assert context.batches == [8, 1, 3, 3, 8, 8] and runner.builds == 1
    assert context.get_tensor_shape("logits") == (8, 10)
    with pytest.raises(ValueError, match="maximum of 8"):
        runner.infer(9)


def test_tensorrt_refuses_int8_where_the_gpu_has_no_fast_path(fake_trt, tmp_path, monkeypatch):
    from runners.tensorrt_runner import TensorRTRunner

    monkeypatch.setattr(fake_trt.Builder, "platform_has_fast_int8", False)
    runner = TensorRTRunner(_fake_onnx(tmp_path / "net.onnx"), "cuda:0", trt=fake_trt, torch=_cpu_torch())
    with pytest.raises(UserError, match="no fast int8 path"):
        runner.prepare(1, "int8", {})
    fixed = TensorRTRunner(_fake_onnx(tmp_path / "fixed.onnx", batch=2), "cuda:0", trt=fake_trt, torch=_cpu_torch())
    with pytest.raises(UserError, match="fixed batch size of 2"):
        fixed.prepare(4, "fp32", {})


def test_tensorrt_runs_a_prebuilt_engine_in_its_own_precision(fake_trt, tmp_path):
    import json

    from runners.tensorrt_runner import TensorRTRunner

    record = {
        "inputs": [{"name": "x", "shape": [-1, 16], "dtype": "HALF", "profile": [[1, 16], [8, 16], [16, 16]]}],
        "outputs": [{"name": "y", "shape": [-1, 2], "dtype": "HALF"}],
    }
    engine = tmp_path / "model.engine"
    engine.write_text(json.dumps(record))
    runner = TensorRTRunner(engine, "cuda:0", trt=fake_trt, torch=_cpu_torch())
    runner.prepare(8, "fp16", {})
    assert (
        runner._bound["gpu"].buffers["x"].shape == (8, 16) and runner._bound["gpu"].buffers["x"].dtype == torch.float16
    )
    assert runner.builds == 0
    with pytest.raises(UserError, match="computes in fp16"):
        runner.prepare(8, "fp32", {})
    with pytest.raises(UserError, match="batch sizes 1-16"):
        runner.prepare(32, "fp16", {})
    broken = tmp_path / "broken.plan"
    broken.write_bytes(b"\x00not an engine")
    with pytest.raises(UserError, match="rebuild it on this device"):
        TensorRTRunner(broken, "cuda:0", trt=fake_trt, torch=_cpu_torch())


def test_tensorrt_is_chosen_by_file_or_runtime_and_fails_in_one_line(fake_trt, tmp_path, monkeypatch):
    from runners.factory import check_runtime
    from runners.tensorrt_runner import TensorRTRunner
    from tuner.models import check_model

    onnx_path = str(_fake_onnx(tmp_path / "net.onnx"))
    assert isinstance(make_runner(onnx_path, "cuda:0", runtime="tensorrt"), TensorRTRunner)
    assert check_runtime("m.engine", "auto") == "tensorrt" and check_runtime(onnx_path, "auto") == "onnxruntime"
    check_model(onnx_path, "tensorrt")
    for model, runtime, message in [
        ("resnet50", "tensorrt", "runs .engine/.plan files"),
        ("m.engine", "onnxruntime", "runs .onnx files"),
        (onnx_path, "torch", "needs tensorrt or onnxruntime"),
        ("resnet50", "tvm", "unknown runtime"),
    ]:
        with pytest.raises(UserError, match=message):
            check_runtime(model, runtime)
    with pytest.raises(UserError, match="NVIDIA GPU"):
        make_runner(onnx_path, "cpu", runtime="tensorrt")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(UserError, match="tensorrt Python package"):
        make_runner(onnx_path, "cuda:0", runtime="tensorrt")


# ------------------------------------------------- onnxruntime's CUDA provider (fake)


class FakeOrt:
    """The onnxruntime calls the runner makes, with a provider list chosen by the test."""

    def __init__(self, available, started) -> None:
        from types import SimpleNamespace

        self.available, self.started, self.sessions = available, started, []
        fake = self
        self.values: dict[int, tuple] = {}

        def ortvalue_from_numpy(array, kind, index):
            """A device copy of ``array``, found again by its data pointer as OrtValue.data_ptr() gives it."""
            fake.values[id(array)] = (array, kind, index)
            return SimpleNamespace(data_ptr=lambda: id(array))

        self.OrtValue = SimpleNamespace(ortvalue_from_numpy=ortvalue_from_numpy)

        class Binding:
            def __init__(self) -> None:
                self.inputs, self.outputs, self.synced = {}, {}, 0

            def bind_input(self, name, kind, index, element_type, shape, buffer_ptr) -> None:
                array, device, device_index = fake.values[buffer_ptr]
                assert (device, device_index) == (kind, index) and element_type == array.dtype.type
                assert list(shape[1:]) == list(array.shape[1:]) and shape[0] <= array.shape[0]
                self.inputs[name] = (tuple(shape), kind, index)

            def bind_output(self, name, kind, index) -> None:
                self.outputs[name] = (kind, index)

            def synchronize_outputs(self) -> None:
                self.synced += 1

        class Session:
            def __init__(self, path, providers) -> None:
                self.providers, self.runs = providers, 0
                fake.sessions.append(self)

            def get_providers(self):
                return list(fake.started)

            def get_inputs(self):
                return [SimpleNamespace(name="images", type="tensor(float)", shape=["batch", 3, 4, 4])]

            def get_outputs(self):
                return [SimpleNamespace(name="pooled", type="tensor(float)", shape=["batch", 3])]

            def io_binding(self):
                return Binding()

            def run_with_iobinding(self, binding) -> None:
                self.runs += 1

            def run(self, outputs, feeds) -> None:
                raise AssertionError("a GPU session must run through its I/O binding")

        self.InferenceSession = Session

    def get_available_providers(self):
        return list(self.available)


def test_onnx_on_a_gpu_runs_through_the_cuda_provider_with_bound_buffers(tmp_path, monkeypatch):
    from runners.onnx_runner import OnnxRunner

    model = tmp_path / "pool.onnx"
    model.write_bytes(b"graph")
    ort = FakeOrt(["CUDAExecutionProvider", "CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    runner = OnnxRunner(model, "cuda:1")
    assert ort.sessions[0].providers == [("CUDAExecutionProvider", {"device_id": 1})]
    runner.prepare(2, "fp32", {})
    runner.infer()
    binding = runner._binding
    assert binding.inputs["images"] == ((2, 3, 4, 4), "cuda", 1)
    assert binding.outputs == {"pooled": ("cuda", 1)}
    assert ort.sessions[0].runs == binding.synced == 2
    # A smaller batch runs at its own size on the first rows of the same device buffer.
    assert runner.infer(1) == 1 and binding.inputs["images"] == ((1, 3, 4, 4), "cuda", 1)
    assert len(ort.values) == 1


def test_onnx_on_a_gpu_refuses_a_silent_cpu_fallback(tmp_path, monkeypatch):
    model = tmp_path / "pool.onnx"
    model.write_bytes(b"graph")
    monkeypatch.setitem(sys.modules, "onnxruntime", FakeOrt(["CUDAExecutionProvider"], ["CPUExecutionProvider"]))
    with pytest.raises(UserError, match="could not start its CUDA provider"):
        make_runner(str(model), "cuda:0")
    monkeypatch.setitem(sys.modules, "onnxruntime", FakeOrt(["CPUExecutionProvider"], ["CPUExecutionProvider"]))
    with pytest.raises(UserError, match="pip install onnxruntime-gpu"):
        make_runner(str(model), "cuda:0")
