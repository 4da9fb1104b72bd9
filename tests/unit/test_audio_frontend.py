"""An audio front end as onnx-asr ships them (PyPI ``onnx-asr``: whisper/nemo/kaldi preprocessors).

``waveforms`` [1, N] float and ``waveforms_lens`` [1] int64 in; a log-mel spectrogram (STFT
without an explicit ``onesided``, power, mel MatMul, Log) and int64 lengths out, one of them
a constant once the input shape is fixed. onnxruntime runs it, so it must convert. It once
stopped at each of these in turn: onnx's shape inference read the STFT as two-sided (400 bins
where onnxruntime makes 201) and the model with those shapes written back did not load; the
int64 length arithmetic went to the BPU and got an HzCalibration; the quantized model
declared the int64 outputs float; the output folded to a constant lost its value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.tools.verifier import verify

SAMPLES, FFT, HOP, MELS = 1600, 64, 16, 8


def _front_end() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    bins = FFT // 2 + 1
    mel = np.abs(rng.standard_normal((bins, MELS))).astype(np.float32) / bins
    inits = [numpy_helper.from_array(np.hanning(FFT).astype(np.float32), "window"),
             numpy_helper.from_array(np.array(HOP, np.int64), "hop"),
             numpy_helper.from_array(np.array([HOP], np.int64), "hop_1d"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(mel, "mel"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "floor"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    nodes = [
        helper.make_node("Unsqueeze", ["waveforms", "last"], ["signal"], name="as_signal"),
        helper.make_node("STFT", ["signal", "hop", "window"], ["spectrum"], name="stft"),  # onesided by default
        helper.make_node("ReduceSumSquare", ["spectrum"], ["power"], name="power", axes=[-1], keepdims=0),
        helper.make_node("MatMul", ["power", "mel"], ["mel_power"], name="mel_filters"),
        helper.make_node("Clip", ["mel_power", "floor"], ["floored"], name="floor"),
        helper.make_node("Log", ["floored"], ["log_mel"], name="log"),
        helper.make_node("Transpose", ["log_mel"], ["features"], name="channels_first", perm=[0, 2, 1]),
        # lengths: arithmetic on the int64 input, and one that the input shape alone decides
        helper.make_node("Div", ["waveforms_lens", "hop_1d"], ["frames"], name="frames"),
        helper.make_node("Add", ["frames", "one"], ["features_lens"], name="features_lens"),
        helper.make_node("Shape", ["waveforms"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["samples"], name="samples", axis=0),
        helper.make_node("Div", ["samples", "hop_1d"], ["max_frames"], name="max_frames"),
    ]
    graph = helper.make_graph(
        nodes, "front_end",
        [helper.make_tensor_value_info("waveforms", TensorProto.FLOAT, ["batch", "N"]),
         helper.make_tensor_value_info("waveforms_lens", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", MELS, "frames"]),
         helper.make_tensor_value_info("features_lens", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("max_frames", TensorProto.INT64, [1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _convert(tmp_path: Path, model: onnx.ModelProto, **model_parameters: str) -> str:
    """makertbin ``default`` on ``model`` with 8 synthetic waves; the console output."""
    rng = np.random.default_rng(0)
    t = np.arange(SAMPLES) / 16000
    waves = [(0.3 * np.sin(2 * np.pi * rng.uniform(200, 2000) * t) + rng.normal(0, 0.02, SAMPLES))
             .astype(np.float32)[None] for _ in range(8)]
    lens = [np.array([SAMPLES - 160 * k], np.int64) for k in range(8)]
    return convert_featuremaps(tmp_path, model, {"waveforms": waves, "waveforms_lens": lens}, f"1x{SAMPLES};1",
                               "float32;int32", "fe", **model_parameters)


def test_log_mel_front_end_with_integer_lengths_converts(tmp_path: Path) -> None:
    model = _front_end()
    out = _convert(tmp_path, model)
    assert "Div computes on int64 values" in out, "the length arithmetic stays on the CPU, with its reason"

    quantized = tmp_path / "out" / "fe_quantized_model.onnx"
    session, reference = HB_ONNXRuntime(model_file=str(quantized)), HB_ONNXRuntime(onnx_model=model)
    rng, t = np.random.default_rng(1), np.arange(SAMPLES) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 700 * t) + rng.normal(0, 0.02, SAMPLES)).astype(np.float32)[None]
    feed = {"waveforms": wave, "waveforms_lens": np.array([SAMPLES - 320], np.int64)}
    got, want = session.run(None, feed), reference.run(None, feed)
    assert got[0].shape == want[0].shape == (1, MELS, (SAMPLES - FFT) // HOP + 1)
    assert cosine_similarity(want[0], got[0]) >= 0.95
    for k in (1, 2):  # lengths: int64 and exact
        assert got[k].dtype == np.int64 and np.array_equal(got[k], want[k]), (got[k], want[k])
    verdict = verify(quantized, tmp_path / "out" / "fe.bin", None, 5)
    assert all(o.passed for o in verdict.outputs), "hb_verifier: the .bin and the quantized model differ"


def test_debugger_skips_an_output_folded_to_a_constant(tmp_path: Path) -> None:
    """``max_frames`` depends on the input shape only: the optimizer folds it into a constant, which no
    stage of the debugger's switchboard makes (its sessions once failed to load)."""
    from hbtools.debug import get_sensitivity_of_nodes

    _convert(tmp_path, _front_end(), debug_mode="dump_calibration_data")
    out = tmp_path / "out"
    table = get_sensitivity_of_nodes(model_or_file=str(out / "fe_calibrated_model.onnx"),
                                     calibrated_data=str(out / "calibration_data"), node_type="node", verbose=False)
    assert table, "no node was ranked"
    assert all(0.0 <= float(row["cosine-similarity"]) <= 1.0 + 1e-6 for row in table.values()), table
