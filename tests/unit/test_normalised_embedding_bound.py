"""An L2-normalised embedding's elements lie within 1 whatever the picture; on RDK X5 its int16 grid ended at the
largest element the calibration samples gave, so a held-out picture with one larger component came back clipped and
no longer of unit norm (a ReID net's norms 0.96-0.97; hunt 49 D1). A tensor over its own L2 norm is bounded by 1 in
every form the exporters and the optimize stage write, and its int16 grid reaches the bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from hbtools.cli.hb_mapper import main
from hbtools.graph.graph import GraphView
from hbtools.quant.bounds import value_bounds
from horizon_tc_ui import HB_ONNXRuntime


def _normalised(form: str, extra: list | None = None) -> onnx.ModelProto:
    """Conv 1x1 + Relu -> GlobalAveragePool -> Flatten -> f / ||f|| in ``form``."""
    weight = np.eye(4, 3, dtype=np.float32)[:, :, None, None]
    weight[3] = 0.3
    consts = {"w": weight, "b": np.full(4, 1.0, np.float32), "axes": np.array([1], np.int64),
              "eps": np.array(1e-12, np.float32), "two": np.array(2.0, np.float32), "big": np.array(5.0, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"])]
    if form == "F.normalize":
        nodes += [helper.make_node("ReduceL2", ["f"], ["n"], axes=[1], keepdims=1),
                  helper.make_node("Clip", ["n", "eps"], ["n_eps"]),
                  helper.make_node("Div", ["f", "n_eps"], ["emb"])]
    elif form == "sqrt-sum-eps":
        nodes += [helper.make_node("Pow", ["f", "two"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axes"], ["s"]),
                  helper.make_node("Add", ["s", "eps"], ["s_eps"]), helper.make_node("Sqrt", ["s_eps"], ["n"]),
                  helper.make_node("Div", ["f", "n"], ["emb"])]
    elif form == "reciprocal":
        nodes += [helper.make_node("Mul", ["f", "f"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axes"], ["s"]),
                  helper.make_node("Sqrt", ["s"], ["n"]), helper.make_node("Reciprocal", ["n"], ["inv"]),
                  helper.make_node("Mul", ["inv", "f"], ["emb"])]
    elif form == "upper-clip":  # min(||f||, 5) may be below an element: no bound
        nodes += [helper.make_node("ReduceL2", ["f"], ["n"], axes=[1], keepdims=1),
                  helper.make_node("Clip", ["n", "eps", "big"], ["n_eps"]),
                  helper.make_node("Div", ["f", "n_eps"], ["emb"])]
    else:  # another tensor's norm: no bound
        nodes += [helper.make_node("ReduceL2", ["p"], ["n"], axes=[2, 3], keepdims=0),
                  helper.make_node("Div", ["f", "n"], ["emb"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("form", "bounded"), [("F.normalize", True), ("sqrt-sum-eps", True), ("reciprocal", True),
                                               ("upper-clip", False), ("other-norm", False)])
def test_a_tensor_over_its_own_norm_is_bounded_by_one(form: str, bounded: bool) -> None:
    found = value_bounds(GraphView(_normalised(form)))
    assert found.get("emb") == (1.0 if bounded else None), found


def test_a_normalised_embedding_keeps_unit_norm_on_rdk_x5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    onnx.save(_normalised("F.normalize"), "m.onnx")
    Path("cal").mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):  # grey-ish pictures: no component of the embedding beyond ~0.6
        (0.5 + rng.normal(0, 0.05, (1, 1, 8, 8)) + rng.normal(0, 0.05, (1, 3, 8, 8))).astype(np.float32).tofile(
            f"cal/{i}.bin")
    config = {
        "model_parameters": {"onnx_model": "m.onnx", "march": "bayes-e", "working_dir": "out",
                             "output_model_file_prefix": "m"},
        "input_parameters": {"input_name": "x", "input_type_rt": "featuremap", "input_type_train": "featuremap",
                             "input_layout_train": "NCHW", "input_shape": "1x3x8x8", "norm_type": "no_preprocess"},
        "calibration_parameters": {"cal_data_dir": "cal", "cal_data_type": "float32", "calibration_type": "default",
                                   "optimization": "set_all_nodes_int16"},
        "compiler_parameters": {"optimize_level": "O2"},
    }
    Path("c.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["makertbin", "-c", "c.yaml", "--model-type", "onnx"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    quantized = HB_ONNXRuntime(model_file="out/m_quantized_model.onnx")
    red = np.zeros((1, 3, 8, 8), np.float32)
    red[:, 0] = 1.0  # one channel alone: an embedding component of 0.87
    emb = quantized.run_feature(None, {"x": red})[0]
    assert abs(float(np.linalg.norm(emb)) - 1) < 2e-3, emb


def _lp(p: int) -> onnx.ModelProto:
    model = _normalised("F.normalize")
    nodes = [n for n in model.graph.node if n.op_type in ("Conv", "Relu", "GlobalAveragePool", "Flatten")]
    nodes.append(helper.make_node("LpNormalization", ["f"], ["emb"], name="lpnorm", axis=1, p=p))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_runs_on_the_bpu_of_rdk_x5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, p: int) -> None:
    """ONNX's LpNormalization ran on the CPU ("not supported") where the same division by ReduceL2 ran on the BPU
    (hunt 49 D3): it is written as that division, with the same values (0 for a zero vector, as onnxruntime's). Only
    an embedding's: a per-pixel norm of a map stays in float (near-zero pixels: hunt 50 D2)."""
    import onnxruntime as ort

    from hbtools.march.profiles import get_profile
    from hbtools.pipeline import optimize

    model = _lp(p)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert "LpNormalization" not in {n.op_type for n in optimized.graph.node}
    if p == 2:
        assert value_bounds(GraphView(optimized)).get("emb") == 1.0
    for x in (np.random.default_rng(3).normal(0.5, 0.5, (1, 3, 8, 8)), np.full((1, 3, 8, 8), -10.0)):
        want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x.astype(np.float32)})[0] for m in (model, optimized))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "m.onnx")
    result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", "m.onnx"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and "1 BPU subgraph(s) and 0 CPU node(s)" in result.output, result.output
    per_pixel = _lp(p)
    per_pixel.graph.node[-1].input[0] = "r"  # the Relu's map [1, 4, 8, 8], normalised over the channels
    per_pixel.graph.output[0].type.tensor_type.shape.Clear()
    assert "LpNormalization" in {n.op_type for n in optimize.run(per_pixel, get_profile("bayes-e")).graph.node}


def test_rdk_x3_names_what_keeps_an_embeddings_norm_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RDK X3 has no L2 reduction in any rank: the reason said "ReduceL2 on a 2-D tensor [1, 4] ... takes 4-D tensors
    only", as if a 4-D embedding would run on the BPU (hunt 49 D4)."""
    monkeypatch.chdir(tmp_path)
    onnx.save(_normalised("F.normalize"), "m.onnx")
    result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", "bernoulli2", "--model",
                                       "m.onnx"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.split()[1:2] == ["ReduceL2"])
    assert "ReduceL2 is not supported on the BPU of bernoulli2" in row, row


def test_a_norm_moved_to_other_places_gives_no_bound() -> None:
    """Each pixel's norm over the channels, reshaped onto the channels: an element is divided by another group's
    norm and may exceed 1."""
    nodes = [helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1),
             helper.make_node("Reshape", ["n", "shape"], ["moved"]),
             helper.make_node("Div", ["x", "moved"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 2])],
                              [numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert "y" not in value_bounds(GraphView(model))
