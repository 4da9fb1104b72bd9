"""hb_model_info report: build-time dependencies and config of a ``.bin`` model (seed 004)."""

from __future__ import annotations

from typing import Any

from hbtools.march.layout import to_layout
from hbtools.runtime.binfile import BinModel
from hbtools.tools.modifier import INFO_TYPES, descriptor_scale, descriptor_zero_point, info_line, scale_lines

# Numbering of the vendor's InputDataType enum; the seed shows F32 = 5 and NV12 = 7. The 64-bit and other
# wider types (an ArgMax output, Gather indices fed as a featuremap) follow GRAY, numbered by us: printed as
# F32 they told board code to pass float buffers for int64 tensors.
DATA_TYPES = {"S8": 0, "U8": 1, "S16": 2, "U16": 3, "S32": 4, "F32": 5, "F16": 6, "NV12": 7, "YUV444": 8,
              "RGB": 9, "BGR": 10, "GRAY": 11, "U32": 12, "S64": 13, "U64": 14, "F64": 15, "BOOL": 16}
_RT_TYPE = {"nv12": "NV12", "yuv444": "YUV444", "rgb": "RGB", "bgr": "BGR", "gray": "GRAY", "featuremap": "F32"}
# a descriptor's element type by numpy dtype name (hrt_model_exec's HB_DNN_TENSOR_TYPE_* too)
TENSOR_TYPES = {"int8": "S8", "uint8": "U8", "int16": "S16", "uint16": "U16", "int32": "S32", "float32": "F32",
                "float16": "F16", "uint32": "U32", "int64": "S64", "uint64": "U64", "float64": "F64", "bool": "BOOL"}
_MODEL_KEYS = [("onnx_model", "onnx_model"), ("prototxt", "prototxt"), ("caffe_model", "caffe_model"),
               ("march", "BPU march"), ("layer_out_dump", "layer_out_dump"), ("working_dir", "working dir"),
               ("output_model_file_prefix", "output_model_file_prefix")]
_ALWAYS = {"onnx_model", "march", "layer_out_dump", "working_dir", "output_model_file_prefix"}
_INPUT_KEYS = [("input_name", "input_name"), ("input_type_rt", "input_type_rt"),
               ("input_space_and_range", "input_space&range"), ("input_layout_rt", "input_layout_rt"),
               ("input_type_train", "input_type_train"), ("input_layout_train", "input_layout_train"),
               ("norm_type", "norm_type"), ("input_shape", "input_shape"), ("input_batch", "input_batch"),
               ("mean_value", "mean_value"), ("scale_value", "scale_value")]
_CAL_PER_INPUT = [("cal_data_dir", "cal_data_dir"), ("cal_data_type", "cal_data_type")]


def _line(label: str, value: Any) -> str:
    return f"{label:<20}: {_fmt(value)}" if len(label) < 20 else f"{label}: {_fmt(value)}"


def _fmt(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        return "".join(f"{v}," for v in value)  # the seed's "123.68,116.779,103.939,"
    return str(value)


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _group(config: dict, name: str) -> dict:
    g = config.get(name)
    return g if isinstance(g, dict) else {}


def _per_input(values: Any, index: int) -> Any:
    if isinstance(values, list):
        return values[index] if 0 <= index < len(values) else None
    return values


def report(model: BinModel, tool_version: str) -> list[str]:
    """The lines hb_model_info prints for one model."""
    cfg = model.config if isinstance(model.config, dict) else {}
    lines = [f"******** {model.name} info *********", "############# model deps info #############"]
    lines += [_line(f"{pkg} version", ver) for pkg, ver in model.deps.items()]
    lines.append("############# model_parameters info #############")
    mp = _group(cfg, "model_parameters")
    shown = {k for k, _ in _MODEL_KEYS}
    for key, label in _MODEL_KEYS:
        if key in _ALWAYS or not _empty(mp.get(key)):
            lines.append(_line(label, mp.get(key)))
    lines += [_line(k, v) for k, v in mp.items() if k not in shown and not _empty(v)]
    lines += _inputs(model, cfg)
    lines.append("############# calibration_parameters info #############")
    cp = _group(cfg, "calibration_parameters")
    lines += [_line(k, v) for k, v in cp.items() if k not in dict(_CAL_PER_INPUT) and not _empty(v)]
    if isinstance(model.meta.get("calibration_summary"), str):  # what calibration chose, as makertbin logged it
        lines.append(_line("calibration result", model.meta["calibration_summary"]))
    lines.append("############# compiler_parameters info #############")
    cc = _group(cfg, "compiler_parameters")
    lines += [_line(k, v) for k, v in cc.items() if k != "input_source" and not _empty(v)]
    lines.append(_line("input-source", _input_source(model, cc)))
    co = {k: v for k, v in _group(cfg, "custom_op").items() if not _empty(v)}
    if co:
        lines.append("############# custom_op info #############")
        lines += [_line(k, v) for k, v in co.items()]
    lines.append("--------- input/output types -------------------")
    lines.append(_line("model input types", _types(model.inputs, input_side=True)))
    lines.append(_line("model output types", _types(model.outputs, input_side=False)))
    lines += _scales(model)
    if model.deleted_nodes:
        lines.append("--------- deleted nodes -------------------")
        lines += [f"deleted nodes: {r.get('name')}" for r in model.deleted_nodes]
    return lines


def _scales(model: BinModel) -> list[str]:
    """``scale data`` (``zero point data``) / ``quantizeAxis`` of every integer input and output, as the board
    prints them."""
    lines = []
    for side, descriptors in (("input", model.inputs), ("output", model.outputs)):
        for k, desc in enumerate(descriptors):
            scale, axis = descriptor_scale(desc)
            if scale:
                lines += [f"{side}[{k}] {desc.get('name')}: {TENSOR_TYPES.get(str(desc.get('dtype')), 'F32')}",
                          *scale_lines(scale, axis, descriptor_zero_point(desc))]
    return ["--------- integer input/output scales -------------------", *lines] if lines else []


def _inputs(model: BinModel, cfg: dict) -> list[str]:
    ip, cp = _group(cfg, "input_parameters"), _group(cfg, "calibration_parameters")
    names = ip.get("input_name") if isinstance(ip.get("input_name"), list) else []
    lines = ["############# input_parameters info #############"]
    for desc in model.inputs:
        name = desc.get("name")
        # descriptors of a modified model may be renamed; the original name finds the config values
        original = desc.get("config_name", name)
        i = names.index(original) if original in names else model.inputs.index(desc)
        lines += ["------", f"---------input info : {name} ---------"]
        for key, label in _INPUT_KEYS:
            value = ip.get(key) if key == "input_batch" else _per_input(ip.get(key), i)
            if key == "input_shape" and _empty(value):
                value = _shape_of(desc)  # read from the model at build time: the descriptor has it
            if key == "input_layout_rt" and desc.get("input_type_rt") == "featuremap" and desc.get("layout"):
                value = desc["layout"]  # a featuremap is taken in its training layout, whatever the config asked
            elif key == "input_layout_rt" and desc.get("input_type_rt") not in ("nv12", None) and \
                    not _empty(value) and desc.get("layout") not in (None, value):
                value = f"{value} (the .bin takes {desc['layout']})"  # RDK X3 takes images in NHWC whatever was asked
            lines.append(_line(label, name if key == "input_name" else value))
        lines += [_line(label, _per_input(cp.get(key), i)) for key, label in _CAL_PER_INPUT
                  if not _empty(_per_input(cp.get(key), i))]
        lines += [f"---------input info : {name} end -------"]
    lines.append("------")
    return lines


def _shape_of(desc: dict) -> str | None:
    """The input's shape in input_layout_train, as the seed prints it (``1x3x512x512``)."""
    shape, layout, train = desc.get("shape"), desc.get("layout"), desc.get("input_layout_train")
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        return None
    if isinstance(layout, str) and isinstance(train, str) and sorted(layout) == sorted(train) == sorted("NCHW"):
        shape = to_layout(shape, layout, train)
    return "x".join(map(str, shape))


def _input_source(model: BinModel, cc: dict) -> dict:
    sources = {str(d.get("name")): d.get("input_source") for d in model.inputs if d.get("input_source")}
    configured = cc.get("input_source") if isinstance(cc.get("input_source"), dict) else {}
    return {**configured, **sources, "_default_value": "ddr"}


def _types(descriptors: list[dict], input_side: bool) -> str:
    out = []
    for d in descriptors:
        dtype = str(d.get("dtype", "float32"))
        rt = str(d.get("input_type_rt"))
        key = _RT_TYPE.get(rt, "F32") if input_side and dtype == "uint8" else TENSOR_TYPES.get(dtype, "F32")
        if input_side and rt == "featuremap":
            key = TENSOR_TYPES.get(dtype, "F32")
        out.append(f"<InputDataType.{key}: {DATA_TYPES[key]}>")
    return "[" + ", ".join(out) + "]"


def deleted_nodes_info(model: BinModel) -> list[str]:
    """Lines of deleted_nodes_info.txt (Quantize, Dequantize and Transpose nodes, as in the seed)."""
    return [info_line(r) for r in model.deleted_nodes if r.get("type") in INFO_TYPES]
