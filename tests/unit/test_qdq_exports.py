"""Quantized models as exporters write them: load (and the weight-only case) read every one of these forms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_calibration_load import ACT_SCALE, _config, _run_qdq
from test_exporter_structures import _cpu_nodes

from hbtools.log import setup
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime

FORMS = ["constant_nodes", "computed_scale", "blocked", "contrib", "int16", "int16_zero_point", "uint16", "float8",
         "weights_only"]


def _exported(form: str) -> onnx.ModelProto:
    """feat -> Q/DQ -> Conv with a per-channel int8 weight through a DequantizeLinear -> Relu -> Q/DQ -> y.
    ``constant_nodes``: scales and zero points as Constant nodes (torch.onnx.export of fake-quant modules);
    ``computed_scale``: the float weight quantized by a QuantizeLinear whose scale is computed from it (Abs,
    ReduceMax, Div: torch's dynamo export); ``blocked``: a scale per block of 9 weight inputs (opset 21
    ``block_size``); ``contrib``: every Q/DQ in onnxruntime's com.microsoft domain; ``int16``: 16-bit pairs with
    zero point 0 (opset 21); ``int16_zero_point`` / ``uint16``: 16-bit pairs with a zero point (onnxruntime's
    QInt16 / QUInt16 activations, asymmetric by default); ``float8``: pairs on a float8 e4m3 grid (FP8 exports,
    opset 19); ``weights_only``: no activation pair (weight-only quantization). A zero point is shared through an
    Identity, as torch.ao's export does."""
    rng = np.random.default_rng(0)
    w_float = rng.normal(0, 0.5, (4, 2, 3, 3)).astype(np.float32)
    w_scale = (np.abs(w_float).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    w_q = np.clip(np.round(w_float / w_scale[:, None, None, None]), -127, 127).astype(np.int8)
    int16 = form.startswith(("int16", "uint16"))
    domain = "com.microsoft" if form == "contrib" else ""
    inits, nodes = [], []

    def constant(name: str, value: np.ndarray) -> None:
        if form == "constant_nodes":
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        else:
            inits.append(numpy_helper.from_array(value, name))

    float8 = form == "float8"
    constant("s", np.array(ACT_SCALE / 256 if int16 else ACT_SCALE * 127 / 448 if float8 else ACT_SCALE, np.float32))
    if float8:
        inits.append(helper.make_tensor("zp_source", TensorProto.FLOAT8E4M3FN, [], [0.0]))
    else:
        zero = {"int16": np.int16(0), "int16_zero_point": np.int16(1000), "uint16": np.uint16(32768)}
        constant("zp_source", np.array(zero.get(form, np.int8(0))))
    constant("w_zp", np.zeros(4, np.int8))
    nodes.append(helper.make_node("Identity", ["zp_source"], ["zp"]))
    x = "feat"
    if form != "weights_only":
        nodes += [helper.make_node("QuantizeLinear", ["feat", "s", "zp"], ["feat_q"], name="q0", domain=domain),
                  helper.make_node("DequantizeLinear", ["feat_q", "s", "zp"], ["feat_dq"], name="dq0", domain=domain)]
        x = "feat_dq"
    if form == "computed_scale":
        inits += [numpy_helper.from_array(w_float, "w_float"), numpy_helper.from_array(np.float32(127), "levels")]
        nodes += [helper.make_node("Abs", ["w_float"], ["w_abs"]),
                  helper.make_node("ReduceMax", ["w_abs"], ["w_max"], axes=[1, 2, 3], keepdims=0),
                  helper.make_node("Div", ["w_max", "levels"], ["w_s"]),
                  helper.make_node("QuantizeLinear", ["w_float", "w_s", "w_zp"], ["w_q"], name="qw", axis=0),
                  helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dqw", axis=0)]
    elif form == "blocked":  # [4, 18] integers, a scale per 9 of them, reshaped to the conv's weight
        inits += [numpy_helper.from_array(w_q.reshape(4, 18), "w_q"),
                  numpy_helper.from_array(np.repeat(w_scale[:, None], 2, axis=1) * [[1.0, 0.5]], "w_s"),
                  numpy_helper.from_array(np.array([4, 2, 3, 3], np.int64), "w_shape")]
        inits[-2] = numpy_helper.from_array(numpy_helper.to_array(inits[-2]).astype(np.float32), "w_s")
        nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w_flat"], name="dqw", axis=1, block_size=9),
                  helper.make_node("Reshape", ["w_flat", "w_shape"], ["w"])]
    else:
        inits += [numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(w_scale, "w_s")]
        nodes.append(helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dqw", axis=0,
                                      domain=domain))
    nodes += [helper.make_node("Conv", [x, "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"])]
    if form == "weights_only":
        nodes.append(helper.make_node("Identity", ["r"], ["y"]))
    else:
        nodes += [helper.make_node("QuantizeLinear", ["r", "s", "zp"], ["r_q"], name="q1", domain=domain),
                  helper.make_node("DequantizeLinear", ["r_q", "s", "zp"], ["y"], name="dq1", domain=domain)]
    graph = helper.make_graph(nodes, "qat", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    opset = 21 if form == "blocked" or int16 else 19 if float8 else 13
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10 if opset == 21 else 9 if opset == 19 else 8
    return model


def _without_the_output_pair(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its last pair (on the model output) an Identity: the output grid of the quantized model
    is its own (int16 on bayes-e), as in test_calibration_load."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = [n for n in out.graph.node if n.name not in ("q1", "dq1")]
    if len(nodes) < len(out.graph.node):
        nodes.append(helper.make_node("Identity", ["r"], ["y"]))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


@pytest.mark.parametrize("form", FORMS)
def test_quantized_exports_convert_with_their_own_grids(form: str, tmp_path: Path, monkeypatch) -> None:
    """Each stopped before: an ERROR that a Constant-node scale was not constant, an internal error on the
    blocked scale and on the float8 pairs, every node on the CPU for the contrib-domain pairs and the weight-only
    model (which nothing told to use load), the int16 pairs calibrated int8 behind a Clip (with a zero point, as
    onnxruntime's QInt16 / QUInt16 write them, until session 52). Now every one runs on
    the BPU and agrees with the QDQ model (which rounds as the quantized model does), the int16 pairs on int16
    grids."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    model = _exported(form)
    onnx.save(model, str(tmp_path / "qat.onnx"))
    paths = makertbin(_config(tmp_path, "skip" if form == "weights_only" else "load"), "onnx")
    calibrated = onnx.load(str(paths["calibrated"]))
    sixteen_bits = form.startswith(("int16", "uint16"))
    assert not {n.op_type for n in calibrated.graph.node} & {"QuantizeLinear", "DequantizeLinear"}
    assert not _cpu_nodes(paths["bin"])
    bits = {n.input[0]: helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
            for n in calibrated.graph.node if n.op_type == "HzCalibration" and n.input[0] in ("feat", "r", "y")}
    if sixteen_bits:
        assert bits["feat"] == 16, bits
    x = (np.random.default_rng(1).standard_normal((1, 2, 8, 8)) * 2).astype(np.float32)
    # a pair with a zero point clips to its range (a Clip keeps it), the output's included
    want = _run_qdq(model if form in ("int16_zero_point", "uint16") else _without_the_output_pair(model), {"feat": x})
    # weight-only: a float model whose weights are the integers times their scales (calibrated on random data)
    artefact = "original" if form == "weights_only" else "quantized"
    got = HB_ONNXRuntime(model_file=paths[artefact]).run_feature(None, {"feat": x})[0]
    # float8 rounds relative to each value, the BPU's grid uniformly over the pair's range
    bound = 1e-5 if form == "weights_only" else 0.002 if sixteen_bits else 0.05 if form == "float8" else 0.02
    assert np.abs(want - got).max() <= bound * np.abs(want).max(), (form, np.abs(want - got).max())
