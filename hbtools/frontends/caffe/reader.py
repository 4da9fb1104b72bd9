"""Reading a Caffe network: prototxt text, .caffemodel weights, the TEST-phase layer list."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import message, text_format

from hbtools.errors import HbError
from hbtools.frontends.caffe import proto

log = logging.getLogger("hbtools")

# Legacy ``layers { type: CONVOLUTION }`` enum names -> the type strings of ``layer``.
V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL", "CONCAT": "Concat",
    "CONVOLUTION": "Convolution", "DATA": "Data", "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "IMAGE_DATA": "ImageData", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU",
    "SIGMOID": "Sigmoid", "SILENCE": "Silence", "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH", "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold", "EUCLIDEAN_LOSS": "EuclideanLoss", "HINGE_LOSS": "HingeLoss",
}


def _file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise HbError(f"{what} '{path}' does not exist", hint="check the prototxt / caffe_model path")
    return path


# Bytes no text file holds (all control characters but tab, newline, vertical tab, form feed, return).
_BINARY_BYTES = bytes(set(range(32)) - {9, 10, 11, 12, 13})


def _has_control_bytes(data: bytes) -> bool:
    """Binary data (a protobuf holds length bytes below 32); a text file in any encoding has none."""
    return any(b in _BINARY_BYTES for b in data[:4096])


def _is_utf8_text(data: bytes) -> bool:
    head = data[:4096]
    if _has_control_bytes(head):
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3  # only a character cut at the end of the sample
    return True


_WARNED: set[tuple[str, int, str]] = set()  # (prototxt, its modification time, the warning) given


def warn_once(prototxt: Path, message: str, *args: object) -> None:
    """A WARNING about ``prototxt``, once per process and version of the file: the checker reads a network twice
    (for its input shapes, then in the parse stage)."""
    text = message % args
    stamp = (str(prototxt.resolve()), prototxt.stat().st_mtime_ns, text)
    if stamp not in _WARNED:
        _WARNED.add(stamp)
        log.warning("%s", text)


def read_prototxt(path: str | Path) -> Any:
    """The NetParameter of a prototxt. Fields hbtools does not know (those of other
    Caffe branches) are skipped with a warning; their layers are then reported as
    unsupported unless the skipped field was only a training detail."""
    path = _file(path, "prototxt")
    data = path.read_bytes()
    if _has_control_bytes(data):
        raise HbError(f"prototxt '{path}' is a binary file, not the text network description",
                      hint="prototxt is the text .prototxt and caffe_model the binary .caffemodel; check that the "
                           "two are not swapped")
    # utf-8-sig: a prototxt saved by a Windows editor starts with a byte order mark.
    text = data.decode("utf-8-sig", errors="replace")
    net = proto.NetParameter()
    try:
        text_format.Parse(text, net)
    except text_format.ParseError as exc:
        if "has no field named" not in str(exc):
            raise HbError(f"'{path}' is not a valid Caffe prototxt: {exc}") from exc
        warn_once(path, "prototxt %s: %s (skipped; only Caffe 1.0 parameters are read, see docs/caffe.md)", path, exc)
        net = proto.NetParameter()
        try:
            text_format.Parse(text, net, allow_unknown_field=True)
        except text_format.ParseError as again:
            raise HbError(f"'{path}' is not a valid Caffe prototxt: {again}") from again
    if net.layer and net.layers:
        raise HbError(f"'{path}' mixes 'layer' and legacy 'layers' entries; use one form")
    if not net.layer and not net.layers:
        raise HbError(f"'{path}' has no layers; is it a Caffe network prototxt?")
    return net


def read_weights(path: str | Path) -> dict[str, list[np.ndarray]]:
    """Layer name -> its blobs (float32 arrays in their stored shapes)."""
    path = _file(path, "caffe_model")
    data = path.read_bytes()
    if data and _is_utf8_text(data):
        raise HbError(f"caffe_model '{path}' is a text file, not the binary weights of a trained network",
                      hint="caffe_model is the binary .caffemodel and prototxt the text .prototxt; check that the "
                           "two are not swapped")
    try:
        net = proto.WeightsNet.FromString(data)
    except message.DecodeError as exc:
        raise HbError(f"caffe_model '{path}' ({len(data)} bytes) cannot be read as a .caffemodel: {exc}",
                      hint="the file is damaged or incomplete (an interrupted download or copy?); save or "
                           "download it again") from exc
    if not net.layer and not net.layers:
        raise HbError(f"caffe_model '{path}' ({len(data)} bytes) holds no layers",
                      hint="a .caffemodel saved by Caffe lists every layer of the network; save or download it again")
    del data  # the parsed message holds the blobs: the file's bytes would be a second copy of every weight
    weights = {}
    for layer in [*net.layer, *net.layers]:
        if layer.blobs:
            weights[layer.name] = [_blob_array(b, layer.name, path) for b in layer.blobs]
    return weights


# OpenCV's caffe.proto stores a blob as ``raw_data`` of a ``raw_data_type`` (its enum Type: DOUBLE 0, FLOAT 1,
# FLOAT16 2, INT 3, UINT 4): cv2.dnn.shrinkCaffeModel writes float16 weights so (HyperLPR ships such models).
RAW_DATA_TYPES = {0: "<f8", 1: "<f4", 2: "<f2", 3: "<i4", 4: "<u4"}


def _blob_array(blob: Any, layer: str, path: Path) -> np.ndarray:
    if blob.HasField("shape"):
        shape = [int(d) for d in blob.shape.dim]
    else:  # the 4-D fields of old models
        shape = [int(blob.num), int(blob.channels), int(blob.height), int(blob.width)]
    if blob.HasField("raw_data"):
        if blob.raw_data_type not in RAW_DATA_TYPES:
            raise HbError(f"'{path}': a blob of layer '{layer}' stores its values as raw data of type "
                          f"{blob.raw_data_type}, which hbtools does not read (float16, float32, float64, int32 and "
                          f"uint32 it does)", hint="save the caffemodel with float32 weights")
        values = np.frombuffer(blob.raw_data, dtype=RAW_DATA_TYPES[blob.raw_data_type])
    elif blob.data:
        values = np.frombuffer(b"".join(blob.data), dtype="<f4")
    elif blob.double_data:
        values = np.frombuffer(b"".join(blob.double_data), dtype="<f8")
    else:
        # Data written without packing arrives as unknown fields here: read the full message.
        full = proto.BlobProto.FromString(blob.SerializeToString())
        values = np.asarray(full.data or full.double_data, dtype=np.float64)
    count = int(np.prod(shape)) if shape else 1
    if values.size != count:
        raise HbError(f"'{path}': a blob of layer '{layer}' has shape {shape} but {values.size} values")
    bad = int(np.count_nonzero(~np.isfinite(values)))
    if bad:
        # The run goes on (the model is the user's), but every output it touches will be NaN/inf.
        log.warning("caffe_model %s: a blob of layer '%s' holds %d NaN/inf value(s) of %d; outputs computed "
                    "from it will not be finite (was the network saved after training diverged?)",
                    path, layer, bad, values.size)
    return values.astype(np.float32, copy=False).reshape(shape)  # float32 blobs stay a view of their bytes


def _rule_matches(rule: Any, state: Any) -> bool:
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    return all(s in stages for s in rule.stage) and not any(s in stages for s in rule.not_stage)


def _included(layer: Any, state: Any) -> bool:
    # Caffe's NetState filtering: include rules (any matches) or exclude rules (none matches).
    if layer.include:
        return any(_rule_matches(r, state) for r in layer.include)
    return not any(_rule_matches(r, state) for r in layer.exclude)


def _upgrade_v1(old: Any) -> Any:
    layer = proto.LayerParameter(name=old.name, bottom=old.bottom, top=old.top)
    layer.include.extend(old.include)
    layer.exclude.extend(old.exclude)
    enum_name = type(old).DESCRIPTOR.enum_types_by_name["LayerType"].values_by_number[old.type].name
    layer.type = V1_TYPES.get(enum_name, enum_name)
    known = layer.DESCRIPTOR.fields_by_name
    for fd, value in old.ListFields():
        if fd.name.endswith("_param") and fd.name in known:
            getattr(layer, fd.name).CopyFrom(value)
    return layer


def deploy_layers(net: Any) -> list[Any]:
    """The layers a deploy (TEST-phase) network runs, legacy entries upgraded."""
    state = net.state if net.HasField("state") else proto.NetParameter().state
    layers = list(net.layer) if net.layer else [_upgrade_v1(v1) for v1 in net.layers]
    kept = []
    for layer in layers:
        if _included(layer, state):
            kept.append(layer)
        else:
            log.info("caffe layer '%s' (%s) is not part of the TEST phase; left out", layer.name, layer.type)
    return kept
