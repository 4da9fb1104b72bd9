"""Custom CPU ops: ``hb_custom_op create``, the config's custom_op group, conversion and execution.

The op under test is a space-to-depth written in numpy in a file made from the
``hb_custom_op create`` template. Its float reference is the same model with the
standard ONNX ``SpaceToDepth`` in its place, run by plain onnxruntime: so the
check is independent of hbtools' custom-op machinery.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bin_fixtures import invoke
from builders import EXACT_MEAN, EXACT_SCALE, FloatModel, Project, _Graph, make_project
from onnx import TensorProto, helper

from hbtools.cli.hb_custom_op import main as hb_custom_op
from hbtools.cli.hb_mapper import main as hb_mapper
from hbtools.errors import HbError
from hbtools.metrics import cosine_similarity
from hbtools.ops import custom
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.custom_session import CustomOpSession
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.session import make_session
from hbtools.runtime.simulator import Simulator

OP = "PixelUnshuffleTest"
DOMAIN = "horizon.custom"
BLOCK = 2
SHAPE = [1, 3, 8, 8]
# Acceptance bounds for the quantized model and the simulator against float (int8 activations):
MIN_COSINE = 0.99
MAX_LSB = 3  # max abs error in steps of the int8 grid spanning the float output's range

COMPUTE = '''        x = inputs[0]
        b = int(self.attributes["block"])
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
        return y.reshape(n, c * b * b, h // b, w // b)'''
SHAPE_FN = '''    n, c, h, w = input_shapes[0]
    return [[n, c * 4, h // 2, w // 2]]'''


def write_op_file(folder: Path, name: str = OP) -> Path:
    """``hb_custom_op create`` + the user's edits: the placeholder compute and shape function replaced."""
    path = folder / "space_to_depth.py"
    result = invoke(hb_custom_op, ["create", "--name", name, "--output", path])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    placeholder_compute = "        x = inputs[0]\n        return np.array(x, dtype=np.float32, copy=True)"
    placeholder_shape = "    return [list(input_shapes[0])]"
    assert placeholder_compute in text and placeholder_shape in text
    path.write_text(text.replace(placeholder_compute, COMPUTE).replace(placeholder_shape, SHAPE_FN))
    return path


def conv_custom_conv(op_type: str = OP, domain: str = DOMAIN) -> onnx.ModelProto:
    """Conv -> Relu -> custom space-to-depth (block 2) -> Conv."""
    g = _Graph(7)
    a = g.op("Relu", [g.conv("data", 3, 4)])
    g.nodes.append(helper.make_node(op_type, [a], ["s2d_out"], name="s2d", domain=domain, block=BLOCK))
    out = g.conv("s2d_out", 4 * BLOCK * BLOCK, 6)
    graph = helper.make_graph(g.nodes, "custom", [helper.make_tensor_value_info("data", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 6, 4, 4])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(domain, 1)])
    model.ir_version = 8
    return model


def standard_equivalent(model: onnx.ModelProto) -> onnx.ModelProto:
    ref = onnx.ModelProto()
    ref.CopyFrom(model)
    for node in ref.graph.node:
        if node.domain == DOMAIN:
            node.op_type, node.domain = "SpaceToDepth", ""
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("blocksize", BLOCK))
    del ref.opset_import[1:]
    return ref


def source_feed(x: np.ndarray) -> np.ndarray:
    mean = np.array(EXACT_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    scale = np.array(EXACT_SCALE, dtype=np.float32).reshape(1, 3, 1, 1)
    return (x.astype(np.float32) - mean) * scale


@dataclass
class Converted:
    project: Project
    output: str
    exit_code: int
    reference: ort.InferenceSession  # plain onnxruntime, standard SpaceToDepth


def convert_custom_op_model(root: Path, model: onnx.ModelProto, **overrides: dict) -> tuple[Project, Any]:
    """makertbin (run in ``root``) of ``model`` with the op file registered by the custom_op group."""
    project = make_project(root, FloatModel(model, {"data": SHAPE}), cal_count=4)
    (root / "custom_op").mkdir()
    write_op_file(root / "custom_op")
    project.config["custom_op"] = {}
    project.write(custom_op={"custom_op_method": "register", "op_register_files": "space_to_depth.py",
                             "custom_op_dir": "./custom_op"}, **overrides)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        result = invoke(hb_mapper, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    return project, result


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Converted]:
    model = conv_custom_conv()
    project, result = convert_custom_op_model(tmp_path_factory.mktemp("custom_op"), model)
    reference = ort.InferenceSession(standard_equivalent(model).SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    yield Converted(project, result.output, result.exit_code, reference)
    custom.unregister(OP)


@pytest.fixture
def sample() -> np.ndarray:
    return np.random.default_rng(123).integers(0, 256, size=SHAPE, dtype=np.uint8)


def test_template_is_a_working_identity_op(tmp_path: Path) -> None:
    path = tmp_path / "sample_custom.py"
    result = invoke(hb_custom_op, ["create", "-n", "TemplateIdentity", "-o", path])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    for part in ("op_implement_register", "op_shape_infer_register", "def compute", "def infer_shape",
                 "custom_op_method: register", "op_register_files: sample_custom.py"):
        assert part in text
    try:
        assert custom.load_op_files([path]) == ["TemplateIdentity"]
        node = helper.make_node("TemplateIdentity", ["x"], ["y"], name="n", domain=DOMAIN, alpha=0.5)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        (y,) = custom.compute(node, [x])
        np.testing.assert_array_equal(y, x)
        assert custom.output_shapes(node, [[2, 3]]) == [[2, 3]]
    finally:
        custom.unregister("TemplateIdentity")


@pytest.mark.parametrize(("args", "expected"), [
    (["-n", "Not-a-name"], r"not a valid Python class name"),
    (["-o", "op.txt"], r"does not end in \.py"),
    ([], r"already exists.*--force"),
], ids=["bad_name", "not_py", "exists"])
def test_template_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                      expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_custom.py").write_text("# mine\n")
    result = invoke(hb_custom_op, ["create", *args])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and re.search(expected, errors[0]), result.output
    assert (tmp_path / "sample_custom.py").read_text() == "# mine\n"  # never overwritten without --force
    assert invoke(hb_custom_op, ["create", "--force"]).exit_code == 0


def test_conversion_places_the_custom_op_on_the_cpu(converted: Converted) -> None:
    assert converted.exit_code == 0, converted.output
    assert "Convert to runtime bin file successfully!" in converted.output
    assert re.search(rf"^s2d\s+CPU\s+--\s+{OP}\b", converted.output, re.M), converted.output
    for kind in ("original", "optimized", "calibrated", "quantized", "bin"):
        assert converted.project.artefact(kind).is_file(), kind
    bin_model = open_model(converted.project.artefact("bin"))
    cpu = bin_model.bin.partition["cpu_nodes"]
    assert [(c["name"], c["type"]) for c in cpu] == [("s2d", OP)]
    kept = [n for n in bin_model.graph.graph.node if n.domain == DOMAIN]
    assert [(n.name, n.op_type) for n in kept] == [("s2d", OP)]


def test_every_artefact_runs_the_custom_op(converted: Converted, sample: np.ndarray) -> None:
    (ref,) = converted.reference.run(None, {"data": source_feed(sample)})
    lsb = np.abs(ref).max() / 127.0
    for kind in ("original", "optimized", "calibrated", "quantized"):
        sess = HB_ONNXRuntime(model_file=str(converted.project.artefact(kind)))
        (out,) = sess.run(None, {"data": sample})
        assert out.shape == ref.shape, kind
        if kind in ("original", "optimized"):
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5, err_msg=kind)
        else:
            assert cosine_similarity(ref, out) >= MIN_COSINE, kind
            assert np.abs(out - ref).max() <= MAX_LSB * lsb, (kind, np.abs(out - ref).max(), lsb)


def test_simulator_runs_the_custom_op_from_the_recorded_file(converted: Converted, sample: np.ndarray) -> None:
    (ref,) = converted.reference.run(None, {"data": source_feed(sample)})
    (quantized,) = HB_ONNXRuntime(model_file=str(converted.project.artefact("quantized"))).run(None, {"data": sample})
    custom.unregister(OP)  # as in a fresh process: the simulator loads the file the .bin's config names
    sim = Simulator(open_model(converted.project.artefact("bin")))
    (out,) = sim.run({"data": sample}).values()
    assert custom.custom_op_of(helper.make_node(OP, ["a"], ["b"], domain=DOMAIN)) is not None
    np.testing.assert_array_equal(out, quantized)  # same integer kernels, same compute
    assert cosine_similarity(ref, out) >= MIN_COSINE
    assert np.abs(out - ref).max() <= MAX_LSB * np.abs(ref).max() / 127.0


def test_hb_mapper_infer_registers_the_ops_of_the_config(converted: Converted, sample: np.ndarray,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sample.tofile(tmp_path / "x.bin")
    custom.unregister(OP)
    result = invoke(hb_mapper, ["infer", "-c", converted.project.config_path, "--model-file",
                                converted.project.artefact("calibrated"), "--model-type", "onnx",
                                "--image-file", "data", tmp_path / "x.bin", "--output-dir", tmp_path / "out"])
    assert result.exit_code == 0, result.output
    (dumped,) = (tmp_path / "out").glob("*_float.bin")
    (expected,) = HB_ONNXRuntime(model_file=str(converted.project.artefact("calibrated"))).run(None, {"data": sample})
    np.testing.assert_array_equal(np.fromfile(dumped, dtype=np.float32), expected.reshape(-1))


def _conversion_errors(tmp_path: Path, model: onnx.ModelProto, custom_op: dict | None = None) -> list[str]:
    project = make_project(tmp_path, FloatModel(model, {"data": SHAPE}), cal_count=1)
    if custom_op is not None:
        project.config["custom_op"] = {}
        project.write(custom_op=custom_op)
    result = invoke(hb_mapper, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    assert not (tmp_path / "model_output").exists(), "nothing may be written"
    return [line for line in result.output.splitlines() if " ERROR " in line]


def test_unregistered_op_is_one_error_line_telling_how_to_register(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    errors = _conversion_errors(tmp_path, conv_custom_conv("NoSuchOp"))
    assert errors[-1].endswith("exception in command: makertbin")
    (line,) = errors[:-1]
    assert "name=s2d type=NoSuchOp" in line and f"domain '{DOMAIN}'" in line
    for hint in ("hb_custom_op create", "custom_op_method: register", "op_register_files"):
        assert hint in line, line


@pytest.mark.parametrize(("content", "group", "expected"), [
    (None, {"custom_op_method": "register", "op_register_files": "missing.py"}, r"missing\.py' does not exist"),
    (None, {"custom_op_method": "register"}, r"needs 'op_register_files'"),
    ("import numpy\n", {"op_register_files": "op.py"}, r"registers no custom op"),
    ("raise ValueError('broken')\n", {"op_register_files": "op.py"}, r"failed to load: ValueError: broken"),
], ids=["missing_file", "no_files", "registers_nothing", "raises"])
def test_bad_custom_op_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None,
                             group: dict, expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "op.py").write_text(content)
    errors = _conversion_errors(tmp_path, conv_custom_conv("NeverRegistered"), group)
    assert any(re.search(expected, line) for line in errors), errors


def test_failing_compute_names_the_op(tmp_path: Path) -> None:
    custom.register("FailingOp", lambda x, **_: x[:, :, :, :, 0])
    try:
        model = conv_custom_conv("FailingOp")
        with pytest.raises(HbError, match=r"custom op FailingOp \(node 's2d'\) failed in compute: IndexError"):
            make_session(model).run(None, {"data": np.zeros(SHAPE, np.float32)})
    finally:
        custom.unregister("FailingOp")


def test_session_splits_only_at_custom_nodes() -> None:
    """Two custom ops on parallel branches and one after the other: three onnxruntime segments at most."""
    custom.register("Double", lambda x, **_: 2 * x)
    try:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
        nodes = [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Double", ["r"], ["d1"], name="d1", domain=DOMAIN),
            helper.make_node("Double", ["x"], ["d2"], name="d2", domain=DOMAIN),  # parallel, same level
            helper.make_node("Add", ["d1", "d2"], ["s"], name="add"),
            helper.make_node("Double", ["s"], ["d3"], name="d3", domain=DOMAIN),  # chained: next level
            helper.make_node("Neg", ["d3"], ["y"], name="neg"),
        ]
        graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                                                    helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)])
        model.ir_version = 8
        sess = make_session(model)
        assert isinstance(sess, CustomOpSession)
        assert sum(step.session is not None for step in sess._steps) == 3  # relu | add | neg
        assert [a.name for a in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["y", "r"]
        v = np.array([[-1, 0, 1], [2, -3, 4]], dtype=np.float32)
        y, r = sess.run(None, {"x": v})
        np.testing.assert_array_equal(r, np.maximum(v, 0))
        np.testing.assert_array_equal(y, -2 * (2 * np.maximum(v, 0) + 2 * v))
        # A model without custom ops keeps the plain onnxruntime session.
        plain = make_session(standard_equivalent(conv_custom_conv()))
        assert isinstance(plain, ort.InferenceSession)
    finally:
        custom.unregister("Double")


def test_vendor_pyop_node_and_vendor_import_path(tmp_path: Path) -> None:
    """An op file written for the vendor toolkit, and a PyOp node naming its class, work unchanged."""
    path = tmp_path / "vendor_op.py"
    path.write_text(
        "from horizon_nn.custom.op_registration import op_implement_register, op_shape_infer_register\n\n"
        "@op_implement_register('VendorScale')\n"
        "class VendorScale:\n"
        "    def __init__(self, factor):\n"
        "        self.factor = factor\n\n"
        "    def compute(self, x):\n"
        "        return x * self.factor\n\n"
        "@op_shape_infer_register('VendorScale')\n"
        "def infer_shape(inputs_shape):\n"
        "    return inputs_shape\n")
    try:
        assert custom.load_op_files([path]) == ["VendorScale"]
        node = helper.make_node("PyOp", ["x"], ["y"], name="vendor", domain=DOMAIN, class_name="VendorScale",
                                module="vendor_op", compute="compute", factor=3.0)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)])
        model.ir_version = 8
        (y,) = make_session(model).run(None, {"x": np.array([1.0, -2.0], dtype=np.float32)})
        np.testing.assert_array_equal(y, [3.0, -6.0])
    finally:
        custom.unregister("VendorScale")


def test_debugger_runs_a_model_with_a_custom_op(tmp_path: Path) -> None:
    """Sensitivity analysis works around the custom CPU op, and is real: a weight whose
    threshold is made ten times coarser ranks first."""
    from debug_support import degrade

    import hbtools.debug as dbg

    try:
        project, result = convert_custom_op_model(tmp_path, conv_custom_conv(),
                                                  model_parameters={"debug_mode": "dump_calibration_data"})
        assert result.exit_code == 0, result.output
        calibrated = next(project.working_dir.glob("*_calibrated_model.onnx"))
        data = str(project.working_dir / "calibration_data")
        weights = dbg.get_sensitivity_of_nodes(model_or_file=str(calibrated), calibrated_data=data, node_type="weight")
        assert len(weights) == 2 and all(0.9 < float(v["cosine-similarity"]) <= 1.0 for v in weights.values())
        last = list(weights)[-1]  # the least sensitive weight, made the worst
        degraded = degrade(onnx.load(str(calibrated)), {last: 10.0})
        ranked = dbg.get_sensitivity_of_nodes(model_or_file=degraded, calibrated_data=data, node_type="weight")
        assert next(iter(ranked)) == last, ranked
    finally:
        custom.unregister(OP)
