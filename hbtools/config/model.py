"""The validated, normalised form of a makertbin YAML config.

``hbtools.config.loader.load_config`` turns the user's YAML (all the value forms
real configs use) into these dataclasses; everything downstream reads only
these. Per-input values are already split into one ``InputSpec`` per input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMAGE_TYPES = ("rgb", "bgr", "yuv444", "gray")
TRAIN_TYPES = (*IMAGE_TYPES, "featuremap")
RT_TYPES = ("nv12", *IMAGE_TYPES, "featuremap")

# input_type_train -> the input_type_rt values it may be fed from (seed 004 table).
ALLOWED_RT_FOR_TRAIN: dict[str, tuple[str, ...]] = {
    "yuv444": ("nv12", "yuv444"),
    "rgb": ("nv12", "yuv444", "rgb", "bgr"),
    "bgr": ("nv12", "yuv444", "rgb", "bgr"),
    "gray": ("gray",),
    "featuremap": ("featuremap",),
}


@dataclass
class NodeInfo:
    """One entry of ``model_parameters.node_info`` (or run_on_cpu/run_on_bpu)."""

    on: str | None = None  # "BPU" | "CPU" | None
    input_types: dict[int | None, str] = field(default_factory=dict)  # None = all inputs
    output_type: str | None = None  # "int8" | "int16" | None
    # the parameter that named the node, for messages (node_info, run_on_cpu, ...)
    given_by: str = field(default="node_info", compare=False, repr=False)


@dataclass
class InputSpec:
    """Everything the config says about one model input.

    ``name`` and ``shape`` may be None when the config leaves them to the model;
    the parse stage fills them in (``resolved``).
    """

    name: str | None
    shape: list[int] | None
    type_train: str
    layout_train: str  # "NCHW" | "NHWC" (featuremap of other rank: as given)
    type_rt: str
    layout_rt: str | None  # None: default (NHWC for nv12, else layout_train)
    space_and_range: str = "regular"  # "regular" | "bt601_video"
    norm_type: str = "no_preprocess"
    mean: list[float] | None = None  # one value (all channels) or one per channel
    scale: list[float] | None = None
    cal_data_dir: Path | None = None
    cal_data_type: str | None = None  # None: from the folder name (_f32 -> float32, else uint8)
    model_dtype: str = "float32"  # the model input's element type (parse fills it: a featuremap may be int64)

    @property
    def is_featuremap(self) -> bool:
        return self.type_rt == "featuremap"


    @property
    def effective_layout_rt(self) -> str:
        if self.layout_rt:
            return self.layout_rt
        return "NHWC" if self.type_rt == "nv12" else self.layout_train


@dataclass
class ModelParameters:
    model_type: str  # "onnx" | "caffe"
    march: str  # lower case
    onnx_model: Path | None = None
    prototxt: Path | None = None
    caffe_model: Path | None = None
    output_model_file_prefix: str = "model"
    working_dir: Path = Path("model_output")
    layer_out_dump: bool = False
    output_nodes: list[str] = field(default_factory=list)
    remove_node_type: list[str] = field(default_factory=list)
    remove_node_name: list[str] = field(default_factory=list)
    debug_mode: list[str] = field(default_factory=list)  # e.g. ["dump_calibration_data"]
    # set_node_data_type, run_on_cpu/run_on_bpu and node_info merged, by node name.
    node_info: dict[str, NodeInfo] = field(default_factory=dict)
    # Not a YAML key: set by `makertbin --fast-perf`. Every BPU-able node goes on the BPU and
    # removable nodes at the model's edges are deleted until none is left.
    fast_perf: bool = False


@dataclass(frozen=True)
class OptimizationOptions:
    """``calibration_parameters.optimization`` as typed switches (the strings are read here only)."""

    output_bits: int | None = None  # set_model_output_int8 / int16: BPU outputs stay integers
    all_int16: bool = False  # set_all_nodes_int16
    # set_all_nodes_int8: default's int16 search promotes nothing (int16 only where node_info or an option says)
    all_int8: bool = False
    int16_inputs: frozenset[str] = frozenset()  # op types of set_{Op}_input_int16
    int16_outputs: frozenset[str] = frozenset()  # op types of set_{Op}_output_int16
    int8_inputs: frozenset[str] = frozenset()  # op types of set_{Op}_input_int8
    int8_outputs: frozenset[str] = frozenset()  # op types of set_{Op}_output_int8
    asymmetric: bool = False
    bias_correction: bool = False
    lstm_batch_last: bool = False

    @property
    def int_outputs(self) -> bool:
        return self.output_bits is not None

    @classmethod
    def parse(cls, values: list[str]) -> OptimizationOptions:
        def kinds(suffix: str) -> frozenset[str]:
            return frozenset(v[len("set_"): -len(suffix)] for v in values
                             if v.startswith("set_") and v.endswith(suffix) and not v.startswith("set_model_"))

        output_bits = 8 if "set_model_output_int8" in values else 16 if "set_model_output_int16" in values else None
        return cls(output_bits, "set_all_nodes_int16" in values, "set_all_nodes_int8" in values,
                   kinds("_input_int16"), kinds("_output_int16"),
                   kinds("_input_int8"), kinds("_output_int8"), "asymmetric" in values,
                   "bias_correction" in values, "lstm_batch_last" in values)


@dataclass
class CalibrationParameters:
    calibration_type: str = "default"  # default|mix|kl|max|load|skip
    max_percentile: float | None = None
    per_channel: bool = False
    preprocess_on: bool = False
    optimization: list[str] = field(default_factory=list)

    @property
    def options(self) -> OptimizationOptions:
        return OptimizationOptions.parse(self.optimization)


@dataclass
class CompilerParameters:
    compile_mode: str = "latency"  # latency|bandwidth|balance
    balance_factor: int | None = None
    debug: bool = False
    core_num: int = 1
    optimize_level: str = "O0"
    input_source: dict[str, str] = field(default_factory=dict)
    max_time_per_fc: int = 0
    jobs: int | None = None
    advice: int | None = None


@dataclass
class CustomOpParameters:
    custom_op_method: str | None = None
    op_register_files: list[str] = field(default_factory=list)
    custom_op_dir: Path | None = None


def random_calibration(calibration_type: str, inputs: list[InputSpec]) -> bool:
    """Whether calibration runs on generated data: ``skip`` always; ``load`` unless folders are given
    (they calibrate the tensors its QDQ model leaves without a QuantizeLinear, such as a float input
    before a normalization); every other type reads the folders."""
    return calibration_type == "skip" or (calibration_type == "load" and all(s.cal_data_dir is None for s in inputs))


@dataclass
class Config:
    model: ModelParameters
    inputs: list[InputSpec]
    input_batch: int
    calibration: CalibrationParameters
    compiler: CompilerParameters
    custom_op: CustomOpParameters
    yaml_path: Path | None = None
    # The user's values after normalisation, by group, for logs and the .bin snapshot.
    snapshot: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def output_prefix_path(self) -> Path:
        return self.model.working_dir / self.model.output_model_file_prefix

    def wants(self, optimization: str) -> bool:
        return optimization in self.calibration.optimization
