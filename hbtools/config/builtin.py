"""The built-in configs of ``hb_mapper checker`` and ``makertbin --fast-perf``.

Neither command takes a YAML file: the model, the march and the input shapes
come from the command line, everything else from here. The config is built as
the mapping a YAML file would hold and goes through the same validation as a
user's file (``config_from_dict``).

Input types are guessed from the shape: a 4-D input with 3 channels is an
rgb image, with 1 channel a gray one (NCHW if the channel axis is 1, NHWC if it
is 3); anything else is a featuremap. No mean/scale: placement does not depend
on them, and random calibration data carries no meaning to normalise.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from onnx import ModelProto, TensorProto

from hbtools.config.loader import config_from_dict
from hbtools.config.model import Config
from hbtools.config.values import closest_names
from hbtools.errors import HbError
from hbtools.graph.model_io import load_model
from hbtools.graph.source_repairs import check_inputs_to_feed, shape_inputs, shapeless_inputs
from hbtools.march.profiles import get_profile
from hbtools.pipeline.parse import MAX_OUTPUTS, fit_scalar, shape_example

log = logging.getLogger("hbtools")

# The boundary node types fast-perf removes (SPEC §6).
FAST_PERF_REMOVABLE = ("Quantize", "Dequantize", "Transpose", "Cast", "Reshape")


def parse_shape(text: str, name: str, option: str = "--input-shape") -> list[int]:
    """'1x3x224x224' -> [1, 3, 224, 224]."""
    parts = str(text).strip().lower().split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise HbError(f"{option} {name}: '{text}' is not a shape; write positive sizes joined by 'x', "
                      f"e.g. 1x3x224x224")
    return [int(p) for p in parts]


def model_inputs(model: ModelProto) -> dict[str, list[int | None]]:
    """Graph inputs that are not initializers, with None for dynamic dims."""
    check_inputs_to_feed(model)
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        out[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                        for d in vi.type.tensor_type.shape.dim]
    return out


def _empty_inputs(model: ModelProto) -> dict[str, list[str]]:
    """The graph inputs declaring a dimension of size 0, with their dims as written ('?' for unknown ones)."""
    found = {}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in dims):
            found[vi.name] = [str(d.dim_value) if d.HasField("dim_value") else "?" for d in dims]
    return found


def resolve_shapes(model: ModelProto, given: list[tuple[str, str]], *, batch_one: bool,
                   option: str = "--input-shape") -> dict[str, list[int]]:
    """Every input's static shape: from ``given`` (NAME SHAPE pairs), else from the model.

    ``batch_one`` (fast-perf) sets a dynamic first dimension to 1; any other
    dynamic dimension is an error naming the option that fixes it.
    """
    shape_inputs(model, {name: parse_shape(text, name, option) for name, text in given})
    unknown = shapeless_inputs(model)
    if unknown:
        raise HbError(f"input '{unknown[0]}' is declared without a shape in the model",
                      hint=f"give its shape with {option} {unknown[0]} <shape> (e.g. 1x3x224x224)")
    declared = model_inputs(model)
    shapes: dict[str, list[int]] = {}
    for name, text in given:
        if name not in declared:
            raise HbError(f"{option} names '{name}', which is not an input of the model"
                          f"{closest_names(name, declared)}; its inputs are "
                          f"{', '.join(declared)}")
        shape = fit_scalar(parse_shape(text, name, option), declared[name])
        if len(shape) != len(declared[name]):
            raise HbError(f"{option} {name} {text} has rank {len(shape)} but the model input has rank "
                          f"{len(declared[name])}")
        if name in shapes and shapes[name] != shape:  # as a YAML key given twice with different values
            raise HbError(f"{option} gives input '{name}' twice with different shapes "
                          f"({'x'.join(map(str, shapes[name]))} and {text}); give each input once")
        shapes[name] = shape
    for name, dims in declared.items():
        if name in shapes:
            continue
        if batch_one and dims and dims[0] is None and None not in dims[1:]:
            log.info("input '%s': dynamic first dimension set to 1", name)
            dims = [1, *dims[1:]]
        if None in dims:
            if name in _empty_inputs(model):
                text = "x".join(_empty_inputs(model)[name])
                raise HbError(f"input '{name}' has shape {text}, with a dimension of size 0: it holds no values, and "
                              f"hbtools converts inputs that hold some; if that size is only a placeholder, give the "
                              f"real shape with {option} {name} <shape>, else export the model without this input")
            text = "x".join("?" if d is None else str(d) for d in dims)
            # every dynamic input at once: one run of the command to fix them all
            dynamic = [(n, d) for n, d in declared.items() if n not in shapes and n != name and None in (
                d[1:] if batch_one and d and d[0] is None else d)]
            options = " ".join(f"{option} {n} {shape_example(d)}" for n, d in [(name, dims), *dynamic])
            raise HbError(f"input '{name}' has a dynamic shape {text}; give a static one with {options}")
        shapes[name] = [int(d) for d in dims]
    return shapes


# what parse converts to float32 (a float16 model computes in float32 once converted)
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def _input_parameters(shapes: dict[str, list[int]], outputs: set[str], floats: set[str]) -> dict[str, str]:
    columns: dict[str, list[str]] = {k: [] for k in ("input_name", "input_type_train", "input_layout_train",
                                                     "input_type_rt", "input_shape", "norm_type")}
    for name, shape in shapes.items():
        kind, layout = "featuremap", "NCHW"
        # An input the model also outputs stays a featuremap: an image input becomes int8 image data, which
        # the converted model could not hand back as the model's float output. So does an input of another
        # type than float (a uint8 picture a TensorFlow export casts itself): only float inputs are images.
        if len(shape) == 4 and name not in outputs and name in floats:
            for channels, image in ((3, "rgb"), (1, "gray")):
                if shape[1] == channels:
                    kind, layout = image, "NCHW"
                    break
                if shape[3] == channels:
                    kind, layout = image, "NHWC"
                    break
        for key, value in (("input_name", name), ("input_type_train", kind), ("input_layout_train", layout),
                           ("input_type_rt", kind), ("input_shape", "x".join(map(str, shape))),
                           ("norm_type", "no_preprocess")):
            columns[key].append(value)
    return {k: "; ".join(v) for k, v in columns.items()}


def builtin_config(model_path: str | Path, model_type: str, march: str, input_shapes: list[tuple[str, str]], *,
                   fast_perf: bool, working_dir: Path, prefix: str, option: str = "--input-shape",
                   proto: str | Path | None = None) -> Config:
    """The config ``checker`` (``fast_perf`` False) or ``makertbin --fast-perf`` runs with.

    ``proto`` is the prototxt of a Caffe model (``model_path`` is then its caffemodel)."""
    profile = get_profile(march)  # an unknown march is one clear line, before anything is read
    path = Path(model_path).expanduser().resolve()
    if model_type == "caffe":
        if proto is None:
            raise HbError("--model-type caffe needs --proto with the prototxt file")
        from hbtools.frontends.caffe import load_caffe

        proto = Path(proto).expanduser().resolve()
        model = load_caffe(proto, path, {name: parse_shape(text, name, option) for name, text in input_shapes})
        files = {"prototxt": str(proto), "caffe_model": str(path)}
    else:
        model = load_model(path)
        files = {"onnx_model": str(path)}
    if len(model.graph.output) > MAX_OUTPUTS:
        raise HbError(f"the model has {len(model.graph.output)} outputs; at most {MAX_OUTPUTS} are supported")
    shapes = resolve_shapes(model, input_shapes, batch_one=fast_perf, option=option)
    raw: dict[str, Any] = {
        "model_parameters": {
            **files,
            "march": profile.name,
            "working_dir": str(working_dir),
            "output_model_file_prefix": prefix,
        },
        "input_parameters": _input_parameters(shapes, {o.name for o in model.graph.output},
                                              {i.name for i in model.graph.input
                                               if i.type.tensor_type.elem_type in FLOAT_TYPES}),
        # skip: max thresholds on generated data, no method search; enough to place and lower every op.
        "calibration_parameters": {"calibration_type": "skip"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3" if fast_perf else "O0",
                                "debug": fast_perf},
    }
    if fast_perf:
        raw["model_parameters"]["remove_node_type"] = "; ".join(FAST_PERF_REMOVABLE)
    config = config_from_dict(raw, model_type, Path.cwd())
    for spec in config.inputs:
        shown = "x".join(map(str, shapes[spec.name])) or "scalar"
        # a featuremap's values go in as they are, in whatever layout the model reads them: none is named
        log.info("input '%s': shape %s, treated as %s", spec.name, shown, spec.type_train if spec.type_train ==
                 "featuremap" else f"{spec.type_train} ({spec.layout_train})")
    if fast_perf:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, fast_perf=True))
    return config
