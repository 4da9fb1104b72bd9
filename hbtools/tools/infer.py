"""``hb_mapper infer``: run one float or quantized artefact on one prepared input, dump layer results.

The input file is prepared exactly like a calibration sample of the same config
(``read_sample_file``), so float and quantized artefacts see the same data.
Each layer result is written as float32 ``numpy.tofile`` data to
``${layername}_float.bin``; results of the quantized model are dequantized.
Which layers: see ``hbtools.quant.layer_dump``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from hbtools import outputs
from hbtools.config.loader import load_config
from hbtools.config.model import Config, InputSpec
from hbtools.data.calibration import read_sample_file
from hbtools.errors import HbError
from hbtools.graph.model_io import load_model
from hbtools.march.layout import permutation, to_layout
from hbtools.march.profiles import get_profile
from hbtools.ops import custom
from hbtools.pipeline.parse import load_source_model, resolve_inputs
from hbtools.pipeline.runner import artefact_paths
from hbtools.quant.layer_dump import (
    Layer,
    conv_layers,
    is_quantized,
    output_layers,
    recorded_layers,
)
from hbtools.runs.transaction import Destination, artefact_transaction
from hbtools.runtime.session import HB_ONNXRuntime

log = logging.getLogger("hbtools")
OUTPUT_DIR = Destination("--output-dir", "choose another --output-dir")


def layer_files(layers: Sequence[Layer]) -> dict[str, str]:
    """Each layer's file, ``<layer>_float.bin``: ``hrt_model_exec`` names the .bin's layers so too, and vec_diff
    pairs the files by name."""
    return outputs.file_names([layer.name for layer in layers], suffix="_float.bin", fallback="layer")


def _specs(config: Config, model: ModelProto) -> list[InputSpec]:
    """Input names and shapes: from the config, else from the float model the config names (ONNX, or Caffe's
    prototxt and caffemodel), else from ``model``; a featuremap's data type from ``model``, which the data
    goes to (token or category ids stay int64, as calibration feeds them)."""
    specs = _named_specs(config, model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    return [dataclasses.replace(s, model_dtype=np.dtype(onnx.helper.tensor_dtype_to_np_dtype(types[s.name])).name)
            if s.is_featuremap and types.get(s.name) else s for s in specs]


def _named_specs(config: Config, model: ModelProto) -> list[InputSpec]:
    if all(s.name and s.shape for s in config.inputs):
        return config.inputs
    m = config.model
    named = m.onnx_model or (m.model_type == "caffe" and m.prototxt and m.caffe_model)
    if not named:
        return resolve_inputs(model, config.inputs)
    source = load_source_model(config, purpose="Input names and shapes from the config's float")[0]
    return resolve_inputs(source, config.inputs)


def _layers(model: ModelProto, config: Config) -> list[Layer]:
    if not is_quantized(model):
        extra = conv_layers(model, config, get_profile(config.model.march), _optimized_artefact(config)) \
            if config.model.layer_out_dump else []
        return [*output_layers(model), *extra]
    recorded = recorded_layers(model)
    if recorded is None:
        if config.model.layer_out_dump:
            log.warning("the quantized model was built without layer_out_dump; only its outputs are written "
                        "(set layer_out_dump: True and run makertbin again for conv layers)")
        return output_layers(model)
    names = {o.name for o in model.graph.output}
    return recorded if config.model.layer_out_dump else [layer for layer in recorded if layer.name in names]


def _optimized_artefact(config: Config) -> ModelProto | None:
    """The config's optimized float artefact, whose conv units the quantized model's layers are (None: not made)."""
    path = artefact_paths(config)["optimized"]
    return load_model(path) if path.is_file() else None


def _arrange(data: np.ndarray, spec: InputSpec, model_shape: list[int | None], layout: str | None) -> np.ndarray:
    """The prepared sample (train layout) in the layout the model input takes."""
    if data.ndim == 4 and spec.layout_train in ("NCHW", "NHWC"):
        if layout is None:
            other = "NHWC" if spec.layout_train == "NCHW" else "NCHW"
            fits = [d is None or d == s for d, s in zip(model_shape, data.shape, strict=False)]
            moved = to_layout(list(data.shape), spec.layout_train, other)
            if not all(fits) and list(moved) == list(model_shape):
                layout = other
        if layout and layout != spec.layout_train:
            data = np.ascontiguousarray(np.transpose(data, permutation(spec.layout_train, layout)))
    if len(model_shape) != data.ndim or any(d is not None and d != s for d, s in zip(model_shape, data.shape,
                                                                                     strict=True)):
        raise HbError(f"input '{spec.name}': the prepared data has shape {list(data.shape)} but the model takes "
                      f"{['?' if d is None else d for d in model_shape]}",
                      hint="check --input-layout and the config's input_shape / input_layout_train")
    return data


def _layouts(given: list[str], names: list[str]) -> dict[str, str | None]:
    """--input-layout per input: one value for all, or one per input in the config's order."""
    if len(given) in (0, 1):
        return dict.fromkeys(names, given[0] if given else None)
    if len(given) != len(names):
        raise HbError(f"--input-layout has {len(given)} values but the config has {len(names)} inputs "
                      f"({', '.join(names)})", hint="give one layout for all inputs, or one per input in the "
                      "config's input_name order, separated by ';'")
    return dict(zip(names, given, strict=True))


def infer(config_path: str | Path, model_file: str | Path, model_type: str, images: Sequence[tuple[str, str]],
          output_dir: str | Path, input_layout: Sequence[str] | None = None) -> list[Path]:
    """Run ``model_file`` on ``images`` (input name, file) and write its layer results into ``output_dir``.

    ``input_layout``: the layout each input takes (one value: all of them), else each input's shape tells."""
    # infer reads the given files only: the calibration folders may be gone (artefacts copied elsewhere)
    config = load_config(config_path, model_type, cal_data=False)
    outputs.output_dir(output_dir, "--output-dir", create=False)  # refused before the model runs, not after
    custom.register_from_config(config.custom_op.op_register_files)  # the model may use custom CPU ops
    log.info("Using onnx model file: %s", model_file)
    model = load_model(model_file)
    specs = {s.name: s for s in _specs(config, model)}
    given = dict(images)
    twice = sorted({name for name, _ in images if [n for n, _ in images].count(name) > 1})
    if twice:
        raise HbError(f"--image-file names input '{twice[0]}' more than once",
                      hint="give one --image-file NAME FILE per input")
    for name in given:
        if name not in specs:
            raise HbError(f"--image-file names input '{name}', which is not in the config; its inputs are "
                          f"{', '.join(specs)}")
    missing = [n for n in specs if n not in given]
    if missing:
        raise HbError(f"no --image-file for input(s) {', '.join(missing)}",
                      hint="give --image-file NAME FILE per input")
    layouts = _layouts(list(input_layout or []), list(specs))
    model_inputs = {vi.name: [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                              for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    elem_types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    feeds = {}
    for name, spec in specs.items():
        if name not in model_inputs:
            raise HbError(f"input '{name}' of the config is not an input of {model_file}")
        if not spec.is_featuremap and elem_types[name] != onnx.TensorProto.INT8:
            # The user's own float model expects normalised data the config's pipeline never produces.
            raise HbError(f"input '{name}' of {model_file} does not take image data as prepared for calibration",
                          hint="run infer on a makertbin artefact (*_original_float_model.onnx ... "
                               "*_quantized_model.onnx)")
        data = read_sample_file(Path(given[name]), spec, config.calibration.preprocess_on, list(specs.values()))
        feeds[name] = _arrange(data, spec, model_inputs[name], layouts[name])
    layers = _layers(model, config)
    present = {o.name for o in model.graph.output}
    for layer in layers:
        if layer.tensor not in present:
            # Untyped output: onnxruntime infers the type, whatever the lowering made of it.
            model.graph.output.append(onnx.ValueInfoProto(name=layer.tensor))
            present.add(layer.tensor)
    session = HB_ONNXRuntime(onnx_model=model)
    tensors = list(dict.fromkeys(layer.tensor for layer in layers))
    values = dict(zip(tensors, session.run(tensors, feeds), strict=True))
    # made by the transaction, which removes the folders it made when the run fails
    out_dir = outputs.output_dir(output_dir, "--output-dir", create=False)
    # One set, as vec_diff compares it: a failed or interrupted run leaves the previous results, and results
    # of layers the last run here had and this model has not are removed (not compared as if current).
    files = layer_files(layers)
    with artefact_transaction(out_dir, set_name="infer", inputs=[Path(model_file), Path(config_path),
                                                                   *(Path(f) for _, f in images)],
                              folder=OUTPUT_DIR) as staging:
        for layer in layers:
            outputs.write_array(staging / files[layer.name], layer.to_float(values[layer.tensor]))
    written = [out_dir / file for file in files.values()]
    log.info("%d layer result(s) of %s written to %s", len(written), model_file, out_dir)
    return written
