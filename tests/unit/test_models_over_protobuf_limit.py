"""Models over protobuf's 2 GiB limit of one message (weights saved as external data, which onnxruntime runs):
hb_mapper checker and makertbin stopped with 'internal error: EncodeError: Failed to serialize proto' (hunt 9 D2).

The limit is lowered to ``LIMIT`` bytes (``model_io.PROTOBUF_LIMIT``), and protobuf's refusal of a larger message
is imitated where a model reaches onnx's checker or onnxruntime, so models of 1.5 MB take the path of a 2 GB one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import FloatModel, make_project
from click.testing import CliRunner, Result
from google.protobuf.message import EncodeError
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.cli import hb_verifier
from hbtools.cli.hb_mapper import main
from hbtools.graph import model_io
from hbtools.runtime import HB_ONNXRuntime

LIMIT = 1 << 20
INTERNAL = "internal error"
PASSED = "PASSED"  # hb_verifier's verdict


@pytest.fixture(autouse=True)
def protobuf_limit_of_a_megabyte(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", LIMIT, raising=False)  # raising: the code before it had none
    check_model = onnx.checker.check_model

    def checker(model: ModelProto | str | bytes, *args: object, **kwargs: object) -> None:
        if isinstance(model, ModelProto) and model.ByteSize() >= LIMIT:
            raise EncodeError("Failed to serialize proto")  # what onnx's checker meets serializing a large model
        check_model(model, *args, **kwargs)

    session_init = ort.InferenceSession.__init__

    def session(self: ort.InferenceSession, model: str | bytes, *args: object, **kwargs: object) -> None:
        if isinstance(model, bytes) and len(model) >= LIMIT:
            raise EncodeError("Failed to serialize proto")  # the bytes could not have been made
        session_init(self, model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", checker)
    monkeypatch.setattr(ort.InferenceSession, "__init__", session)


def _model(nodes: list[onnx.NodeProto], weight: TensorProto, output: list[int]) -> FloatModel:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return FloatModel(model, {"x": [1, 256]}, {"x"})


def _matmul_model() -> FloatModel:
    """1.5 MB of float weights a BPU MatMul reads: 0.4 MB once int8, so its .bin fits under the limit."""
    w = np.random.default_rng(0).standard_normal((256, 1536)).astype(np.float32) * 0.05
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], numpy_helper.from_array(w, "w"),
                  [1, 1536])


def _lookup_model() -> FloatModel:
    """A 1.5 MB table a Gather on the CPU reads (an embedding lookup): it stays float in the quantized model."""
    table = np.random.default_rng(1).standard_normal((4096, 96)).astype(np.float32)
    nodes = [helper.make_node("ArgMax", ["x"], ["row"], name="argmax", axis=1, keepdims=0),
             helper.make_node("Gather", ["table", "row"], ["y"], name="lookup", axis=0)]
    return _model(nodes, numpy_helper.from_array(table, "table"), [1, 96])


def _hb_mapper(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_checker_takes_a_model_over_the_limit(tmp_path: Path) -> None:
    make_project(tmp_path, _matmul_model(), cal_count=2)
    result = _hb_mapper("checker", "--model-type", "onnx", "--march", "bayes-e", "--model", "model.onnx")
    assert result.exit_code == 0 and INTERNAL not in result.output, result.output[-2000:]
    assert "matmul" in result.output and "End Model Check" in result.output
    assert "makertbin cannot compile" not in result.output


def test_makertbin_writes_large_artefacts_with_their_weights_beside_them(tmp_path: Path) -> None:
    fm = _matmul_model()
    make_project(tmp_path, fm, cal_count=2)
    result = _hb_mapper("makertbin", "--config", "config.yaml", "--model-type", "onnx")
    assert result.exit_code == 0 and INTERNAL not in result.output, result.output[-2000:]
    out = tmp_path / "model_output"
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    expected = x @ numpy_helper.to_array(fm.model.graph.initializer[0])
    for stage in ("original_float", "optimized_float", "calibrated"):
        path = out / f"small_{stage}_model.onnx"
        data = path.with_name(f"{path.name}.data")
        assert data.is_file() and path.stat().st_size < LIMIT, f"{path.name}: not saved with external data"
        got = HB_ONNXRuntime(path).run(None, {"x": x})[0]  # onnx.load reads the weights from the .data file
        np.testing.assert_allclose(got, expected, rtol=0.05, atol=0.05 * np.abs(expected).max())
    assert not (out / "small_quantized_model.onnx.data").exists()  # int8: under the limit, one file
    verified = CliRunner().invoke(hb_verifier.main, ["-m", f"{out / 'small_quantized_model.onnx'},{out / 'small.bin'}"])
    assert verified.exit_code == 0 and PASSED in verified.output, verified.output


def test_makertbin_refuses_a_bin_over_the_limit_before_calibration(tmp_path: Path) -> None:
    make_project(tmp_path, _lookup_model(), cal_count=2)
    result = _hb_mapper("makertbin", "--config", "config.yaml", "--model-type", "onnx")
    assert result.exit_code != 0 and INTERNAL not in result.output, result.output[-2000:]
    errors = [line for line in result.output.splitlines() if " ERROR " in line]
    assert "a .bin holds the model as one message" in errors[0], result.output[-2000:]
    assert "keep its largest tables out of it" in errors[1]  # the hint
    assert "calibration statistics" not in result.output  # refused before the calibration runs
    assert not list((tmp_path / "model_output").glob("*.onnx"))


def test_checker_and_session_take_what_makertbin_refuses(tmp_path: Path) -> None:
    fm = _lookup_model()
    make_project(tmp_path, fm, cal_count=2)
    result = _hb_mapper("checker", "--model-type", "onnx", "--march", "bayes-e", "--model", "model.onnx")
    assert result.exit_code == 0 and INTERNAL not in result.output, result.output[-2000:]
    assert "WARNING makertbin cannot compile this model" in result.output
    x = np.zeros((1, 256), np.float32)
    x[0, 7] = 1
    got = HB_ONNXRuntime(str(tmp_path / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, numpy_helper.to_array(fm.model.graph.initializer[0])[[7]])
