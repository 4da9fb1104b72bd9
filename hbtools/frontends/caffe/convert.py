"""Caffe network (prototxt + caffemodel) -> ONNX ModelProto."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from hbtools.errors import HbError
from hbtools.frontends.caffe import layers_compute, layers_shape, layers_ssd
from hbtools.frontends.caffe.builder import Layer, Net
from hbtools.frontends.caffe.reader import deploy_layers, read_prototxt, read_weights, warn_once

log = logging.getLogger("hbtools")

CONVERTERS = {**layers_compute.CONVERTERS, **layers_shape.CONVERTERS, **layers_ssd.CONVERTERS}
# Layers whose first top is a network input; any other top (labels) is left out.
INPUT_LAYERS = ("Input", "Data", "ImageData", "MemoryData", "HDF5Data", "DummyData", "WindowData",
                "AnnotatedData")
SUPPORTED_TYPES = tuple(sorted({*CONVERTERS, *INPUT_LAYERS, *layers_ssd.CUT_LAYERS}))
# Layers of Caffe forks that a near-miss type name or "remove it" would send the wrong way.
FORK_HINTS = {
    "BN": "this is the BN layer of the SegNet / PSPNet forks (scale * (x - mean) / sqrt(var + eps) + shift), "
          "not part of Caffe 1.0; write it as a BatchNorm layer (its mean and variance, scale factor 1) followed "
          "by a Scale layer with bias_term: true (its scale and shift)",
    "DenseImageData": "a data layer that reads training files; replace it by an Input layer with the input's "
                      "shape (input_param { shape { dim: 1 dim: 3 dim: H dim: W } })",
}

Shapes = Mapping[str | None, Sequence[int]]


def _layer_input_shapes(layer: Any) -> list[tuple[str, list[int] | None]]:
    tops = list(layer.top) if layer.type == "Input" else list(layer.top[:1])
    if layer.type == "Input":
        shapes = [[int(d) for d in s.dim] for s in layer.input_param.shape]
        if len(shapes) not in (0, 1, len(tops)):
            raise HbError(f"caffe layer '{layer.name}' (Input): {len(shapes)} shapes for {len(tops)} tops")
        shapes = shapes * len(tops) if len(shapes) == 1 else shapes or [None] * len(tops)
        return list(zip(tops, shapes, strict=True))
    shape = None
    if layer.type == "MemoryData":
        m = layer.memory_data_param
        shape = [int(m.batch_size), int(m.channels), int(m.height), int(m.width)]
    elif layer.type == "DummyData":
        d = layer.dummy_data_param
        if d.shape:
            shape = [int(v) for v in d.shape[0].dim]
        elif d.num:
            shape = [int(d.num[0]), int(d.channels[0]), int(d.height[0]), int(d.width[0])]
    return [(tops[0], shape)] if tops else []


def _declared_inputs(net: Any, layers: list[Any]) -> list[tuple[str, list[int] | None, str]]:
    """(blob, shape or None, where it is declared) for every network input, in order."""
    found = []
    names = list(net.input)
    for k, blob in enumerate(names):
        if len(net.input_shape) == len(names):
            shape = [int(d) for d in net.input_shape[k].dim]
        elif len(net.input_dim) == 4 * len(names):
            shape = [int(d) for d in net.input_dim[4 * k:4 * k + 4]]
        elif net.input_dim:  # Caffe refuses the net too
            raise HbError(f"the net's input_dim gives {len(net.input_dim)} values for {len(names)} input(s); Caffe "
                          "takes four per input (N, C, H, W)",
                          hint="give each input four input_dim values, or an input_shape { dim: ... } of its own")
        else:
            shape = None
        found.append((blob, shape, "the net's 'input'"))
    for layer in layers:
        if layer.type in INPUT_LAYERS:
            found += [(blob, shape, f"layer '{layer.name}' ({layer.type})")
                      for blob, shape in _layer_input_shapes(layer)]
    return found


def _input_shape(blob: str, declared: list[int] | None, where: str, given: Sequence[int] | None) -> list[int]:
    if given is not None:
        given = [int(d) for d in given]
        if declared and declared != given:
            log.info("caffe input '%s': input_shape %s replaces the prototxt's %s", blob, given, declared)
        return given
    if not declared:
        raise HbError(f"caffe input '{blob}' ({where}) has no shape in the prototxt",
                      hint=f"give one with input_shape in input_parameters, or --input-shape {blob} 1x3x224x224")
    return declared


def check_layer_types(layers: list[Any]) -> None:
    """The first layer hbtools cannot convert stops the run, in the vendor tool's words."""
    cut: dict[str, str] = {}  # top of a layer the network ends before -> that layer
    for layer in layers:
        read = next((b for b in layer.bottom if b in cut), None)
        if read is not None:
            raise HbError(f"caffe layer '{layer.name}' (type {layer.type}) reads '{read}', the output of "
                          f"{cut[read]}, which the conversion ends before",
                          hint="the network's outputs are the layer's bottoms; move what follows it to the host")
        if layer.type in layers_ssd.CUT_LAYERS:
            cut.update((t, f"layer '{layer.name}' ({layer.type})") for t in layer.top)
            continue
        if layer.type not in CONVERTERS and layer.type not in INPUT_LAYERS:
            # Type names are case-sensitive in Caffe: a near miss is most likely a typo.
            close = difflib.get_close_matches(layer.type, SUPPORTED_TYPES, n=1, cutoff=0.75)
            close = close or [t for t in SUPPORTED_TYPES if t.lower() == layer.type.lower()]
            hint = FORK_HINTS.get(layer.type) or (
                f"did you mean type \"{close[0]}\"? (layer types are spelled exactly, case included)" if close
                else "remove it from the deploy prototxt (training-only layers such as Accuracy or losses can be "
                     "kept out with include { phase: TRAIN }); docs/caffe.md lists the supported layers")
            raise HbError(f"ValueError: Not support layer name={layer.name} type={layer.type}", hint=hint)


def caffe_to_onnx(prototxt: str | Path, caffe_model: str | Path, input_shapes: Shapes | None = None
                  ) -> onnx.ModelProto:
    """Convert a Caffe 1.0 deploy network to an ONNX model (opset 13, static shapes).

    ``input_shapes`` (input name -> shape; the key None names the only input) replaces
    or supplies the input shapes the prototxt declares.
    """
    net_param = read_prototxt(prototxt)
    layers = deploy_layers(net_param)
    check_layer_types(layers)
    weights = read_weights(caffe_model)
    blob_names = {b for layer in layers for b in [*layer.bottom, *layer.top]} | set(net_param.input)
    net = Net(net_param.name, blob_names)
    declared = _declared_inputs(net_param, layers)
    given = dict(input_shapes or {})
    if None in given and len(declared) == 1:
        given.setdefault(declared[0][0], given[None])
    changed = []
    for blob, shape, where in declared:
        used = _input_shape(blob, shape, where, given.get(blob))
        if shape and shape != used:
            changed.append(f"'{blob}' {'x'.join(map(str, used))} (the prototxt says {'x'.join(map(str, shape))})")
        net.add_input(blob, used)
    cut = []
    for param in layers:
        if param.type in INPUT_LAYERS:
            continue
        if param.type in layers_ssd.CUT_LAYERS:
            inputs = {vi.name for vi in net.inputs}
            kept = [b for b in param.bottom if b in net.blobs and net.blobs[b] not in inputs]  # an input is no output
            warn_once(Path(prototxt), "caffe layer '%s' (%s: %s) is left out: the network ends before it, and its "
                      "bottoms %s are the outputs; decode and filter on the host", param.name, param.type,
                      layers_ssd.CUT_LAYERS[param.type], ", ".join(f"'{b}'" for b in kept))
            cut.append(kept)
            continue
        layer = Layer(net, param, weights.get(param.name))
        try:
            CONVERTERS[param.type](layer)
            net.commit(layer)
        except HbError as exc:
            if changed:
                # Weights sized for the declared shape are the usual reason a layer no longer fits.
                exc.hint = (f"input_shape sets {', '.join(changed)}; the network's weights may only fit the "
                            "shape it was trained with" + (f". Otherwise: {exc.hint}" if exc.hint else ""))
            raise
    for bottoms in cut:  # the outputs in its own order, as the host-side decoding reads them, read elsewhere or not
        for blob in bottoms:
            net.available.pop(blob, None)
            net.available[blob] = None
    model = net.model()
    log.debug("caffe model converted to ONNX: %d layers -> %d nodes, inputs %s, outputs %s", len(layers),
             len(model.graph.node), [i.name for i in model.graph.input], [o.name for o in model.graph.output])
    return model
