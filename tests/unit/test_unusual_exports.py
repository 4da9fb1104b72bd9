"""Exports onnxruntime runs that are unusual in their encoding, not in their layers.

Each stopped with an internal error (or a refusal that contradicted "a model onnxruntime runs
converts") in a sweep over the small real-exporter models that ship in the ``onnx`` wheel
(``backend/test/data/pytorch-converted``, ``pytorch-operator``, ``simple``): IR-3 models with
Constant nodes, float64 models, opset 6, integer shape inputs, sequence values inside a
tensor model. The models here are built with ``onnx.helper`` with the same structure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conformance import INTERNAL, _cli, convert_featuremaps
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.tools.verifier import compare

COSINE = 0.99


def _model(nodes, inputs, output, opset: int = 11, ir_version: int | None = None, inits=(),
           out_shape: list[int] | None = None) -> ModelProto:
    out_shape = out_shape or inputs[0][2]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(output, inputs[0][1], out_shape)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version or 8
    return model


def _samples(rng: np.random.Generator, shape: list[int], dtype=np.float32, count: int = 6) -> list[np.ndarray]:
    return [rng.uniform(-1, 1, shape).astype(dtype) for _ in range(count)]


def _agrees_with_float(model: ModelProto, out_dir: Path, prefix: str, feed: dict[str, np.ndarray]) -> float:
    """Cosine of the quantized model's first output against onnxruntime on the source model."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = HB_ONNXRuntime(model_file=str(out_dir / f"{prefix}_quantized_model.onnx")).run(
        None, {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feed.items()})[0]
    return cosine_similarity(np.asarray(want, np.float64), np.asarray(got, np.float64))


def _constant(name: str, value: np.ndarray):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


IR3_CASES = {
    # A constant operand the quantize stage turns into a new initializer.
    "constant_operand": ([_constant("c", np.full((4, 4), 0.5, np.float32)), helper.make_node("Exp", ["x"], ["e"]),
                          helper.make_node("Mul", ["c", "x"], ["m"]), helper.make_node("Sub", ["e", "m"], ["y"])]),
    # Clip bounds and Slice positions given by Constant nodes.
    "clip_bounds": ([_constant("lo", np.array(-0.25, np.float32)), _constant("hi", np.array(0.25, np.float32)),
                     helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]),
    "slice_positions": ([_constant("s", np.array([0], np.int64)), _constant("e", np.array([2], np.int64)),
                         _constant("a", np.array([0], np.int64)),
                         helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])]),
}


@pytest.mark.parametrize("case", sorted(IR3_CASES))
def test_an_ir3_model_with_constant_nodes_converts(case: str, tmp_path: Path) -> None:
    """IR 3 lists every initializer among the inputs; a model with none (its constants are nodes)
    stayed at IR 3, and the initializers later stages add became inputs nobody feeds."""
    out_shape = [2, 4] if case == "slice_positions" else [4, 4]
    model = _model(IR3_CASES[case], [("x", TensorProto.FLOAT, [4, 4])], "y", ir_version=3, out_shape=out_shape)
    rng = np.random.default_rng(5)
    convert_featuremaps(tmp_path, model, {"x": _samples(rng, [4, 4])}, "4x4", "float32", "m")
    feed = {"x": rng.uniform(-1, 1, (4, 4)).astype(np.float32)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE


def test_a_float64_model_converts(tmp_path: Path) -> None:
    """Inputs, weights and constants in float64 (the lowering's grids and tables are float32): the
    model is computed in float32, and the quantized model agrees with the float64 one."""
    d = TensorProto.DOUBLE
    nodes = [_constant("c", np.array(0.5)), helper.make_node("Add", ["x", "y"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Sigmoid", ["m"], ["z"])]
    model = _model(nodes, [("x", d, [2, 3]), ("y", d, [3])], "z")
    rng = np.random.default_rng(6)
    out = convert_featuremaps(tmp_path, model, {"x": _samples(rng, [2, 3], np.float64),
                                                "y": _samples(rng, [3], np.float64)}, "2x3;3", "float64", "m")
    assert "computes in float64; converting it to float32" in out, out
    feed = {"x": rng.uniform(-1, 1, (2, 3)), "y": rng.uniform(-1, 1, 3)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE


def test_an_opset_6_model_converts(tmp_path: Path) -> None:
    """Opset 6 (PyTorch's exports of 2017, which onnxruntime still runs) goes through onnx's
    version converter like 7-10, instead of being refused."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 8, 8])], "y", opset=6, ir_version=3, inits=[w],
                   out_shape=[1, 4, 6, 6])
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3]))
    out = convert_featuremaps(tmp_path, model, {"x": _samples(rng, [1, 3, 8, 8])}, "1x3x8x8", "float32", "m")
    assert "converting the model from opset 6 to 11" in out
    feed = {"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE


def _expand_model() -> ModelProto:
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Relu", ["e"], ["y"])]
    return _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 1]), ("shape", TensorProto.INT64, [2])], "y",
                  out_shape=[3, 3])


def test_a_shape_input_gets_valid_values_in_the_checker(tmp_path: Path) -> None:
    """The checker's generated samples: an integer input is a size, shape or index, so it gets
    ones (valid for all three), not noise cast to integers (an Expand target onnxruntime refuses)."""
    from onnx import save

    save(_expand_model(), tmp_path / "m.onnx")
    code, out = _cli(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(tmp_path / "m.onnx"),
                      "--input-shape", "x", "1x3x1", "--input-shape", "shape", "2"], tmp_path)
    assert INTERNAL not in out, out[-2000:]
    assert code == 0, out[-2000:]


def test_a_sample_the_float_model_cannot_run_is_named(tmp_path: Path) -> None:
    """Calibration data the float model itself cannot run on stops with an ERROR that says so and
    which sample, not an internal error."""
    import yaml

    rng = np.random.default_rng(8)
    good = [np.array([3, 1], np.int64)] * 6
    convert_featuremaps(tmp_path, _expand_model(), {"x": _samples(rng, [1, 3, 1]), "shape": good}, "1x3x1;2", "int64",
                        "m")
    np.save(tmp_path / "cal_shape" / "5.npy", np.array([2, 2], np.int64))  # [1, 3, 1] cannot expand to [2, 2]
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["calibration_parameters"]["cal_data_type"] = "float32;int64"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    code, out = _cli(["makertbin", "--config", str(tmp_path / "config.yaml"), "--model-type", "onnx"], tmp_path)
    assert INTERNAL not in out, out[-2000:]
    assert code != 0
    assert "the float model cannot run calibration sample 6" in out, out[-2000:]
    assert "invalid expand shape" in out


def test_sequence_values_inside_a_tensor_model_convert(tmp_path: Path) -> None:
    """Sequence ops between tensor inputs and outputs run on the CPU; the node table has no cosine
    for a sequence value (it compared them as arrays and stopped)."""
    pos = numpy_helper.from_array(np.array(1, np.int64), "pos")
    nodes = [helper.make_node("SequenceConstruct", ["x", "y"], ["s"]),
             helper.make_node("SequenceAt", ["s", "pos"], ["z"]), helper.make_node("Relu", ["z"], ["out"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 3]), ("y", TensorProto.FLOAT, [1, 3])], "out", inits=[pos],
                   out_shape=[1, 3])
    rng = np.random.default_rng(9)
    convert_featuremaps(tmp_path, model, {"x": _samples(rng, [2, 3]), "y": _samples(rng, [1, 3])}, "2x3;1x3",
                        "float32", "m")
    feed = {"x": rng.uniform(-1, 1, (2, 3)).astype(np.float32), "y": rng.uniform(-1, 1, (1, 3)).astype(np.float32)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE


def test_a_node_without_inputs_converts(tmp_path: Path) -> None:
    """A node that reads nothing (SequenceEmpty, then filled) passes the rewrites that look at a node's
    first input (the patch-embedding rewrite stopped on it with an internal error)."""
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
             helper.make_node("SequenceInsert", ["empty", "x"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["z"], axis=0), helper.make_node("Relu", ["z"], ["out"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 3])], "out", out_shape=[2, 3])
    rng = np.random.default_rng(10)
    convert_featuremaps(tmp_path, model, {"x": _samples(rng, [2, 3])}, "2x3", "float32", "m")
    feed = {"x": rng.uniform(-1, 1, (2, 3)).astype(np.float32)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE


def test_a_layer_norm_with_a_computed_scale_runs_on_the_cpu(tmp_path: Path) -> None:
    """A LayerNormalization whose scale is computed (here from a second input) is not fused into the BPU
    kernel; it runs on the CPU with its reason instead of stopping placement."""
    nodes = [helper.make_node("Relu", ["g"], ["scale"]),
             helper.make_node("LayerNormalization", ["x", "scale"], ["out"], axis=-1, epsilon=1e-5)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [1, 4, 6]), ("g", TensorProto.FLOAT, [6])], "out",
                   out_shape=[1, 4, 6], opset=17)
    rng = np.random.default_rng(11)
    out = convert_featuremaps(tmp_path, model, {"x": _samples(rng, [1, 4, 6]), "g": _samples(rng, [6])},
                              "1x4x6;6", "float32", "m")
    feed = {"x": rng.uniform(-1, 1, (1, 4, 6)).astype(np.float32), "g": rng.uniform(0.5, 1, 6).astype(np.float32)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE
    assert "LayerNormalization with a scale or bias computed at run time" in out


@pytest.mark.parametrize(("outputs", "read"), [(["y", "mean", "inv"], ["y", "mean", "inv"]),
                                               (["y", "", "inv"], ["y", "inv"]), (["y", "mean", ""], ["y"])])
def test_a_layer_norm_that_also_gives_its_statistics_normalizes_on_the_bpu(outputs: list[str], read: list[str],
                                                                           tmp_path: Path) -> None:
    """ONNX's LayerNormalization may also give Mean and InvStdDev (training-style exports, every ONNX test
    case). The whole op stayed on the CPU with a reason about its axes and scale, which were fine. Now Y is
    normalized on the BPU and a float copy beside it gives the statistics that are read: graph outputs here,
    except a named Mean nothing reads, which needs no copy."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 6).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, 6).astype(np.float32), "bias")]
    shapes = {"y": [1, 4, 6], "mean": [1, 4, 1], "inv": [1, 4, 1]}
    graph = helper.make_graph([helper.make_node("LayerNormalization", ["x", "scale", "bias"], outputs, axis=-1)],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in read], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = convert_featuremaps(tmp_path, model, {"x": _samples(rng, [1, 4, 6])}, "1x4x6", "float32", "m", "max")
    assert "over these axes" not in out
    rows = [line.split() for line in out.splitlines() if line.startswith("LayerNormalization_0")]
    # the node tables name the copy (LayerNormalization_0_statistics) as the user's node it is written for
    placed = sorted((r[0], r[1]) for r in rows if r[1] in ("BPU", "CPU"))
    statistics = [("LayerNormalization_0", "CPU")] if read != ["y"] else []
    assert placed == [("LayerNormalization_0", "BPU"), *statistics], out[-2000:]
    if statistics:
        assert "Mean / InvStdDev outputs has no BPU form (the BPU kernel gives Y only)" in out
    feed = {"x": rng.uniform(-1, 1, (1, 4, 6)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, feed)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert min(cosine_similarity(w.astype(np.float64), g.astype(np.float64)) for w, g in zip(want, got, strict=True)) \
        >= COSINE


def test_verifier_counts_nan_on_one_side_only() -> None:
    """A CPU op that gives NaN (Pow of a negative base) gives it in both models: agreement."""
    a = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    assert compare("y", a, a.copy(), 5).passed
    b = np.array([1.0, 0.0, np.inf, 2.0], np.float32)
    c = compare("y", a, b, 5)
    assert not c.passed and c.nan == 1 and c.diff == 0


def test_a_clip_with_bounds_of_shape_1_after_a_conv_converts(tmp_path: Path) -> None:
    """Clip bounds stored as [1] tensors (onnxruntime runs them; Caffe's ReLU6 came out so): the conv they
    fuse into stopped with 'internal error: TypeError: only 0-dimensional arrays can be converted'."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) / 3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0.0], np.float32), "lo"),
             numpy_helper.from_array(np.array([0.5], np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 6, 6])], "y", opset=13, inits=inits,
                   out_shape=[1, 4, 6, 6])
    convert_featuremaps(tmp_path, model, {"x": _samples(rng, [1, 3, 6, 6])}, "1x3x6x6", "float32", "m")
    feed = {"x": rng.uniform(-1, 1, (1, 3, 6, 6)).astype(np.float32)}
    assert _agrees_with_float(model, tmp_path / "out", "m", feed) >= COSINE
