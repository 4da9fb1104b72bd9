"""A Conv whose weight is computed at run time (a Siamese tracker's cross-correlation: the template's features
reshaped into a depthwise kernel) has no BPU form at any kernel size; its CPU reason says that, not a kernel limit
it happens to exceed (hunt 51 D2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import checked
from onnx import TensorProto, helper, numpy_helper


def _tracker(kernel: int) -> onnx.ModelProto:
    """Template z (1x3xKxK) and search image x through a shared 3x3 Conv; the template's 8 feature maps become
    the 8x1xKxK weight of a depthwise Conv over the search features."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["z", "w"], ["fz"], name="template_features", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w"], ["fx"], name="search_features", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["fz", "kernel_shape"], ["kz"], name="as_kernel"),
             helper.make_node("Conv", ["fx", "kz"], ["y"], name="xcorr", group=8, kernel_shape=[kernel, kernel])]
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([8, 1, kernel, kernel], np.int64), "kernel_shape")]
    side = 3 * kernel
    graph = helper.make_graph(nodes, "tracker", [
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, kernel, kernel]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, side - kernel + 1, side - kernel + 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("march", "kernel", "label"), [("bernoulli2", 8, "bernoulli2 (RDK X3)"),
                                                         ("bayes-e", 16, "bayes-e (RDK X5)")])
def test_a_conv_over_a_run_time_weight_beyond_the_kernel_limit_names_the_weight(
        tmp_path: Path, march: str, kernel: int, label: str) -> None:
    out = checked(_tracker(kernel), march, tmp_path)
    xcorr = [line for line in out.splitlines() if line.split()[:2] == ["xcorr", "Conv"]]  # its CPU reason row
    assert xcorr, out
    assert any(f"Conv without a constant weight has no BPU form on {label}" in line for line in xcorr), xcorr
    assert not any("exceeds" in line for line in xcorr), xcorr
    assert "2 BPU subgraph(s) and 2 CPU node(s)" in out, out  # the template branch, the search branch


def test_the_same_reason_within_the_kernel_limit(tmp_path: Path) -> None:
    """The reason does not depend on the kernel size: a 3x3 template kernel gets the same one."""
    out = checked(_tracker(3), "bernoulli2", tmp_path)
    assert "Conv without a constant weight has no BPU form on bernoulli2 (RDK X3)" in out, out
