"""Small float models built with ``onnx.helper`` and the files a makertbin run needs.

Every model here is tiny (a few kB) so a full makertbin run on it takes well under
a second or two. Weights come from a seeded generator: the models are the same in
every run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
# Mean/scale whose float arithmetic is exact ((x - mean) * scale == x*scale - mean*scale),
# so "original vs source model: identical outputs" can be checked bit for bit.
EXACT_MEAN = [120.0, 116.0, 104.0]
EXACT_SCALE = [0.015625, 0.0078125, 0.03125]


@dataclass
class FloatModel:
    """A float model plus what the config needs to say about its inputs."""

    model: onnx.ModelProto
    inputs: dict[str, list[int]]  # name -> shape (train layout)
    featuremap: set[str] = field(default_factory=set)

    def node(self, op_type: str, index: int = 0) -> str:
        return [n.name for n in self.model.graph.node if n.op_type == op_type][index]


class _Graph:
    """Accumulates nodes and initializers with generated names."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count: dict[str, int] = {}

    def _name(self, op: str) -> str:
        k = self.count.get(op, 0)
        self.count[op] = k + 1
        return f"{op}_{k}"

    def const(self, value: Any, hint: str = "c") -> str:
        name = f"{hint}_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> str:
        name = self._name(op_type)
        outs = [f"{name}_out{k}" if n_out > 1 else f"{name}_out" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0]

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, bias: bool = True) -> str:
        w = (self.rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        ins = [x, self.const(w, "w")]
        if bias:
            ins.append(self.const((0.1 * self.rng.standard_normal(cout)).astype(np.float32), "b"))
        return self.op("Conv", ins, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])

    def bn(self, x: str, c: int) -> str:
        gamma = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        beta = (0.1 * self.rng.standard_normal(c)).astype(np.float32)
        mean = (0.1 * self.rng.standard_normal(c)).astype(np.float32)
        var = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        ins = [x, *(self.const(v, "bn") for v in (gamma, beta, mean, var))]
        return self.op("BatchNormalization", ins, epsilon=1e-5)

    def gemm(self, x: str, k: int, n: int) -> str:
        w = (self.rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        b = (0.1 * self.rng.standard_normal(n)).astype(np.float32)
        return self.op("Gemm", [x, self.const(w, "fc_w"), self.const(b, "fc_b")], transB=1)

    def model(self, inputs: dict[str, list[int]], outputs: list[str], opset: int = OPSET,
              featuremap: set[str] | None = None) -> FloatModel:
        graph = helper.make_graph(
            self.nodes, "small",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
        m.ir_version = 10 if opset >= 21 else 8  # opset 21 needs IR 10
        m = onnx.shape_inference.infer_shapes(m)
        onnx.checker.check_model(m, full_check=True)
        return FloatModel(m, dict(inputs), set(featuremap or ()))


def resnet_like(h: int = 16, opset: int = OPSET) -> FloatModel:
    """Conv+BN+Relu -> Conv -> Add residual -> Relu -> GlobalAveragePool -> Gemm -> Softmax."""
    g = _Graph(1)
    a = g.op("Relu", [g.bn(g.conv("data", 3, 8, bias=False), 8)])
    b = g.conv(a, 8, 8)
    r = g.op("Relu", [g.op("Add", [b, a])])
    p = g.op("Flatten", [g.op("GlobalAveragePool", [r])], axis=1)
    out = g.op("Softmax", [g.gemm(p, 8, 10)], axis=1)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def activations(h: int = 12, opset: int = OPSET) -> FloatModel:
    """Sigmoid and HardSwish written as ops (x * clip(x + 3, 0, 6) / 6), each after a conv."""
    g = _Graph(2)
    c1 = g.conv("data", 3, 6)
    s = g.op("Mul", [c1, g.op("Sigmoid", [c1])])  # swish
    c2 = g.conv(s, 6, 6)
    clip = g.op("Clip", [g.op("Add", [c2, g.const(np.float32(3.0))]), g.const(np.float32(0.0)),
                         g.const(np.float32(6.0))])
    hs = g.op("Div", [g.op("Mul", [c2, clip]), g.const(np.float32(6.0))])
    out = g.conv(hs, 6, 4, k=1)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def data_movement(h: int = 16, opset: int = OPSET) -> FloatModel:
    """MaxPool, Resize (nearest), Concat and Reshape between convs."""
    g = _Graph(3)
    c1 = g.op("Relu", [g.conv("data", 3, 4)])
    pooled = g.op("MaxPool", [c1], kernel_shape=[2, 2], strides=[2, 2])
    c2 = g.op("Relu", [g.conv(pooled, 4, 4)])
    scales = g.const(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    roi = g.const(np.array([], dtype=np.float32), "roi")  # opset 11 needs it present
    up = g.op("Resize", [c2, roi, scales], mode="nearest")
    cat = g.op("Concat", [c1, up], axis=1)
    c3 = g.conv(cat, 8, 4, k=1)
    out = g.op("Reshape", [c3, g.const(np.array([1, 4, h * h], dtype=np.int64), "shape")])
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def act_matmul(h: int = 8, opset: int = OPSET) -> FloatModel:
    """MatMul of two activations (an attention-like score matrix) followed by a Softmax."""
    g = _Graph(4)
    q = g.op("Reshape", [g.conv("data", 3, 8), g.const(np.array([1, 8, h * h], dtype=np.int64), "sq")])
    k = g.op("Reshape", [g.conv("data", 3, 8), g.const(np.array([1, 8, h * h], dtype=np.int64), "sk")])
    kt = g.op("Transpose", [k], perm=[0, 2, 1])
    scores = g.op("MatMul", [q, kt])
    out = g.op("Softmax", [scores], axis=-1)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def featuremap_mlp(opset: int = OPSET) -> FloatModel:
    """A 3-D float featuremap input: MatMul -> Relu -> MatMul -> Tanh."""
    g = _Graph(5)
    w1 = (g.rng.standard_normal((12, 16)) / np.sqrt(12)).astype(np.float32)
    w2 = (g.rng.standard_normal((16, 8)) / 4).astype(np.float32)
    h = g.op("Relu", [g.op("Add", [g.op("MatMul", ["feat", g.const(w1, "w1")]),
                                   g.const((0.1 * g.rng.standard_normal(16)).astype(np.float32))])])
    out = g.op("Tanh", [g.op("MatMul", [h, g.const(w2, "w2")])])
    return g.model({"feat": [1, 5, 12]}, [out], opset, featuremap={"feat"})


def yolo_like(h: int = 16, channels: int = 3, opset: int = OPSET) -> FloatModel:
    """A detector's shape: strided conv backbone, a box head (conv, int32 per-channel at the output) and a
    class head (conv + Sigmoid, int8 per-tensor), named output0/output1 as exported detectors are."""
    g = _Graph(6)
    x = g.op("Relu", [g.conv("data", channels, 8, stride=2)])
    x = g.op("Relu", [g.conv(x, 8, 8)])
    heads = {g.conv(x, 8, 4, k=1): "output0", g.op("Sigmoid", [g.conv(x, 8, 3, k=1)]): "output1"}
    for node in g.nodes:
        node.output[:] = [heads.get(o, o) for o in node.output]
    return g.model({"data": [1, channels, h, h]}, list(heads.values()), opset)


BOX_CONV = "/model.23/cv2.0/cv2.0.2/Conv"  # ultralytics' name of YOLO11's first box conv


def rdk_yolo_head(h: int = 16) -> FloatModel:
    """A detector head as D-Robotics' rdk_model_zoo exports YOLO: each last conv's output permuted to NHWC
    (``permute(0, 2, 3, 1)``) before it leaves, the box conv (16 channels) under ultralytics' node and tensor
    names; the class conv goes through a Sigmoid first."""
    g = _Graph(8)
    x = g.op("Relu", [g.conv("data", 3, 8, stride=2)])
    box, cls = g.conv(x, 8, 16, k=1), g.op("Sigmoid", [g.conv(x, 8, 4, k=1)])
    names = {box: f"{BOX_CONV}_output_0"}
    outputs = [g.op("Transpose", [t], perm=[0, 2, 3, 1]) for t in (box, cls)]
    for node in g.nodes:
        if node.output[0] == box:
            node.name = BOX_CONV
        node.output[:] = [names.get(o, o) for o in node.output]
        node.input[:] = [names.get(i, i) for i in node.input]
    return g.model({"data": [1, 3, h, h]}, outputs)


def fpn_like(h: int = 16, opset: int = OPSET) -> FloatModel:
    """A segmentation neck: two scales, the coarse one upsampled (Resize nearest and ConvTranspose),
    added to and multiplied with the fine one, Concat of branches of different ranges, Sigmoid map."""
    g = _Graph(7)
    fine = g.op("Relu", [g.conv("data", 3, 6)])
    coarse = g.op("Relu", [g.conv(fine, 6, 6, stride=2)])
    scales = g.const(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    roi = g.const(np.array([], dtype=np.float32), "roi")
    up = g.op("Resize", [coarse, roi, scales], mode="nearest")
    added = g.op("Add", [fine, up])
    gate = g.conv(fine, 6, 6, k=1)
    gated = g.op("Mul", [added, gate])
    w = (g.rng.standard_normal((6, 4, 2, 2)) / 4).astype(np.float32)
    deconv = g.op("ConvTranspose", [coarse, g.const(w, "wt"), g.const(np.full(4, 0.05, np.float32), "bt")],
                  kernel_shape=[2, 2], strides=[2, 2])
    cat = g.op("Concat", [gated, deconv, g.conv(added, 6, 2, k=1)], axis=1)
    out = g.op("Sigmoid", [g.conv(cat, 12, 1, k=1)])
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def bpu_cpu_bpu(h: int = 8, opset: int = OPSET) -> FloatModel:
    """Conv -> LRN (no BPU op) -> Conv, then a Concat of the first and the last conv: the Concat is
    linked to the first BPU part but can only run after the CPU node, so it starts a second subgraph."""
    g = _Graph(7)
    a = g.op("Relu", [g.conv("data", 3, 8)])
    b = g.conv(g.op("LRN", [g.conv(a, 8, 8)], size=3), 8, 8)
    out = g.conv(g.op("Concat", [a, b], axis=1), 16, 4, k=1)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def cpu_island(h: int = 12, opset: int = OPSET) -> FloatModel:
    """Two convs summed and layer-normalised over channels on the CPU (Div of two tensors has no
    BPU form; the Add, Sub and Mul feed only CPU nodes), then a conv back on the BPU; both the
    normalised map and the last conv are outputs."""
    g = _Graph(11)
    total = g.op("Add", [g.conv("data", 3, 8), g.conv("data", 3, 8)])
    centred = g.op("Sub", [total, g.op("ReduceMean", [total], axes=[1], keepdims=1)])
    spread = g.op("ReduceMean", [g.op("Mul", [centred, centred])], axes=[1], keepdims=1)
    norm = g.op("Div", [centred, g.op("Sqrt", [g.op("Add", [spread, g.const(np.float32(1e-5), "eps")])])])
    return g.model({"data": [1, 3, h, h]}, [norm, g.conv(norm, 8, 4, k=1)], opset)


MODELS = {
    "resnet_like": resnet_like,
    "activations": activations,
    "data_movement": data_movement,
    "act_matmul": act_matmul,
    "featuremap_mlp": featuremap_mlp,
}


# ---------------------------------------------------------------- config and data


def image_input_params(march: str = "bayes-e") -> dict[str, Any]:
    del march
    return {
        "input_type_train": "rgb",
        "input_layout_train": "NCHW",
        "input_type_rt": "rgb",
        "norm_type": "data_mean_and_scale",
        "mean_value": " ".join(str(v) for v in EXACT_MEAN),
        "scale_value": " ".join(str(v) for v in EXACT_SCALE),
    }


FEATUREMAP_PARAMS = {
    "input_type_train": "featuremap",
    "input_layout_train": "NCHW",
    "input_type_rt": "featuremap",
    "norm_type": "no_preprocess",
}


def random_sample(fm: FloatModel, name: str, rng: np.random.Generator) -> np.ndarray:
    shape = fm.inputs[name]
    if name in fm.featuremap:
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def write_calibration(fm: FloatModel, root: Path, count: int = 6, seed: int = 10) -> dict[str, Path]:
    """``count`` random ``tofile`` samples per input: uint8 images, float32 featuremaps."""
    rng = np.random.default_rng(seed)
    dirs = {}
    for k, name in enumerate(fm.inputs):
        d = root / (f"cal_{name}" if len(name.encode()) < 200 else f"cal_{k}")  # a name too long for a folder
        d.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            random_sample(fm, name, rng).tofile(d / f"{i:03d}.bin")
        dirs[name] = d
    return dirs


def held_out(fm: FloatModel, count: int = 6, seed: int = 99) -> list[np.ndarray]:
    """``count`` random samples of a one-input model: what ``write_calibration`` with ``seed`` writes, in memory."""
    (name,) = fm.inputs
    rng = np.random.default_rng(seed)
    return [random_sample(fm, name, rng) for _ in range(count)]


@dataclass
class Project:
    """A folder with a model, its calibration data and a makertbin config."""

    root: Path
    fm: FloatModel
    config: dict[str, Any]

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def model_path(self) -> Path:
        return self.root / "model.onnx"

    @property
    def working_dir(self) -> Path:
        return self.root / self.config["model_parameters"]["working_dir"]

    def artefact(self, kind: str) -> Path:
        prefix = self.config["model_parameters"]["output_model_file_prefix"]
        suffix = {"original": "_original_float_model.onnx", "optimized": "_optimized_float_model.onnx",
                  "calibrated": "_calibrated_model.onnx", "quantized": "_quantized_model.onnx",
                  "bin": ".bin"}[kind]
        return self.working_dir / f"{prefix}{suffix}"

    def write(self, **overrides: dict[str, Any]) -> Path:
        """Write the config with ``{group: {key: value | None-to-delete}}`` overrides."""
        data = copy.deepcopy(self.config)
        for group, values in overrides.items():
            for key, value in values.items():
                if value is None:
                    data[group].pop(key, None)
                else:
                    data[group][key] = value
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=False))
        self.config = data
        return self.config_path


def make_project(root: Path, fm: FloatModel, *, march: str = "bayes-e", cal_count: int = 6,
                 calibration_type: str = "max") -> Project:
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(fm.model, str(root / "model.onnx"))
    dirs = write_calibration(fm, root, cal_count)
    names = list(fm.inputs)
    per_input: dict[str, list[Any]] = {}
    for name in names:
        params = FEATUREMAP_PARAMS if name in fm.featuremap else image_input_params(march)
        for key, value in params.items():
            per_input.setdefault(key, []).append(value)
    input_parameters: dict[str, Any] = {"input_name": "; ".join(names)}
    for key, values in per_input.items():
        input_parameters[key] = "; ".join(str(v) for v in values)
    input_parameters["input_shape"] = "; ".join("x".join(map(str, fm.inputs[n])) for n in names)
    config = {
        "model_parameters": {
            "onnx_model": "model.onnx",
            "march": march,
            "working_dir": "model_output",
            "output_model_file_prefix": "small",
        },
        "input_parameters": input_parameters,
        "calibration_parameters": {
            "cal_data_dir": "; ".join(dirs[n].name for n in names),
            "calibration_type": calibration_type,
        },
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    project = Project(root, fm, config)
    project.write()
    return project


def without_int16(monkeypatch: Any, op: str, march: str = "bayes-e") -> None:
    """Make ``op`` an op without an int16 form on ``march`` for one test: no op of the shipped profiles lacks it
    where the march has int16, but the plan and the search must keep such an op's grids int8."""
    from dataclasses import replace

    from hbtools.march import profiles

    profile = profiles.PROFILES[march]
    ops = {**profile.ops, op: replace(profile.ops[op], int16=False)}
    monkeypatch.setitem(profiles.PROFILES, march, replace(profile, ops=ops))


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``model``'s outputs for ``feeds`` in a plain onnxruntime session (CPU, warnings quiet)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def optimized_agreeing(model: onnx.ModelProto, march: str, feeds: dict[str, np.ndarray], *, rtol: float = 1e-5,
                       atol: float = 1e-5) -> onnx.ModelProto:
    """The optimize stage's model for ``march``, asserted to give ``model``'s first output on ``feeds``."""
    from hbtools.march.profiles import get_profile
    from hbtools.pipeline import optimize

    optimized = optimize.run(model, get_profile(march))
    np.testing.assert_allclose(ort_outputs(optimized, feeds)[0], ort_outputs(model, feeds)[0], rtol=rtol, atol=atol)
    return optimized


def checked(model: onnx.ModelProto, march: str, folder: Path) -> str:
    """What ``hb_mapper checker`` prints for ``model`` (saved in ``folder``, run there), its exit code asserted 0."""
    import contextlib

    from click.testing import CliRunner

    from hbtools.cli.hb_mapper import main

    with contextlib.chdir(folder):
        onnx.save(model, "model.onnx")
        result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", march, "--model",
                                           "model.onnx"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output
