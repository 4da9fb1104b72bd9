"""The debugger on samples the float model cannot use: one ERROR naming the sample, or that sample left out.

Found by a hunt with a model taking an int64 index and a float featuremap: an index out of the table's range ended
in "internal error" (makertbin, hb_verifier and hrt_model_exec say which sample), and one NaN in one sample made
every sensitivity NaN, so the table came out in model order, exit code 0, no word.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

import horizon_nn.debug as dbg
from hbtools.errors import HbError
from hbtools.pipeline.runner import makertbin

SAMPLES = 4


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conv of a featuremap, plus a row of a table picked by an int64 index; converted with a dump."""
    root = tmp_path_factory.mktemp("index")
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table"),
             numpy_helper.from_array(np.array([1, 8, 1, 1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["f", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Gather", ["table", "idx"], ["e"], name="gather"),
             helper.make_node("Reshape", ["e", "shape"], ["e4"], name="reshape"),
             helper.make_node("Add", ["a", "e4"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 4, 8, 8]),
                                           helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, root / "m.onnx")
    for name in ("f", "idx"):
        (root / "cal" / name).mkdir(parents=True)
    for k in range(SAMPLES):
        rng.standard_normal((1, 4, 8, 8)).astype(np.float32).tofile(root / "cal" / "f" / f"{k}.bin")
        np.array([k], np.int64).tofile(root / "cal" / "idx" / f"{k}.bin")
    config = {
        "model_parameters": {"onnx_model": "m.onnx", "march": "bayes-e", "working_dir": "out",
                             "output_model_file_prefix": "m", "debug_mode": "dump_calibration_data"},
        "input_parameters": {"input_name": "f;idx", "input_type_train": "featuremap;featuremap",
                             "input_type_rt": "featuremap;featuremap", "input_layout_train": "NCHW;NCHW",
                             "norm_type": "no_preprocess;no_preprocess"},
        "calibration_parameters": {"cal_data_dir": "cal/f;cal/idx", "cal_data_type": "float32;int64",
                                   "calibration_type": "max"},
        "compiler_parameters": {"compile_mode": "latency"},
    }
    (root / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    makertbin(root / "c.yaml", "onnx")
    return root / "out"


def _samples(converted: Path) -> list[dict[str, np.ndarray]]:
    data = converted / "calibration_data"
    return [{"f": np.load(data / "f" / f"{k}.npy"), "idx": np.load(data / "idx" / f"{k}.npy")} for k in range(SAMPLES)]


def _sensitivity(converted: Path, samples: list[dict[str, np.ndarray]]) -> dict[str, dict[str, str]]:
    return dbg.get_sensitivity_of_nodes(str(converted / "m_calibrated_model.onnx"), calibrated_data=samples,
                                        node_type="weight")


def test_an_index_out_of_range_is_one_error_naming_the_sample(converted: Path) -> None:
    samples = _samples(converted)
    samples[2]["idx"] = np.array([12], np.int64)
    with pytest.raises(HbError) as info:
        _sensitivity(converted, samples)
    text = str(info.value)
    assert "the float model cannot run sample 3 of calibrated_data" in text and "Gather" in text, text


def test_nan_in_a_sample_is_one_error_naming_it(converted: Path) -> None:
    samples = _samples(converted)
    samples[1]["f"] = samples[1]["f"].copy()
    samples[1]["f"][0, 0, 0, 0] = np.nan
    # the second sample, numbered from 1 as the other messages number them (it said 'sample 1': hunt 14b D6)
    with pytest.raises(HbError, match=r"sample 2 of input 'f' holds 1 of 256 values that are NaN or infinite"):
        _sensitivity(converted, samples)
    samples[1]["f"] = np.full((1, 4, 8, 8), 1e39)  # float64 beyond float32: it was blamed on the model (D8)
    with pytest.raises(HbError, match=r"sample 2 of input 'f': input 'f' takes float32, and 256 of the float64 "
                                      r"values given are beyond float32's range"):
        _sensitivity(converted, samples)


def test_a_sample_whose_float_outputs_are_not_finite_is_left_out(converted: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Finite inputs of 3.4e38 overflow the Conv: the float output is infinite there, and the metrics were NaN."""
    samples = _samples(converted)
    huge = [*samples[:1], {"f": np.full((1, 4, 8, 8), 3.4e38, np.float32), "idx": samples[1]["idx"]}, *samples[1:]]
    logging.getLogger("hbtools").addHandler(caplog.handler)  # the tools' logger does not propagate
    try:
        got = _sensitivity(converted, huge)
    finally:
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    assert "outputs on sample 2 of calibrated_data are NaN or infinite" in caplog.text, caplog.text
    assert got == _sensitivity(converted, samples)  # the other samples' metrics, in the same order
    assert all(np.isfinite(float(v["cosine-similarity"])) for v in got.values()), got
    with pytest.raises(HbError, match="NaN or infinite on every sample"):
        _sensitivity(converted, huge[1:2])
    # plot_acc_error's curves too (hunt 14b D3): the sample is left out of the points it would make NaN
    logging.getLogger("hbtools").addHandler(caplog.handler)
    try:
        curves = dbg.plot_acc_error(save_dir=str(converted / "acc"), calibrated_data=huge,
                                    model_or_file=str(converted / "m_calibrated_model.onnx"), quantize_node=["weight"])
    finally:
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    assert "sample(s) 2 of calibrated_data" in caplog.text, caplog.text
    values = [v for curve in curves.values() for v in curve.values()] if isinstance(curves, dict) else []
    assert values and all(np.isfinite(values)), curves


def test_an_int32_index_is_taken_for_an_int64_input(converted: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's int32 on Windows, torch's .int(): refused as 'cannot convert int32 data without loss', though
    widening is exact (hunt 13 D7). Values that do not fit the input's type are still refused, saying so."""
    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.session import FeedError

    samples = _samples(converted)
    as_int32 = [{**s, "idx": s["idx"].astype(np.int32)} for s in samples]
    assert _sensitivity(converted, as_int32) == _sensitivity(converted, samples)
    session = HB_ONNXRuntime(model_file=str(converted / "m_quantized_model.onnx"))
    feed = {"f": samples[0]["f"], "idx": samples[0]["idx"]}
    want = session.run(None, feed)[0]
    np.testing.assert_array_equal(session.run(None, {**feed, "idx": feed["idx"].astype(np.int32)})[0], want)
    with pytest.raises(FeedError, match=r"input 'idx' takes int64; float32 data cannot be converted to it exactly"):
        session.run(None, {**feed, "idx": feed["idx"].astype(np.float32)})
    # hb_verifier and hrt_model_exec take it too (they refused it while HB_ONNXRuntime widened it: hunt 14a D6)
    from click.testing import CliRunner

    from hbtools.cli import hb_verifier

    monkeypatch.chdir(tmp_path)  # the tool's log and dump go here
    np.save("f.npy", feed["f"])
    np.save("idx32.npy", feed["idx"].astype(np.int32))
    models = f"{converted / 'm_quantized_model.onnx'},{converted / 'm.bin'}"
    result = CliRunner().invoke(hb_verifier.main, ["-m", models, "-i", "f:f.npy,idx:idx32.npy"])
    assert result.exit_code == 0 and "PASSED" in result.output, result.output


def test_nothing_to_rank_or_analyse_is_an_error(converted: Path) -> None:
    """An output_node that no quantized node lies before (a Gather reading only the int64 input) and an empty
    sensitive_nodes printed an empty table or chart with exit code 0 and no word (hunt 13 D6)."""
    model, samples = str(converted / "m_calibrated_model.onnx"), _samples(converted)
    with pytest.raises(HbError, match="no node that quantizes anything lies before output_node 'gather'"):
        dbg.get_sensitivity_of_nodes(model, calibrated_data=samples, output_node="gather")
    assert dbg.get_sensitivity_of_nodes(model, calibrated_data=samples, output_node="add")  # the conv lies before
    with pytest.raises(HbError, match="sensitive_nodes is an empty list"):
        dbg.sensitivity_analysis(model, calibrated_data=samples, sensitive_nodes=[], save_dir=str(converted / "sa"))
