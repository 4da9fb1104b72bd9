"""The x86 simulator: runtime input types, exact agreement with HB_ONNXRuntime, independence of the lowering."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bin_fixtures import build_bin
from builders import FloatModel
from onnx import TensorProto, helper, numpy_helper

from hbtools.data import colour
from hbtools.errors import HbError
from hbtools.ops import registry
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import BinFormatError, read_bin, write_bin
from hbtools.runtime.rt_input import random_rt_input, rt_shape, to_model_input
from hbtools.runtime.runtime_model import load, open_model
from hbtools.runtime.simulator import Simulator

CASES = {
    # name: (model, march, input_parameters overrides)
    "resnet_rgb": ("resnet_like", "bayes-e", {}),
    "resnet_nv12": ("resnet_like", "bayes-e", {"input_type_rt": "nv12"}),
    "resnet_nv12_bt601_video": ("resnet_like", "bayes-e",
                                {"input_type_rt": "nv12", "input_space_and_range": "bt601_video"}),
    "resnet_yuv444_nhwc": ("resnet_like", "bayes-e", {"input_type_rt": "yuv444", "input_layout_rt": "NHWC"}),
    "resnet_bgr_nchw_on_bernoulli2": ("resnet_like", "bernoulli2", {"input_type_rt": "bgr"}),
    "activations": ("activations", "bayes-e", {}),
    "data_movement": ("data_movement", "bayes-e", {}),
    "act_matmul": ("act_matmul", "bayes-e", {}),
    "featuremap": ("featuremap_mlp", "bayes-e", {}),
    "data_movement_int16": ("data_movement", "bayes-e", {}),
}


def _sim_and_reference(built, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], Simulator]:
    sim = Simulator(open_model(built.bin))
    rng = np.random.default_rng(seed)
    feeds = {d.name: random_rt_input(d, rng) for d in sim.model.inputs}
    prepared = sim.prepare(feeds)
    ours = list(sim.run(feeds).values())
    theirs = HB_ONNXRuntime(model_file=built.quantized).run(None, prepared)
    return ours, theirs, sim


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulator_equals_quantized_onnx_exactly(tmp_path, case: str) -> None:
    model, march, inputs = CASES[case]
    extra = {"calibration_parameters": {"optimization": "set_all_nodes_int16"}} if case.endswith("int16") else {}
    built = build_bin(tmp_path, model, march=march, input_parameters=inputs, **extra)
    ours, theirs, sim = _sim_and_reference(built)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert sim.structure.subgraphs, "every model here has BPU work"
    if extra:
        types = {a.s for n in sim.model.graph.graph.node for a in n.attribute if a.name == "out_type"}
        assert b"int16" in types


def test_simulator_does_not_use_the_lowering(tmp_path, monkeypatch) -> None:
    built = build_bin(tmp_path, "act_matmul")
    ours, theirs, _ = _sim_and_reference(built)

    def refuse(cls: type, node: onnx.NodeProto, ctx: object) -> list:
        raise AssertionError("the simulator lowered a Hz op")

    for op_type in ("HzSQuantizedConv", "HzSQuantizedMatMul", "HzLut", "HzQuantize", "HzDequantize",
                    "HzSQuantizedEltwise", "HzRequantize"):
        monkeypatch.setattr(registry.get(op_type), "lower", classmethod(refuse))
    sim = Simulator(open_model(built.bin))
    feeds = {d.name: random_rt_input(d, np.random.default_rng(0)) for d in sim.model.inputs}
    for a, b in zip(sim.run(feeds).values(), theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_nv12_input_is_decoded_like_the_device(tmp_path) -> None:
    built = build_bin(tmp_path, "resnet_like", input_parameters={"input_type_rt": "nv12"})
    desc = open_model(built.bin).inputs[0]
    assert desc.layout == "NHWC" and rt_shape(desc) == (1, 24, 16)
    rgb = np.random.default_rng(3).integers(0, 256, (16, 16, 3)).astype(np.float64)
    nv12 = colour.rgb_to_nv12(rgb)
    x = to_model_input(desc, nv12.reshape(-1))  # a flat byte buffer is accepted
    want = (colour.nv12_decode(nv12).astype(np.int16) - 128).astype(np.int8)[None]
    np.testing.assert_array_equal(x, want)


def test_runtime_data_of_the_wrong_size_or_type_is_an_error(tmp_path) -> None:
    built = build_bin(tmp_path, "resnet_like", input_parameters={"input_type_rt": "nv12"})
    sim = Simulator(open_model(built.bin))
    with pytest.raises(HbError, match=r"takes 384 values .* got 768"):
        sim.run({"data": np.zeros(768, np.uint8)})
    with pytest.raises(HbError, match="takes uint8 data, got float32"):
        sim.run({"data": np.zeros(384, np.float32)})
    with pytest.raises(HbError, match=r"missing \['data'\], unknown \['x'\]"):
        sim.run({"x": np.zeros(384, np.uint8)})


def _gray_model() -> FloatModel:
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) / 3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["img", "w"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "gray", [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return FloatModel(onnx.shape_inference.infer_shapes(model), {"img": [1, 1, 8, 8]})


def test_gray_input(tmp_path, monkeypatch) -> None:
    import builders

    monkeypatch.setitem(builders.MODELS, "gray", _gray_model)
    built = build_bin(tmp_path, "gray", input_parameters={
        "input_type_train": "gray", "input_type_rt": "gray", "mean_value": "128", "scale_value": "0.0078125"})
    ours, theirs, sim = _sim_and_reference(built)
    assert sim.model.inputs[0].type_rt == "gray"
    np.testing.assert_array_equal(ours[0], theirs[0])


def test_descriptors_must_match_the_graph(tmp_path) -> None:
    built = build_bin(tmp_path, "resnet_like")
    model = read_bin(built.bin).model()
    model.inputs[0]["name"] = "renamed"
    with pytest.raises(BinFormatError, match=r"input descriptors \['renamed'\] do not match the graph inputs"):
        load(model)
    model.inputs[0].update(name="data", input_type_rt="nv13")
    with pytest.raises(BinFormatError, match="unknown input_type_rt 'nv13'"):
        load(model)
    model.inputs[0]["input_type_rt"] = "gray"
    with pytest.raises(BinFormatError, match="gray input 'data' cannot have 3 channels"):
        load(model)


def test_graph_defects_are_one_line_errors(tmp_path) -> None:
    built = build_bin(tmp_path, "resnet_like")
    model = read_bin(built.bin).model()
    graph = model.load_graph()
    graph.graph.node[2].input[0] = "nowhere"
    model.graph = graph.SerializeToString()
    write_bin(tmp_path / "bad.bin", [model])
    with pytest.raises(BinFormatError, match="reads tensor 'nowhere' that nothing produces") as e:
        Simulator(open_model(tmp_path / "bad.bin"))
    assert "\n" not in str(e.value)


def test_bpu_subgraphs_split_where_a_path_returns_from_the_cpu() -> None:
    from hbtools.runtime.structure import _preds, components

    def node(name: str, ins: list[str]) -> onnx.NodeProto:
        return helper.make_node("Relu", ins, [name], name=name)

    # a -> cpu -> b and a -> b: b must not share a's subgraph (it waits for the CPU)
    nodes = [node("a", ["x"]), node("cpu", ["a"]), node("b", ["a", "cpu"]), node("c", ["b"])]
    assert components(_preds(nodes), ["BPU", "CPU", "BPU", "BPU"]) == [[0], [2, 3]]


def test_a_side_path_only_bpu_nodes_read_joins_the_subgraph_reading_it() -> None:
    """A side input's few ops (a scale factor's Slices, Concat and reciprocal) that only a BPU node after a CPU node
    reads ran as a BPU call of their own at the start (hunt 33 D3: 4 BPU subgraphs for a PP-YOLOE-style head)."""
    from hbtools.runtime.structure import _preds, components

    def node(name: str, ins: list[str]) -> onnx.NodeProto:
        return helper.make_node("Relu", ins, [name], name=name)

    nodes = [node("conv", ["image"]), node("cpu", ["conv"]), node("side", ["scale"]), node("recip", ["side"]),
             node("div", ["cpu", "recip"]), node("early", ["scale"]), node("both", ["early"]), node("c2", ["conv"])]
    on = ["BPU", "CPU", "BPU", "BPU", "BPU", "BPU", "BPU", "BPU"]
    nodes[6].input.append("cpu")  # 'early' feeds a BPU node after the CPU; 'c2' only what is there from the start
    groups = components(_preds(nodes), on)
    assert [0, 7] in groups  # the conv part keeps what reads only it
    assert [2, 3, 4, 5, 6] in groups and len(groups) == 2, groups
