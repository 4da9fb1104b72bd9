"""get_sensitivity_of_nodes on a small converted model: tables, ranking, arguments, errors."""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import MODELS, FloatModel, _Graph
from debug_support import Dumped, convert_with_dump, degrade

import horizon_nn.debug as dbg
from hbtools.debug.model import load_calibrated
from hbtools.errors import HbError


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("resnet_like"), MODELS["resnet_like"]())


def sens(dumped: Dumped, model: object = None, **kwargs) -> dict[str, dict[str, str]]:
    return dbg.get_sensitivity_of_nodes(model_or_file=model or str(dumped.calibrated),
                                        calibrated_data=str(dumped.data), **kwargs)


HEADERS = {"node": ["Node"], "weight": ["Weight", "Node"], "activation": ["Activation", "Node", "Threshold", "Bit"]}


@pytest.mark.parametrize("node_type", ["node", "weight", "activation"])
def test_table_layout_and_return_value(dumped: Dumped, node_type: str, capsys: pytest.CaptureFixture) -> None:
    result = sens(dumped, metrics=["cosine-similarity", "mse"], node_type=node_type, verbose=True)
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    cm = load_calibrated(dumped.calibrated)
    expected = cm.quantizable if node_type == "node" else cm.of_kind(node_type)
    assert sorted(result) == sorted(expected)
    assert re.fullmatch(rf"=+{node_type}=+", lines[0])
    assert set(lines[2]) == {"-"} and len(lines[2]) == len(lines[0])
    assert lines[1].split() == [*HEADERS[node_type], "cosine-similarity", "mse"]
    rows = lines[3:]
    assert [r.split()[0] for r in rows] == list(result), "table rows in the returned order"
    column = lines[1].index("cosine-similarity")
    for row, (name, values) in zip(rows, result.items(), strict=True):
        assert row[column:].split()[0] == values["cosine-similarity"]
        assert set(values) == {"cosine-similarity", "mse"} and all(isinstance(v, str) for v in values.values())
        if node_type == "weight":
            assert row.split()[1] == ",".join(cm.calibration[name].consumers)
        if node_type == "activation":
            c = cm.calibration[name]
            assert row.split()[2:4] == [str(c.threshold), str(c.bits)]
    cosines = [float(v["cosine-similarity"]) for v in result.values()]
    assert cosines == sorted(cosines), "most sensitive (lowest cosine) first"


def test_ranking_follows_the_first_metric(dumped: Dumped) -> None:
    result = sens(dumped, metrics=["mse", "cosine-similarity"])
    # as typed on a command line ('-m mse,cosine-similarity'): refused as one unknown metric name
    assert sens(dumped, metrics="mse, cosine-similarity") == result
    errors = [float(v["mse"]) for v in result.values()]
    assert errors == sorted(errors, reverse=True), "higher error first"
    sqnr = [float(v["sqnr"]) for v in sens(dumped, metrics="sqnr").values()]
    assert sqnr == sorted(sqnr)


def test_degraded_weight_is_ranked_first(dumped: Dumped, tmp_path: Path) -> None:
    ranked = list(sens(dumped, node_type="weight"))
    victim = ranked[-1]  # the least sensitive one
    path = tmp_path / "degraded.onnx"
    onnx.save(degrade(dumped.model(), {victim: 10.0}), str(path))
    assert list(sens(dumped, model=str(path), node_type="weight"))[0] == victim
    # An onnx.ModelProto works as well as a path.
    assert list(sens(dumped, model=onnx.load(str(path)), node_type="weight"))[0] == victim


def test_interested_nodes_and_output_node(dumped: Dumped) -> None:
    cm = load_calibrated(dumped.calibrated)
    weight = cm.of_kind("weight")[0]
    result = sens(dumped, interested_nodes=["Conv_1", weight], node_type="activation")
    assert sorted(result) == sorted(["Conv_1", weight])
    # Measured at Conv_1's output, nodes whose calibration comes after Conv_1 cannot change it: not ranked.
    at_conv = sens(dumped, output_node="Conv_1", node_type="node")
    assert not {"Relu_1", "GlobalAveragePool_0", "Gemm_0"} & set(at_conv), sorted(at_conv)
    assert float(at_conv["Conv_1"]["cosine-similarity"]) < 1.0 and "Conv_0" in at_conv
    # The node that makes a model output is a place to measure too, though no calibration node feeds it.
    last = cm.producers[cm.model.graph.output[0].name]
    if last.name in cm.calibration:  # the output's own calibration node: the node it calibrates
        last = cm.producers[last.input[0]]
    last = last.name
    at_output = sens(dumped, output_node=last, node_type="node")
    assert set(at_output) == set(cm.quantizable)


def test_data_num_and_dataset_objects(dumped: Dumped) -> None:
    one = sens(dumped, data_num=1)
    cm = load_calibrated(dumped.calibrated)
    sample = np.load(dumped.data / "data" / "0.npy")
    from_mapping = dbg.get_sensitivity_of_nodes(str(dumped.calibrated), calibrated_data={"data": [sample]})
    from_list = dbg.get_sensitivity_of_nodes(str(dumped.calibrated), calibrated_data=[{"data": sample}])
    assert from_mapping == one == from_list
    assert len(sens(dumped, data_num=None)) == len(cm.quantizable)


def test_one_samples_configurations_spread_over_the_workers(dumped: Dumped, monkeypatch: pytest.MonkeyPatch) -> None:
    """With fewer samples left than workers, their configurations are shared out: no worker waits for the
    others' last sample, and one sample no longer runs on one worker alone. The values are those of one worker."""
    from hbtools.debug import switchboard

    threads: set[int] = set()
    run = switchboard.Switchboard.run

    def recording(self: switchboard.Switchboard, *args: object) -> list[np.ndarray]:
        threads.add(threading.get_ident())
        time.sleep(0.01)  # as long as a real model's run: one worker cannot finish its piece before the other starts
        return run(self, *args)

    monkeypatch.setattr(switchboard.Switchboard, "run", recording)
    monkeypatch.setattr(switchboard, "WORKERS", 1)
    alone = sens(dumped, data_num=1, metrics=["cosine-similarity", "mse"])
    assert len(threads) == 1
    threads.clear()
    monkeypatch.setattr(switchboard, "WORKERS", 2)
    shared = sens(dumped, data_num=1, metrics=["cosine-similarity", "mse"])
    # The main thread may run a few itself, checking whether stacking samples pays.
    assert len(threads - {threading.main_thread().ident}) == 2, "both workers ran configurations"
    assert shared == alone and list(shared) == list(alone)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"interested_nodes": ["Conv_9"]}, ["no node named 'Conv_9'", "Conv_0", "valid choices"]),
    ({"output_node": "data_hz_preprocessed_HzCalibration"},
     ["activation calibration node", "output_node takes", "Conv_0"]),
    ({"output_node": "Relu_9"}, ["no node named 'Relu_9'", "Relu_0"]),
    ({"interested_nodes": []}, ["interested_nodes is an empty list"]),  # was an empty table, exit code 0
    ({"data_num": 0}, ["data_num", "from 1 to 4"]),
    ({"data_num": 5}, ["data_num", "from 1 to 4"]),
    ({"node_type": "layer"}, ["'layer'", "'node', 'weight', 'activation'"]),
    ({"metrics": ["cosine"]}, ["'cosine'", "cosine-similarity, mse, mre, sqnr, chebyshev"]),
])
def test_argument_errors_name_the_choices(dumped: Dumped, kwargs: dict, words: list[str]) -> None:
    with pytest.raises(HbError) as info:
        sens(dumped, **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_model_and_data_errors(dumped: Dumped, tmp_path: Path) -> None:
    optimized = str(dumped.calibrated).replace("_calibrated_model", "_optimized_float_model")
    with pytest.raises(HbError, match="no HzCalibration nodes"):
        dbg.get_sensitivity_of_nodes(optimized, calibrated_data=str(dumped.data))
    wrong = tmp_path / "calibration_data" / "image"
    wrong.mkdir(parents=True)
    shutil.copy(dumped.data / "data" / "0.npy", wrong / "0.npy")
    with pytest.raises(HbError, match=r"no folder for model input 'data'.*\[data\].*found \[image\]") as info:
        dbg.get_sensitivity_of_nodes(str(dumped.calibrated), calibrated_data=str(wrong.parent))
    assert "dump_calibration_data" in info.value.hint  # a makertbin cal_data_dir is the usual mistake
    bad = tmp_path / "bad" / "data"
    bad.mkdir(parents=True)
    np.save(bad / "0.npy", np.zeros((1, 3, 4, 4), np.int8))
    with pytest.raises(HbError, match=r"0.npy holds int8 \[1, 3, 4, 4\].*takes shape \[1, 3, 16, 16\]"):
        dbg.get_sensitivity_of_nodes(str(dumped.calibrated), calibrated_data=str(bad.parent))
    with pytest.raises(HbError, match="does not exist"):
        dbg.get_sensitivity_of_nodes(str(dumped.calibrated), calibrated_data=str(tmp_path / "nowhere"))
    with pytest.raises(HbError, match="calibrated_data is required"):
        dbg.get_sensitivity_of_nodes(str(dumped.calibrated))


def test_sqnr_averages_noise_power_so_one_exact_sample_does_not_make_it_infinite() -> None:
    """A node whose error is zero on one sample or output scored sqnr = inf (a mean of dB values) and was
    ranked least sensitive although it does cause error."""
    from hbtools.metrics import average, running_average, sqnr

    reference = np.linspace(-1.0, 1.0, 50)
    exact, noisy = sqnr(reference, reference), sqnr(reference, reference + 0.01)
    assert exact == np.inf and np.isfinite(noisy)
    both = average("sqnr", [exact, noisy])
    assert noisy < both < np.inf and both == pytest.approx(noisy + 10 * np.log10(2))  # half the noise power
    assert average("sqnr", [exact, exact]) == np.inf and average("mse", [1.0, 3.0]) == 2.0
    np.testing.assert_allclose(running_average("sqnr", [noisy, exact, noisy]),
                               [noisy, noisy + 10 * np.log10(2), noisy + 10 * np.log10(1.5)])


def _cross_attention(h: int = 40) -> FloatModel:
    """A DETR decoder's cross-attention in 2-D token matrices: h*h memory rows from a conv map, h*h/16 query rows
    from its 4x4 max-pool; the queries attend to the memory (q, k, v and out projections), plus the queries."""
    g = _Graph(5)
    fmap = g.op("Relu", [g.conv("data", 3, 8)])
    pooled = g.op("MaxPool", [fmap], kernel_shape=[4, 4], strides=[4, 4])

    def rows(x: str, count: int) -> str:  # [1, 8, a, b] -> [a*b, 8]
        return g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([8, count], np.int64), "rows")])], perm=[1, 0])

    def project(x: str) -> str:
        return g.op("MatMul", [x, g.const((g.rng.standard_normal((8, 8)) / np.sqrt(8)).astype(np.float32), "w")])

    memory, queries = rows(fmap, h * h), rows(pooled, h * h // 16)
    values, keys = project(memory), project(memory)
    weights = g.op("Softmax", [g.op("MatMul", [project(queries), g.op("Transpose", [keys])])], axis=-1)
    out = g.op("Add", [project(g.op("MatMul", [weights, values])), queries])
    return g.model({"data": [1, 3, h, h]}, [out])


def test_hand_overs_of_different_row_counts(tmp_path: Path) -> None:
    """The memory's 1600 rows and the queries' 100 were declared with one leading dimension name, so onnxruntime
    gave one's buffer to the other and every run stopped ("Shape mismatch attempting to re-use buffer";
    RT-DETR, hunt 16 D2)."""
    dumped = convert_with_dump(tmp_path, _cross_attention())
    result = sens(dumped)
    assert sorted(result) == sorted(load_calibrated(dumped.calibrated).quantizable)
    cosines = [float(v["cosine-similarity"]) for v in result.values()]
    assert all(0.9 < c <= 1.0 for c in cosines), cosines


def test_activation_table_shows_where_an_asymmetric_grid_lies(dumped: Dumped, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """An int8 grid with zero point -128 holds 0..threshold, but the table showed only Threshold and Bit, so it read
    as a symmetric ±threshold grid of twice the step (RDK X3 default puts zero points on most tensors). With a zero
    point on some row, a Range column follows the seed's columns, in the console table and the CSV."""
    from onnx import helper

    from hbtools.debug.data import load_samples
    from hbtools.debug.sensitivity import measure
    from hbtools.ops.base import attrs_of

    model = dumped.model()
    node = next(n for n in model.graph.node if n.op_type == "HzCalibration" and attrs_of(n)["kind"] == "activation")
    threshold = attrs_of(node)["thresholds"][0]
    scale = next(a for a in node.attribute if a.name == "scales")
    scale.floats[:] = [threshold / 255]
    node.attribute.append(helper.make_attribute("zero_points", [-128]))
    path = tmp_path / "asymmetric.onnx"
    onnx.save(model, str(path))
    result = sens(dumped, model=str(path), node_type="activation", verbose=True)
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[1].split() == [*HEADERS["activation"], "cosine-similarity", "Range"]
    cm = load_calibrated(path)
    rows = {r.split()[0]: r.split() for r in lines[3:]}
    assert rows[node.name][-1] == f"0..{threshold:.6g}", rows[node.name]
    for name in result:
        if name != node.name:
            t = cm.calibration[name].threshold
            assert rows[name][-1] == f"{-t:.6g}..{t:.6g}", rows[name]
    table = measure(cm, load_samples(str(dumped.data), cm, 1), ["cosine-similarity"], "activation")
    _, csv = table.write(tmp_path / "out", "activation")
    header, *cells = csv.read_text().splitlines()
    assert header.split(",")[-1] == "Range"
    assert any(c.startswith(node.name + ",") and c.endswith(f",0..{threshold:.6g}") for c in cells), cells
