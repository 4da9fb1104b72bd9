"""plot_acc_error, plot_distribution, get_channelwise_data_distribution, sensitivity_analysis, runall.

Every figure is opened as an image and checked for size and content.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import MODELS
from debug_support import Dumped, assert_png, convert_with_dump, degrade

import horizon_nn.debug as dbg
from hbtools.debug.model import load_calibrated
from hbtools.errors import HbError


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("resnet_like"), MODELS["resnet_like"]())


def common(dumped: Dumped, save_dir: Path) -> dict:
    return {"save_dir": str(save_dir), "model_or_file": str(dumped.calibrated), "calibrated_data": str(dumped.data)}


def test_acc_error_curves(dumped: Dumped, tmp_path: Path) -> None:
    single = dbg.plot_acc_error(**common(dumped, tmp_path), quantize_node=["Conv_0", "Conv_1"])
    assert list(single) == ["Conv_0", "Conv_1"]
    curve = single["Conv_1"]
    cm = load_calibrated(dumped.calibrated)
    assert list(curve)[0] == "HZ_PREPROCESS_FOR_data" and "Softmax_0" in curve
    assert curve["Conv_0"] == pytest.approx(1.0), "upstream of the only quantized node the model is float"
    assert curve["Conv_1"] < 1.0
    nested = dbg.plot_acc_error(**common(dumped, tmp_path), quantize_node=[["Conv_0"], ["Conv_0", "Conv_1"]])
    assert list(nested) == ["partial_qmodel_0", "partial_qmodel_1"]
    kinds = dbg.plot_acc_error(**common(dumped, tmp_path), quantize_node=["weight", "activation"],
                               average_mode=True)
    plain = dbg.plot_acc_error(**common(dumped, tmp_path), quantize_node=["weight", "activation"])
    for label in ("weight", "activation"):
        values = np.array(list(plain[label].values()))
        running = np.cumsum(values) / np.arange(1, values.size + 1)
        np.testing.assert_allclose(list(kinds[label].values()), running)
    everything = dbg.plot_acc_error(**common(dumped, tmp_path), non_quantize_node=[[]], metric="mse")
    assert everything["partial_qmodel_0"]["Softmax_0"] > 0, "nothing left float: the calibrated model"
    for name in ("accumulate_error_quantize_cosine-similarity.png",
                 "accumulate_error_quantize_cosine-similarity_average.png",
                 "accumulate_error_non_quantize_mse.png"):
        assert_png(tmp_path / name, 900, 500)
    assert len(cm.nodes) == len(curve), "one point per ordinary node with a float output"


def test_plots_read_only_the_samples_they_plot(dumped: Dumped, tmp_path: Path) -> None:
    """plot_acc_error plots 8 samples but read and checked every file of a calibration_data folder first (a
    folder of 2000 640x640 samples held in memory): a damaged file beyond the eighth now goes unread
    (hunt 41 D5)."""
    import shutil

    data = tmp_path / "calibration_data"
    shutil.copytree(dumped.data, data)
    files = sorted(p for p in data.rglob("*.npy"))
    folder = files[0].parent
    for k in range(8):  # samples 1..8 copies of the first, then a damaged ninth
        shutil.copy(files[0], folder / f"zz_{k:02d}.npy")
    (folder / "zz_99.npy").write_bytes(b"not a numpy file")
    for path in files:
        path.unlink()
    values = dbg.plot_acc_error(save_dir=str(tmp_path / "plots"), model_or_file=str(dumped.calibrated),
                                calibrated_data=str(data), quantize_node=["Conv_0"])
    assert values["Conv_0"]["Conv_0"] < 1.0
    dbg.plot_distribution(str(tmp_path / "plots"), str(dumped.calibrated), str(data), nodes_list=["Conv_0"])


def test_unquantizing_the_most_sensitive_weights_helps_step_by_step(dumped: Dumped, tmp_path: Path) -> None:
    """The seed's workflow: rank the weights, then leave the top 1, 2, 3 float."""
    cm = load_calibrated(dumped.calibrated)
    weights = cm.of_kind("weight")
    model = tmp_path / "degraded.onnx"
    onnx.save(degrade(dumped.model(), dict(zip(weights, (30.0, 12.0, 5.0), strict=True))), str(model))
    ranked = list(dbg.get_sensitivity_of_nodes(str(model), calibrated_data=str(dumped.data), node_type="weight"))
    assert ranked == weights, "the more a weight is degraded, the more sensitive it is"
    curves = dbg.plot_acc_error(save_dir=str(tmp_path), calibrated_data=str(dumped.data), model_or_file=str(model),
                                non_quantize_node=[ranked[:1], ranked[:2], ranked[:3]])
    final = [c["Softmax_0"] for c in curves.values()]
    assert final[0] < final[1] < final[2]


def test_distributions(dumped: Dumped, tmp_path: Path) -> None:
    cm = load_calibrated(dumped.calibrated)
    nodes = [cm.of_kind("activation")[1], cm.of_kind("weight")[0], "Conv_1", "Relu_0"]
    written = dbg.plot_distribution(**common(dumped, tmp_path), nodes_list=nodes)
    assert list(written) == nodes
    for node, path in written.items():
        assert_png(Path(path), 800 if node in ("Conv_1", "Relu_0") else 600, 400)
    boxes = dbg.get_channelwise_data_distribution(**common(dumped, tmp_path), nodes_list=nodes[:2])
    for path in boxes.values():
        assert_png(Path(path), 600, 400)
    axis0 = dbg.get_channelwise_data_distribution(**common(dumped, tmp_path / "axis"), nodes_list=nodes[:1], axis=0)
    assert_png(Path(axis0[nodes[0]]), 600, 400)
    # the tensor's own shape (batch 1), not that of the samples stacked along its first axis
    with pytest.raises(HbError, match=r"axis 4 is out of range .* 4 dimensions \[1, "):
        dbg.get_channelwise_data_distribution(**common(dumped, tmp_path), nodes_list=nodes[:1], axis=4)
    with pytest.raises(HbError, match="'Conv_1' is an ordinary node, but nodes_list takes weight calibration"):
        dbg.get_channelwise_data_distribution(**common(dumped, tmp_path), nodes_list=["Conv_1"])
    with pytest.raises(HbError, match="nodes_list is required"):
        dbg.plot_distribution(**common(dumped, tmp_path))


def test_distribution_of_a_bias_calibration_node(dumped: Dumped, tmp_path: Path) -> None:
    """A HzBiasCalibration node is a node of the calibrated model, which nodes_list takes ('all nodes in the
    calibrated model'): it was refused ("no node named ..."). Its figure shows the float bias and the bias on
    its int32 grid; the other tools say what it is."""
    model = dumped.model()
    bias = next(n for n in model.graph.node if n.op_type == "HzBiasCalibration")
    written = dbg.plot_distribution(**common(dumped, tmp_path), nodes_list=[bias.name, "Conv_1"])
    assert list(written) == [bias.name, "Conv_1"]
    assert_png(Path(written[bias.name]), 600, 400)
    with pytest.raises(HbError, match=f"'{bias.name}' is a bias calibration node"):
        dbg.get_channelwise_data_distribution(**common(dumped, tmp_path), nodes_list=[bias.name])


def test_sensitivity_analysis(dumped: Dumped, tmp_path: Path) -> None:
    result = dbg.sensitivity_analysis(model_or_file=str(dumped.calibrated), calibrated_data=str(dumped.data),
                                      pick_threshold=1.0, data_num=2, save_dir=str(tmp_path))
    picked = list(result["single"])
    assert picked and list(result["partial"]) == ["none", *picked]
    node_message = dbg.get_sensitivity_of_nodes(str(dumped.calibrated), calibrated_data=str(dumped.data), data_num=2)
    for node in picked:
        assert result["single"][node] == pytest.approx(float(node_message[node]["cosine-similarity"]))
    assert result["partial"][picked[-1]] == pytest.approx(1.0), "every sensitive node left float"
    assert_png(tmp_path / "sensitivity_analysis.png", 600, 400)
    chosen = dbg.sensitivity_analysis(str(dumped.calibrated), str(dumped.data), sensitive_nodes=["Conv_1"],
                                      save_dir=str(tmp_path))
    assert list(chosen["single"]) == ["Conv_1"]
    with pytest.raises(HbError, match="sensitive_nodes: no node named 'conv1'"):
        dbg.sensitivity_analysis(str(dumped.calibrated), str(dumped.data), sensitive_nodes=["conv1"])


def test_acc_error_argument_errors(dumped: Dumped, tmp_path: Path) -> None:
    with pytest.raises(HbError, match="needs quantize_node or non_quantize_node"):
        dbg.plot_acc_error(**common(dumped, tmp_path))
    with pytest.raises(HbError, match="quantize_node: no node named 'Conv_7'"):
        dbg.plot_acc_error(**common(dumped, tmp_path), quantize_node=["Conv_7"])
    with pytest.raises(HbError, match="metric: unknown metric 'l2'"):
        dbg.plot_acc_error(**common(dumped, tmp_path), quantize_node=["Conv_1"], metric="l2")


def test_runall_writes_every_step(dumped: Dumped, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    logger = logging.getLogger("hbtools")
    logger.addHandler(caplog.handler)  # a tool's setup (another test's) stops propagation
    try:
        with caplog.at_level("INFO", logger="hbtools"):
            written = dbg.runall(model_or_file=str(dumped.calibrated), calibrated_data=str(dumped.data))
    finally:
        logger.removeHandler(caplog.handler)
    # each 'saved' line names the file where it is once the run is done (it named the run's staging folder)
    saved = [Path(r.getMessage().removeprefix("saved ")) for r in caplog.records if r.getMessage().startswith("saved ")]
    assert saved and all(p.exists() for p in saved), [p for p in saved if not p.exists()][:3]
    root = tmp_path / "debug_result"
    out = capsys.readouterr().out
    assert f"results saved under {root}" in out
    assert sorted(p.name for p in (root / "node_sensitivity").iterdir()) == [
        "sensitivity_of_activation.csv", "sensitivity_of_activation.txt",
        "sensitivity_of_weight.csv", "sensitivity_of_weight.txt"]
    table = (root / "node_sensitivity" / "sensitivity_of_weight.txt").read_text().splitlines()
    assert table[1].split() == ["Weight", "Node", "cosine-similarity"]
    csv = (root / "node_sensitivity" / "sensitivity_of_activation.csv").read_text().splitlines()
    assert csv[0] == "Activation,Node,Threshold,Bit,cosine-similarity"
    for step in ("data_distribution", "channelwise_distribution", "accumulate_error", "sensitivity_analysis"):
        pngs = sorted((root / step).glob("*.png"))
        assert pngs and sorted(Path(p).name for p in written[step]) == [p.name for p in pngs]
        for png in pngs:
            assert_png(png, 400, 300)
    cm = load_calibrated(dumped.calibrated)
    top = min(5, len(cm.of_kind("weight"))) + min(5, len(cm.of_kind("activation")))
    assert len(list((root / "data_distribution").glob("*.png"))) == top
    by_node = dbg.runall(str(dumped.calibrated), str(dumped.data), save_dir=str(tmp_path / "nodes"),
                         node_type="node", verbose=True, data_num=1, quantize_node=["Conv_1"])
    assert "=node=" in capsys.readouterr().out.replace("=" * 2, "=")
    assert [p.name for p in by_node["node_sensitivity"]] == ["sensitivity_of_node.txt", "sensitivity_of_node.csv"]


def test_runall_replaces_its_results_as_one_set(dumped: Dumped, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A runall that fails half-way leaves the previous results whole; the next complete one replaces
    them all (no table of a node type it did not measure is left beside its own)."""
    import importlib

    runall_module = importlib.import_module("hbtools.debug.runall")  # the package's runall is the function
    save = tmp_path / "out"
    dbg.runall(str(dumped.calibrated), str(dumped.data), save_dir=str(save), data_num=1)
    before = {str(p.relative_to(save)): p.read_bytes() for p in save.rglob("*") if p.is_file()
              and not p.name.startswith(".")}
    assert "node_sensitivity/sensitivity_of_weight.txt" in before

    def fails(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(runall_module, "analyse", fails)  # the last step
        with pytest.raises(KeyboardInterrupt):
            dbg.runall(str(dumped.calibrated), str(dumped.data), save_dir=str(save), node_type="node", data_num=1)
    after = {str(p.relative_to(save)): p.read_bytes() for p in save.rglob("*") if p.is_file()
             and not p.name.startswith(".")}
    assert after == before
    dbg.runall(str(dumped.calibrated), str(dumped.data), save_dir=str(save), node_type="node", data_num=1)
    assert sorted(p.name for p in (save / "node_sensitivity").iterdir()) == ["sensitivity_of_node.csv",
                                                                            "sensitivity_of_node.txt"]


def test_runall_keeps_the_users_files_in_its_step_folders(dumped: Dumped, tmp_path: Path) -> None:
    """Seed 002's workflow writes figures with the single functions under debug_result/ before runall: runall
    replaced its step folders whole, deleting them and the user's notes without a word (hunt 13 D1)."""
    save = tmp_path / "debug_result"
    dbg.plot_acc_error(save_dir=str(save / "accumulate_error"), calibrated_data=str(dumped.data),
                       model_or_file=str(dumped.calibrated), non_quantize_node=["weight"])
    figures = sorted(p.name for p in (save / "accumulate_error").iterdir())
    (save / "node_sensitivity").mkdir()
    (save / "node_sensitivity" / "my_notes.txt").write_text("Conv_2 looks bad")
    dbg.runall(str(dumped.calibrated), str(dumped.data), save_dir=str(save), data_num=1)
    assert (save / "node_sensitivity" / "my_notes.txt").read_text() == "Conv_2 looks bad"
    assert set(figures) <= {p.name for p in (save / "accumulate_error").iterdir()}, figures
    assert (save / "node_sensitivity" / "sensitivity_of_weight.txt").exists()


def test_channelwise_rows_of_a_grouped_conv_transpose_weight_are_its_output_channels() -> None:
    """A ConvTranspose weight [C_in, C_out/group, k, k] lists only C_out/group channels on axis 1; the plot
    used to draw that many boxes, each mixing the groups."""
    from hbtools.debug.channelwise import channel_rows
    from hbtools.debug.model import CalibrationNode

    groups, cin, per_group = 2, 4, 3
    w = np.arange(cin * per_group * 2 * 2, dtype=np.float64).reshape(cin, per_group, 2, 2)
    node = CalibrationNode("w_cal", "weight", "w", "w_q", (1.0,) * groups * per_group, 8, 1, ("deconv",), groups)
    rows, axis = channel_rows(node, w, None, "w_cal")
    assert axis == 1 and rows.shape == (groups * per_group, (cin // groups) * 2 * 2)
    # ONNX: output channel g * per_group + j reads w[c, j] for the input channels c of group g.
    for g in range(groups):
        for j in range(per_group):
            want = w[g * (cin // groups):(g + 1) * (cin // groups), j].reshape(-1)
            np.testing.assert_array_equal(np.sort(rows[g * per_group + j]), np.sort(want))
    plain = CalibrationNode("w_cal", "weight", "w", "w_q", (1.0,) * per_group, 8, 1, ("deconv",))
    assert channel_rows(plain, w, None, "w_cal")[0].shape == (per_group, cin * 2 * 2)
