"""The debugger observing a model input: a calibration node reading a graph input directly.

Found by hunt 24 (D1) on a recommendation model: int64 ids read by embedding Gathers, and a float input
``dense`` read by its calibration node. plot_distribution / get_channelwise_data_distribution of
``dense_HzCalibration``, and runall's distribution step, died in onnxruntime ("Graph output (dense) does
not exist in the graph"): the board's float model part is cut to the nodes making what it hands on, and
with a stage 0 of Gathers only it held no reader of ``dense``, so ``dense`` was declared its output but
not its input. The unstaged board's float model, asked for ``dense`` alone, held no node at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from debug_support import assert_png
from onnx import TensorProto, helper, numpy_helper

import horizon_nn.debug as dbg
from hbtools.debug.data import load_samples
from hbtools.debug.model import load_calibrated
from hbtools.debug.switchboard import Switchboard
from hbtools.graph.graph import part_model
from hbtools.pipeline.runner import makertbin
from hbtools.runtime.session import ort_session

TABLES, ROWS, DIM, DENSE = 8, 50, 8, 13
SAMPLES = 4
NODE = "dense_HzCalibration"


def _recommender() -> onnx.ModelProto:
    """ids int64 [1, 8] -> 8 embedding Gathers (first in graph order), dense float [1, 13] -> Gemm -> Relu;
    Concat -> Gemm -> Relu -> Gemm -> Relu -> Gemm."""
    rng = np.random.default_rng(0)
    inits, nodes, pieces = [], [], []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def gemm(x: str, k: int, n: int, name: str) -> str:
        w = const(f"{name}_w", (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
        b = const(f"{name}_b", (0.1 * rng.standard_normal(n)).astype(np.float32))
        nodes.append(helper.make_node("Gemm", [x, w, b], [f"{name}_out"], name=name, transB=1))
        return f"{name}_out"

    def relu(x: str, name: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [f"{name}_out"], name=name))
        return f"{name}_out"

    for k in range(TABLES):
        column = const(f"column{k}", np.array([k], np.int64))
        table = const(f"table{k}", rng.standard_normal((ROWS, DIM)).astype(np.float32))
        nodes.append(helper.make_node("Gather", ["ids", column], [f"id{k}"], name=f"pick{k}", axis=1))
        nodes.append(helper.make_node("Gather", [table, f"id{k}"], [f"emb{k}_3d"], name=f"embedding{k}"))
        shape = const(f"flat{k}", np.array([1, DIM], np.int64))
        nodes.append(helper.make_node("Reshape", [f"emb{k}_3d", shape], [f"emb{k}"], name=f"flatten{k}"))
        pieces.append(f"emb{k}")
    pieces.append(relu(gemm("dense", DENSE, DIM, "bottom"), "bottom_relu"))
    nodes.append(helper.make_node("Concat", pieces, ["joined"], name="concat", axis=1))
    x = relu(gemm("joined", DIM * (TABLES + 1), 32, "top0"), "top0_relu")
    x = relu(gemm(x, 32, 16, "top1"), "top1_relu")
    nodes.append(helper.make_node("Identity", [gemm(x, 16, 1, "top2")], ["y"], name="out"))
    graph = helper.make_graph(nodes, "recommender",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, TABLES]),
                               helper.make_tensor_value_info("dense", TensorProto.FLOAT, [1, DENSE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recommender")
    onnx.save(_recommender(), root / "m.onnx")
    rng = np.random.default_rng(1)
    for name in ("ids", "dense"):
        (root / "cal" / name).mkdir(parents=True)
    for k in range(SAMPLES):
        rng.integers(0, ROWS, (1, TABLES)).astype(np.int64).tofile(root / "cal" / "ids" / f"{k}.bin")
        rng.standard_normal((1, DENSE)).astype(np.float32).tofile(root / "cal" / "dense" / f"{k}.bin")
    config = {
        "model_parameters": {"onnx_model": "m.onnx", "march": "bayes-e", "working_dir": "out",
                             "output_model_file_prefix": "m", "debug_mode": "dump_calibration_data"},
        "input_parameters": {"input_name": "ids;dense", "input_type_train": "featuremap;featuremap",
                             "input_type_rt": "featuremap;featuremap", "input_layout_train": "NCHW;NCHW",
                             "norm_type": "no_preprocess;no_preprocess"},
        "calibration_parameters": {"cal_data_dir": "cal/ids;cal/dense", "cal_data_type": "int64;float32",
                                   "calibration_type": "max"},
        "compiler_parameters": {"compile_mode": "latency"},
    }
    (root / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    makertbin(root / "c.yaml", "onnx")
    return root / "out"


def test_every_staging_hands_on_an_observed_model_input(converted: Path) -> None:
    """Whatever the cuts, a board observing ``dense`` builds, and gives the sample's ``dense`` (what the
    calibration node reads) beside the model output the unstaged board gives."""
    cm = load_calibrated(converted / "m_calibrated_model.onnx")
    assert cm.calibration[NODE].input == "dense"
    samples = load_samples(converted / "calibration_data", cm, 2)
    everything = set(cm.calibration)
    observe = ["dense", *cm.outputs]
    whole = Switchboard(cm, observe, max_stages=1)
    assert whole.stage_count == 1
    counts, reader_after_stage_0 = set(), False
    for max_stages in range(1, 25):
        board = Switchboard(cm, observe, max_stages=max_stages)
        counts.add(board.stage_count)
        reader_after_stage_0 |= board.stages_run({NODE})[0] > 0
        for sample in samples:
            cache, reference = board.float_pass(sample), whole.float_pass(sample)
            np.testing.assert_array_equal(cache["dense"], sample["dense"])
            for enabled in (set(), {NODE}, everything):
                got, expected = board.run(sample, cache, enabled), whole.run(sample, reference, enabled)
                np.testing.assert_array_equal(got[0], sample["dense"])
                np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6, err_msg=f"{max_stages}")
    assert len(counts) > 2, counts
    assert reader_after_stage_0, "no staging put the reader of 'dense' after stage 0 (the case that failed)"
    # observed alone, as plot_distribution observes it: the board's float model reads no node
    for max_stages in (1, 24):
        board = Switchboard(cm, ["dense"], max_stages=max_stages)
        for sample in samples:
            cache = board.float_pass(sample)
            np.testing.assert_array_equal(board.run(sample, cache, everything)[0], sample["dense"])


def test_plots_and_runall_take_the_node_on_a_model_input(converted: Path, tmp_path: Path) -> None:
    model, data = str(converted / "m_calibrated_model.onnx"), str(converted / "calibration_data")
    got = dbg.plot_distribution(save_dir=str(tmp_path / "pd"), model_or_file=model, calibrated_data=data,
                                nodes_list=[NODE])
    assert_png(got[NODE])
    got = dbg.get_channelwise_data_distribution(save_dir=str(tmp_path / "cw"), model_or_file=model,
                                                calibrated_data=data, nodes_list=[NODE])
    assert_png(got[NODE])
    written = dbg.runall(model_or_file=model, calibrated_data=data, save_dir=str(tmp_path / "all"),
                         dis_nodes_list=[NODE, "embedding0"], cw_nodes_list=[NODE])
    assert sorted(written) == ["accumulate_error", "channelwise_distribution", "data_distribution",
                               "node_sensitivity", "sensitivity_analysis"]
    assert all(written.values()), written
    assert {p.name for p in written["data_distribution"]} >= {f"{NODE}_distribution.png"}
    assert [p.name for p in written["channelwise_distribution"]] == [f"{NODE}_channelwise.png"]


def test_a_part_hands_on_an_output_none_of_its_nodes_makes() -> None:
    """part_model declares such an output (a graph input asked for as it is) an input too."""
    whole = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["a"], ["r"], name="relu"), helper.make_node("Neg", ["b"], ["n"], name="neg")], "g",
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [2]) for t in ("a", "b")],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [2]) for t in ("r", "n")]),
        opset_imports=[helper.make_opsetid("", 13)])
    whole.ir_version = 8
    types = {t: TensorProto.FLOAT for t in ("a", "b", "r", "n")}
    a, b = np.array([-1.0, 2.0], np.float32), np.array([3.0, -4.0], np.float32)
    part = part_model(whole, [whole.graph.node[0]], ["r", "b"], {}, types, "part")
    assert [i.name for i in part.graph.input] == ["a", "b"]
    r, handed = ort_session(part).run(["r", "b"], {"a": a, "b": b})
    np.testing.assert_array_equal(r, [0.0, 2.0])
    np.testing.assert_array_equal(handed, b)
    empty = part_model(whole, [], ["b"], {}, types, "empty")  # no node at all
    np.testing.assert_array_equal(ort_session(empty).run(["b"], {"b": b})[0], b)
