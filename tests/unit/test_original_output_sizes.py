"""The original float model keeps its outputs' sizes (hunt 29 D5: every output came out as ``['?', '?']``,
though input_shape changed nothing), and with an input_shape that changes them gets the inferred ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from hbtools.config.loader import load_config
from hbtools.pipeline import parse
from hbtools.runtime import HB_ONNXRuntime


def _model(batch: int | str, size: int) -> onnx.ModelProto:
    """A conv net with two outputs: the conv's map (its sizes follow the input's) and 10 class scores."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32), "fc"),
             numpy_helper.from_array(np.zeros(10, np.float32), "b")]
    nodes = [helper.make_node("Conv", ["data", "w"], ["map"], name="Conv_0", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["map"], ["pooled"], name="Pool_0"),
             helper.make_node("Flatten", ["pooled"], ["flat"], name="Flatten_0"),
             helper.make_node("Gemm", ["flat", "fc", "b"], ["scores"], name="Gemm_0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT,
                                                                         [batch, 3, size, size])],
                              [helper.make_tensor_value_info("map", TensorProto.FLOAT, [batch, 8, size, size]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


def _parse(root: Path, model: onnx.ModelProto, input_shape: str | None, rt: str) -> onnx.ModelProto:
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(root / "model.onnx"))
    train = "featuremap" if rt == "featuremap" else ("gray" if rt == "gray" else "rgb")
    inputs = {"input_name": "data", "input_type_train": train, "input_layout_train": "NCHW", "input_type_rt": rt,
              "norm_type": "no_preprocess" if rt == "featuremap" else "data_scale", "scale_value": 0.0078125}
    if rt == "featuremap":
        del inputs["scale_value"]
    if input_shape:
        inputs["input_shape"] = input_shape
    config = {"model_parameters": {"onnx_model": "model.onnx", "march": "bayes-e", "working_dir": "out",
                                   "output_model_file_prefix": "m"},
              "input_parameters": inputs,
              "calibration_parameters": {"calibration_type": "skip"},
              "compiler_parameters": {"optimize_level": "O0"}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return parse.run(load_config(root / "config.yaml", cal_data=False)).model


def _sizes(model: onnx.ModelProto) -> dict[str, list]:
    return {o.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in o.type.tensor_type.shape.dim] for o in model.graph.output}


def _run(model: onnx.ModelProto, rt: str, shape: list[int]) -> list[np.ndarray]:
    """The original float model run as users run it: image data 0..255 (or a float featuremap)."""
    sess = HB_ONNXRuntime(onnx_model=model)
    rng = np.random.default_rng(1)
    if rt == "featuremap":
        return sess.run_feature(None, {"data": rng.standard_normal(shape).astype(np.float32)})
    channels = 1 if rt == "gray" else 3
    data = rng.integers(0, 256, (shape[0], channels, *shape[2:]), dtype=np.uint8)
    return sess.run(None, {"data": data})


@pytest.mark.parametrize("rt", ["nv12", "yuv444", "rgb", "bgr", "gray", "featuremap"])
def test_sizes_kept_where_input_shape_changes_nothing(tmp_path: Path, rt: str) -> None:
    model = _model(1, 16)
    if rt == "gray":  # a one-channel model
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((8, 1, 3, 3), np.float32), "w"))
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 1
    original = _parse(tmp_path, model, None, rt)
    assert _sizes(original) == {"map": [1, 8, 16, 16], "scores": [1, 10]}
    outs = _run(original, rt, [1, 3, 16, 16])
    assert [list(o.shape) for o in outs] == [[1, 8, 16, 16], [1, 10]]


def test_sizes_follow_an_input_shape_that_changes_them(tmp_path: Path) -> None:
    """A dynamic batch given as 1, and a model exported at 16x16 converted at 32x32: the sizes the new input
    shape gives, not the exported ones nor unknown ones."""
    original = _parse(tmp_path / "batch", _model("N", 16), "1x3x16x16", "rgb")
    assert _sizes(original) == {"map": [1, 8, 16, 16], "scores": [1, 10]}
    original = _parse(tmp_path / "size", _model(1, 16), "1x3x32x32", "nv12")
    assert _sizes(original) == {"map": [1, 8, 32, 32], "scores": [1, 10]}
    assert [list(o.shape) for o in _run(original, "nv12", [1, 3, 32, 32])] == [[1, 8, 32, 32], [1, 10]]


def test_inferred_sizes_replace_what_the_model_states(tmp_path: Path) -> None:
    """An exporter's symbol, or a stale size, on an output is replaced by the size inference gives."""
    model = _model(1, 16)
    model.graph.output[1].type.tensor_type.shape.dim[1].dim_param = "classes"
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 15
    original = _parse(tmp_path, model, None, "featuremap")
    assert _sizes(original) == {"map": [1, 8, 16, 16], "scores": [1, 10]}
