"""Architecture blocks of real model families, converted end to end (issue 13).

Two of them reproduce the structure (not the weights) of models that used to stop
with an internal error: a MobileNetV3 block exported at opset 15 (unfolded
BatchNormalization, the HardSwish function op, an SE gate [N, C, 1, 1] times
[N, C, H, W]) and a YOLOX decoupled head (one tensor read by two MaxPools, which
emitted the same integer-to-float Cast twice). A third is a CRNN that onnxruntime's
``quantize_dynamic`` already quantized: its com.microsoft ops leave the output without an
inferable shape, and the optimized model failed the ONNX checker.
"""

from __future__ import annotations

from pathlib import Path

import arch_builders
import pytest
from conformance import convert_and_check

COSINE = 0.99  # quantized vs float model, every output, random held-out image

BLOCKS = sorted(arch_builders.BLOCKS)


@pytest.mark.parametrize("calibration_type", ["max", "default"])
@pytest.mark.parametrize("block", BLOCKS)
def test_block_converts(block: str, calibration_type: str, tmp_path: Path) -> None:
    fm = arch_builders.BLOCKS[block]()
    outcome = convert_and_check(fm, tmp_path, calibration_type, checker=calibration_type == "max")
    print(f"{block} ({calibration_type}): cosine {[round(c, 5) for c in outcome.cosine]}; {outcome.placement()}")
    assert min(outcome.cosine) >= COSINE, f"quantized vs float cosine {outcome.cosine} < {COSINE}"
    assert outcome.bpu_nodes, "nothing went to the BPU"


@pytest.mark.parametrize("block", ["spatial_reductions", "channel_and_token_means", "attention_sums", "frame_convs",
                                   "conv1d_pooling_head", "expanded_gates", "padded_convs",
                                   "bilinear_decoder", "layer_norms", "wide_heads",
                                   "vit_embedding", "unfolded_patches", "uneven_average_pools",
                                   "interpolating_decoder", "prelu_upsampler", "recurrent_head",
                                   "linear_attention", "aspp_head"])
@pytest.mark.parametrize("opset", [13, 18])
def test_blocks_run_wholly_on_the_bpu(block: str, opset: int, tmp_path: Path) -> None:
    """Means and maxima over H and W (PyTorch's SE and CBAM gates and pooling heads) are global
    pools, and means and sums over other axes (CBAM's channel mean, a mean over tokens, attention
    pooling's sum over the pixels) integer sums; a
    zero Pad before a conv is its padding, an edge or reflect Pad data movement; a bilinear
    upsampling by 2 or 4 a depthwise transposed convolution, a resize of one pixel a Tile; a Pad
    with a value other than zero Concats of constants, a Div of two tensors a product with a
    Reciprocal table (a linear attention); a conv dilated beyond the march a conv over the map's
    phases (ASPP); a BatchNormalization of a 5-D tensor (after a Conv3d's activation) a depthwise
    1x1x1 Conv; a global pool of a 3-D tensor (after Conv1d layers) the reduction it is; an Expand
    the Tile it is. BPU
    ops, one BPU subgraph, nothing on the CPU (ReduceMean used to cut the model into a subgraph
    per SE block, a Pad to put the input conv on the CPU, a bilinear Resize a decoder)."""
    fm = arch_builders.BLOCKS[block](opset=opset)
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    print(f"cosine {outcome.cosine}; {outcome.placement()}")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= COSINE



@pytest.mark.parametrize("calibration_type", ["max", "default"])
def test_wide_normalizations_run_on_the_bpu(calibration_type: str, tmp_path: Path) -> None:
    """A GroupNorm over 3200 values (Reshape + InstanceNormalization + Reshape, as PyTorch exports it) and
    LayerNorms over 1536 and 4096 channels stayed on the CPU ("no exact integer form", at most 1290 values):
    larger groups take their variance around an integer mean, exactly, on the BPU."""
    fm = arch_builders.wide_norms()
    outcome = convert_and_check(fm, tmp_path, calibration_type, checker=calibration_type == "max")
    print(f"cosine {outcome.cosine}; {outcome.placement()}")
    assert not outcome.cpu, outcome.placement()
    # the HzLayerNorm nodes keep the names of the nodes they start from
    assert {"InstanceNormalization_0", "LayerNormalization_0", "ReduceMean_0"} <= set(outcome.bpu_nodes)
    assert min(outcome.cosine) >= COSINE


@pytest.mark.parametrize("axis", [-1, 1])
def test_a_log_softmax_head_runs_on_the_bpu(axis: int, tmp_path: Path) -> None:
    """A CRNN / CTC head ending in LogSoftmax stayed on the CPU (no march rule); it runs on the BPU as
    Softmax's exp table and integer sum with x - max - log(sum). Greedy decoding reads the float model's class
    wherever the quantized logits cannot swap the two best ones (their margin beats twice the logits' error)."""
    import numpy as np
    from builders import EXACT_MEAN, EXACT_SCALE, random_sample
    from conformance import _source_feed

    from hbtools.runtime import HB_ONNXRuntime

    fm = arch_builders.log_softmax_head(axis)
    outcome = convert_and_check(fm, tmp_path, "max", checker=True)  # hb_verifier included
    print(f"cosine {outcome.cosine}; {outcome.placement()}")
    assert not outcome.cpu, outcome.placement()
    assert "LogSoftmax_0" in outcome.bpu_nodes
    assert min(outcome.cosine) >= COSINE
    quantized = HB_ONNXRuntime(model_file=str(outcome.project.artefact("quantized")))
    calibrated = HB_ONNXRuntime(model_file=str(outcome.project.artefact("calibrated")))
    reference = HB_ONNXRuntime(onnx_model=fm.model)
    rng = np.random.default_rng(78)
    compared = columns = 0
    for _ in range(4):
        x = {"data": random_sample(fm, "data", rng)}
        want, logits = reference.run(None, _source_feed(fm, x, EXACT_MEAN, EXACT_SCALE))
        got, got_logits = quantized.run(None, x)
        emulated = calibrated.run(None, x)[0]  # the calibrated model's HzLogSoftmax follows the kernel
        np.testing.assert_allclose(emulated, got, rtol=0, atol=1e-6 * float(np.abs(got).max()))
        top2 = np.sort(logits, axis=axis)
        margin = np.take(top2, -1, axis=axis) - np.take(top2, -2, axis=axis)
        clear = margin > 2 * np.abs(got_logits - logits).max()
        assert (want.argmax(axis) == got.argmax(axis))[clear].all()
        compared, columns = compared + clear.sum(), columns + clear.size
    assert compared >= columns // 2, (compared, columns)

def test_scores_beside_pixel_boxes_keep_their_accuracy(tmp_path: Path) -> None:
    """A YOLOv8 export's output joins box distances in pixels (here up to ~480) with class scores in
    0..1. Scored as one tensor, the output looks perfect whatever happens to the scores; the search
    scores each piece of a final Concat, so ``default`` keeps the scores close to float too."""
    import numpy as np
    from builders import EXACT_MEAN, EXACT_SCALE, random_sample
    from conformance import _source_feed

    from hbtools.metrics import cosine_similarity
    from hbtools.runtime import HB_ONNXRuntime

    fm = arch_builders.yolov8_head(h=64, box_scale=32.0, score_bias=-4.0)
    outcome = convert_and_check(fm, tmp_path, "default", checker=False)
    quantized = HB_ONNXRuntime(model_file=str(outcome.project.artefact("quantized")))
    reference = HB_ONNXRuntime(onnx_model=fm.model)
    rng = np.random.default_rng(77)
    want, got = [], []
    for _ in range(4):
        x = {"data": random_sample(fm, "data", rng)}
        want.append(reference.run(None, _source_feed(fm, x, EXACT_MEAN, EXACT_SCALE))[0])
        got.append(quantized.run(None, x)[0])
    boxes = cosine_similarity(np.concatenate([w[:, :4] for w in want]), np.concatenate([q[:, :4] for q in got]))
    scores = cosine_similarity(np.concatenate([w[:, 4:] for w in want]), np.concatenate([q[:, 4:] for q in got]))
    print(f"held-out cosine: boxes {boxes:.5f}, scores {scores:.5f}")
    assert boxes >= COSINE and scores >= COSINE, f"boxes {boxes}, scores {scores}"
    # Low scores too (a mAP evaluation keeps detections down to 0.001): on one grid with the pixels, a
    # step of about 0.015, they read 0 or twice their value; each piece on its own grid keeps them.
    low_want = np.concatenate([w[:, 4:].ravel() for w in want])
    low_got = np.concatenate([q[:, 4:].ravel() for q in got])
    low = (low_want > 0.001) & (low_want < 0.01)
    error = np.abs(low_got[low] - low_want[low]) / low_want[low]
    print(f"{low.sum()} scores in 0.001..0.01: relative error median {np.median(error):.4f}, max {error.max():.4f}")
    assert low.sum() >= 20 and np.median(error) <= 0.05 and error.max() <= 0.25, (low.sum(), error)


def test_a_float16_model_converts_as_float32(tmp_path: Path) -> None:
    """A model exported in float16 (weights, input and output) converts; the quantized model
    agrees with the float32 model of the same weights."""
    import numpy as np
    from builders import EXACT_MEAN, EXACT_SCALE, MODELS, FloatModel, make_project, random_sample
    from conformance import INTERNAL, _cli, _source_feed
    from onnx import TensorProto, numpy_helper

    from hbtools.metrics import cosine_similarity
    from hbtools.runtime import HB_ONNXRuntime

    fm = MODELS["resnet_like"]()
    half = type(fm.model)()
    half.CopyFrom(fm.model)
    for k, t in enumerate(half.graph.initializer):
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32:
            half.graph.initializer[k].CopyFrom(numpy_helper.from_array(a.astype(np.float16), t.name))
    for vi in [*half.graph.input, *half.graph.output, *half.graph.value_info]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    project = make_project(tmp_path, FloatModel(half, fm.inputs), cal_count=8, calibration_type="default")
    code, out = _cli(["makertbin", "--config", str(project.config_path), "--model-type", "onnx"], tmp_path)
    assert INTERNAL not in out and code == 0, out[-3000:]
    assert "converting it to float32" in out
    x = {"data": random_sample(fm, "data", np.random.default_rng(8))}
    want = HB_ONNXRuntime(onnx_model=fm.model).run(None, _source_feed(fm, x, EXACT_MEAN, EXACT_SCALE))[0]
    got = HB_ONNXRuntime(model_file=str(project.artefact("quantized"))).run(None, x)[0]
    assert got.dtype == np.float32
    assert cosine_similarity(want, got) >= COSINE
