"""A 0/1 mask (or any whole numbers float32 holds exactly) given as bool or int64 to a float32 featuremap input:
HB_ONNXRuntime and the .bin's simulator take it as the same float values, as they take uint8 and as makertbin takes
a bool .npy calibration mask; integers float32 would round are refused with that reason (hunt 51 D6)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator


def _masked_conv():  # noqa: ANN202 - onnx.ModelProto
    """y = Conv(x * mask): an image-sized featuremap and a 0/1 mask of its size."""
    w = numpy_helper.from_array((np.random.default_rng(1).standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32),
                                "w")
    nodes = [helper.make_node("Mul", ["x", "mask"], ["masked"], name="apply_mask"),
             helper.make_node("Conv", ["masked", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 8, 8]) for n in ("x", "mask")]
    graph = helper.make_graph(nodes, "masked", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mask")
    rng = np.random.default_rng(0)
    samples = {"x": [rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(4)],
               "mask": [(rng.random((1, 1, 8, 8)) > 0.5).astype(np.float32) for _ in range(4)]}
    convert_featuremaps(root, _masked_conv(), samples, "1x1x8x8;1x1x8x8", "float32;float32", "masked")
    return root / "out"


def _feeds() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return rng.standard_normal((1, 1, 8, 8)).astype(np.float32), rng.random((1, 1, 8, 8)) > 0.5


@pytest.mark.parametrize("dtype", [np.bool_, np.int64, np.int32, np.uint16])
def test_hb_onnxruntime_takes_a_mask_of_whole_numbers_for_a_float_input(converted: Path, dtype: type) -> None:
    x, mask = _feeds()
    for artefact in ("masked_original_float_model.onnx", "masked_quantized_model.onnx"):
        session = HB_ONNXRuntime(model_file=str(converted / artefact))
        as_float = session.run(None, {"x": x, "mask": mask.astype(np.float32)})[0]
        given = session.run(None, {"x": x, "mask": mask.astype(dtype)})[0]
        np.testing.assert_array_equal(given, as_float)  # the same values, so the same outputs to the bit


def test_hb_onnxruntime_refuses_integers_float32_would_round_and_says_why(converted: Path) -> None:
    x, mask = _feeds()
    session = HB_ONNXRuntime(model_file=str(converted / "masked_quantized_model.onnx"))
    with pytest.raises(HbError) as error:
        session.run(None, {"x": x, "mask": mask.astype(np.int64) + 2 ** 24 + 1})
    assert "input 'mask' takes float32, which does not hold the int64 value 16777217 exactly" in str(error.value)
    assert "cannot be converted" not in str(error.value)


def test_the_bin_simulator_takes_the_same_mask_as_hb_onnxruntime(converted: Path) -> None:
    x, mask = _feeds()
    simulator = Simulator(open_model(converted / "masked.bin"))
    as_float = simulator.run({"x": x, "mask": mask.astype(np.float32)})
    given = simulator.run({"x": x, "mask": mask})
    for name, values in as_float.items():
        np.testing.assert_array_equal(given[name], values)
    with pytest.raises(HbError, match="does not hold the int64 value 16777217 exactly"):
        simulator.run({"x": x, "mask": mask.astype(np.int64) + 2 ** 24 + 1})
