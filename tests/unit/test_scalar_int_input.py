"""A model with an integer scalar input that picks a branch, as Silero VAD's exports have.

Silero VAD (PyPI ``silero-vad``) takes ``input`` [1, N] float, ``state`` [2, 1, 128] float and
``sr``, an int64 scalar (the sample rate) that an ``If`` compares with 16000 to choose the
8 kHz or the 16 kHz network, whose weights only the branches read. onnxruntime runs it,
so it must convert. It once stopped at each of these in turn: ``input_shape`` had no way
to leave out the scalar's shape, calibration fed the int64 input as float32, the quantize
stage dropped the weights only a branch reads, the ``.bin`` descriptor and hb_verifier
expected a batch axis on every input, and the simulator cut the branches' outer inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conformance import INTERNAL, _cli, convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.tools.verifier import verify

LENGTH = 64


def _branch(name: str, rng: np.random.Generator) -> tuple[onnx.GraphProto, list[onnx.TensorProto]]:
    """Conv1d -> Sigmoid on the encoder output; its weights are main-graph initializers."""
    w = numpy_helper.from_array((rng.standard_normal((4, 8, 3)) / 5).astype(np.float32), f"{name}_w")
    b = numpy_helper.from_array((0.1 * rng.standard_normal(4)).astype(np.float32), f"{name}_b")
    nodes = [helper.make_node("Conv", ["encoded", w.name, b.name], [f"{name}_conv"], name=f"{name}_conv",
                              kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Sigmoid", [f"{name}_conv"], [f"{name}_out"], name=f"{name}_sigmoid")]
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 4, LENGTH])
    graph = helper.make_graph(nodes, name, [], [out])
    return graph, [w, b]


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((8, 1, 5)) / 2).astype(np.float32), "enc_w")
    then_graph, then_inits = _branch("rate16k", rng)
    else_graph, else_inits = _branch("rate8k", rng)
    nodes = [
        helper.make_node("Unsqueeze", ["input", "axis1"], ["audio"], name="as_channels"),
        helper.make_node("Conv", ["audio", "enc_w"], ["enc_conv"], name="encoder", kernel_shape=[5], pads=[2, 2]),
        helper.make_node("Relu", ["enc_conv"], ["encoded"], name="encoder_relu"),
        helper.make_node("Equal", ["sr", "rate"], ["is16k"], name="is_16k"),
        helper.make_node("If", ["is16k"], ["output"], name="by_rate", then_branch=then_graph, else_branch=else_graph),
    ]
    inits = [w, numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array(16000, np.int64), "rate"), *then_inits, *else_inits]
    graph = helper.make_graph(nodes, "vad_like",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "samples"]),
                               helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, LENGTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_integer_scalar_input_choosing_a_branch_converts(tmp_path: Path) -> None:
    model = _model()
    rng = np.random.default_rng(0)
    audio = [rng.standard_normal((1, LENGTH)).astype(np.float32) for _ in range(8)]
    rates = [np.array(16000 if k % 2 else 8000, np.int64) for k in range(8)]
    # The scalar's shape is left out of input_shape (trailing ';'): it is the model's own.
    convert_featuremaps(tmp_path, model, {"input": audio, "sr": rates}, f"1x{LENGTH};", "float32;int32", "vad")

    quantized = tmp_path / "out" / "vad_quantized_model.onnx"
    session, reference = HB_ONNXRuntime(model_file=str(quantized)), HB_ONNXRuntime(onnx_model=model)
    for rate in (16000, 8000):  # both branches, with the weights only they read
        x = {"input": rng.standard_normal((1, LENGTH)).astype(np.float32), "sr": np.array(rate, np.int64)}
        got, want = session.run(None, x)[0], reference.run(None, x)[0]
        assert got.shape == want.shape
        assert cosine_similarity(want, got) >= 0.99, f"sr={rate}: cosine {cosine_similarity(want, got)}"
    verdict = verify(quantized, tmp_path / "out" / "vad.bin", None, 5)
    assert all(o.passed for o in verdict.outputs), "hb_verifier: the .bin and the quantized model differ"


def test_checker_takes_shapes_for_the_dynamic_inputs_only(tmp_path: Path) -> None:
    """``hb_mapper checker --input-shape input 1x64``: the int64 scalar needs no shape."""
    onnx.save(_model(), tmp_path / "vad_like.onnx")
    code, out = _cli(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                      str(tmp_path / "vad_like.onnx"), "--input-shape", "input", f"1x{LENGTH}"], tmp_path)
    assert INTERNAL not in out, out[-3000:]
    assert code == 0, out[-3000:]
    assert "input 'sr': shape scalar" in out


def test_a_scalar_input_takes_the_shape_1(tmp_path: Path) -> None:
    """Writing the scalar's shape as '1' (a single number) is read as the scalar, in makertbin's
    input_shape and in the checker's --input-shape; another shape of the wrong rank is still refused."""
    model = _model()
    rng = np.random.default_rng(1)
    audio = [rng.standard_normal((1, LENGTH)).astype(np.float32) for _ in range(4)]
    rates = [np.array(16000, np.int64) for _ in range(4)]
    convert_featuremaps(tmp_path, model, {"input": audio, "sr": rates}, f"1x{LENGTH};1", "float32;int64", "vad")
    assert (tmp_path / "out" / "vad.bin").is_file()
    onnx.save(model, tmp_path / "vad_like.onnx")
    base = ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(tmp_path / "vad_like.onnx"),
            "--input-shape", "input", f"1x{LENGTH}", "--input-shape", "sr"]
    code, out = _cli([*base, "1"], tmp_path)
    assert code == 0 and INTERNAL not in out, out[-3000:]
    assert "input 'sr': shape scalar" in out
    code, out = _cli([*base, "1x2"], tmp_path)
    assert code != 0 and INTERNAL not in out, out[-3000:]
    assert any(" ERROR " in line and "has rank 2 but the model input has rank 0" in line
               for line in out.splitlines()), out[-3000:]


def test_verifier_random_data_for_a_class_id_input_stays_within_the_table(tmp_path: Path, monkeypatch) -> None:
    """hb_verifier without -i on a model whose int64 input is a class id into a 10-row embedding (Gather):
    its random ids must be rows of the table, not values the Gather refuses ('out of data bounds'); and
    where random data does not fit a model, the error says to give data with -i."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Gather", ["emb", "cls"], ["e"], name="embed", axis=0),
             helper.make_node("Reshape", ["e", "shape"], ["e4"], name="as_map"),
             helper.make_node("Add", ["c", "e4"], ["y"], name="condition")]
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.3).astype(np.float32), "emb"),
             numpy_helper.from_array(np.array([1, 8, 1, 1], np.int64), "shape")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
              helper.make_tensor_value_info("cls", TensorProto.INT64, [])]
    graph = helper.make_graph(nodes, "conditioned", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = {"x": [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(4)],
               "cls": [np.array(k, np.int64) for k in range(4)]}
    convert_featuremaps(tmp_path, model, samples, "1x3x8x8;", "float32;int64", "cond")
    paths = tmp_path / "out" / "cond_quantized_model.onnx", tmp_path / "out" / "cond.bin"
    verdict = verify(*paths, None, 5)
    assert all(o.passed for o in verdict.outputs), "hb_verifier: the .bin and the quantized model differ"

    import hbtools.tools.verifier as verifier

    def out_of_table(rm, rng) -> dict[str, np.ndarray]:  # noqa: ANN001 - random_rt_inputs' signature
        return {"x": np.zeros((1, 3, 8, 8), np.float32), "cls": np.array(74, np.int64)}

    monkeypatch.setattr(verifier, "random_rt_inputs", out_of_table)
    with pytest.raises(HbError, match="out of data bounds") as error:
        verify(*paths, None, 5)
    assert "-i x:x.npy,cls:cls.npy" in (error.value.hint or "")


def test_a_model_onnxruntime_takes_only_with_open_sizes_is_told_so(tmp_path: Path) -> None:
    """Silero VAD's scripted export (silero_vad.onnx) squeezes dimensions inside the branch that the rate
    picks: onnxruntime runs it while the input sizes stay open, and refuses it at load once they are fixed
    (a branch's LSTM then infers a rank-1 input). The checker says that, and how to export such a model,
    instead of blaming input_shape."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((1, 32, 4)) * 0.3).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((1, 32, 8)) * 0.3).astype(np.float32), "R")
    then_graph = helper.make_graph([helper.make_node("LSTM", ["x", "W", "R"], ["", "h16k"], hidden_size=8)],
                                   "rate16k", [], [helper.make_tensor_value_info("h16k", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Squeeze", ["x"], ["squeezed"]),  # every size-1 axis
                                    helper.make_node("LSTM", ["squeezed", "W", "R"], ["", "h8k"], hidden_size=8)],
                                   "rate8k", [], [helper.make_tensor_value_info("h8k", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is16k"], name="is_16k"),
             helper.make_node("If", ["is16k"], ["state"], name="by_rate", then_branch=then_graph,
                              else_branch=else_graph)]
    graph = helper.make_graph(nodes, "scripted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 4]),
                                                   helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 1, 8])],
                              [w, r, numpy_helper.from_array(np.array(16000, np.int64), "rate")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    feed = {"x": np.ones((1, 1, 4), np.float32), "sr": np.array(16000, np.int64)}
    assert HB_ONNXRuntime(onnx_model=model).run(None, feed)[0].shape == (1, 1, 8)  # onnxruntime runs it
    onnx.save(model, tmp_path / "scripted.onnx")

    code, out = _cli(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                      str(tmp_path / "scripted.onnx"), "--input-shape", "x", "1x1x4"], tmp_path)
    assert INTERNAL not in out, out[-3000:]
    assert code != 0
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert any("only while the input sizes it leaves open stay open" in line for line in errors), errors
    assert any("export it with fixed input sizes" in line for line in errors), errors
    assert not any("check input_shape" in line for line in errors), errors
