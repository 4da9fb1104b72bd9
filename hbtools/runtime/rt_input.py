"""``input_type_rt`` data -> the model's input tensor, as the device's input path does it.

Runtime data per type (``N`` = batch, ``H``/``W`` of the model input):
- nv12: uint8, per frame the ``H x W`` Y plane then ``H/2`` rows of interleaved U, V
  (``N * H * W * 3 / 2`` bytes); chroma is upsampled to yuv444.
- yuv444, rgb, bgr, gray: uint8 in the model input's layout and shape.
- featuremap: the model input's dtype and shape (float32 unless a Quantize was removed).
Image data then becomes the intermediate int8 (``uint8 - 128``); the colour
conversion and normalisation are in the graph (the preprocess convolution).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from hbtools.data import colour
from hbtools.data.intermediate import from_channels_last
from hbtools.data.npy import first_inexact_in_float, float32_overflow, integers_fit, load_npy, nan_warning
from hbtools.errors import HbError, ResourceError
from hbtools.graph.graph import GraphView
from hbtools.runtime.runtime_model import InputDesc, RuntimeModel

log = logging.getLogger(__name__)


def rt_dtype(desc: InputDesc) -> np.dtype:
    return np.dtype(np.uint8) if desc.is_image else desc.dtype


def rt_shape(desc: InputDesc) -> tuple[int, ...]:
    """Shape of one input's runtime data (nv12: ``N, H * 3 / 2, W``)."""
    if desc.type_rt != "nv12":
        return desc.shape
    h, w = desc.hw
    return (desc.shape[0], h * 3 // 2, w)


def to_model_input(desc: InputDesc, data: np.ndarray) -> np.ndarray:
    """Check one input's runtime data and convert it to the model input tensor."""
    data = np.asarray(data)
    if not data.dtype.isnative:  # a big-endian file ('>f4'): the same values in the machine's order
        data = data.astype(data.dtype.newbyteorder("="))
    want_dtype, want_shape = rt_dtype(desc), rt_shape(desc)
    if data.dtype != want_dtype and not desc.is_image and integers_fit(data, want_dtype):
        data = data.astype(want_dtype)  # indices in another integer type, as HB_ONNXRuntime takes them
    if want_dtype == np.float32 and not desc.is_image and data.dtype in (np.float64, np.float16):
        if overflow := float32_overflow(data):
            raise HbError(f"input '{desc.name}' takes float32 data, and {overflow} of the float64 values given are "
                          f"beyond float32's range (±{np.finfo(np.float32).max:.4g}): check the data's scale")
        data = data.astype(np.float32)  # numpy's default float64 (np.save of a float array), as HB_ONNXRuntime takes
    if want_dtype.kind == "f" and not desc.is_image and (data.dtype == np.bool_ or data.dtype.kind in "iu"):
        # a 0/1 mask or a count saved as bool / int64, as HB_ONNXRuntime takes it: only where no value changes
        inexact = first_inexact_in_float(data, want_dtype)
        if inexact is not None:
            raise HbError(f"input '{desc.name}' ({desc.type_rt}) takes {want_dtype} data, which does not hold the "
                          f"{data.dtype} value {inexact} exactly: save the data as {want_dtype} if rounding is meant")
        data = data.astype(want_dtype)
    if data.dtype != want_dtype:
        shifted = ("; int8 data is the calibrated model's own input (pixel - 128, as the calibration_data dump "
                   "holds it)") if desc.is_image and data.dtype == np.int8 else ""
        raise HbError(f"input '{desc.name}' ({desc.type_rt}) takes {want_dtype} data, got {data.dtype}{shifted}"
                      f"{_image_hint(desc)}")
    if data.size != int(np.prod(want_shape)):
        raise HbError(f"input '{desc.name}' ({desc.type_rt}) takes {int(np.prod(want_shape))} values "
                      f"(shape {list(want_shape)}), got {data.size} (shape {list(data.shape)})"
                      f"{_frames_hint(desc, data.shape) or _image_hint(desc)}")
    data = data.reshape(want_shape)
    if warning := nan_warning(desc.name, data):
        log.warning(warning)
    if not desc.is_image:
        return np.require(data, requirements="C")  # keeps a scalar 0-d (ascontiguousarray makes it [1])
    if desc.type_rt == "nv12":
        data = from_channels_last(colour.nv12_decode(data), desc.layout)
    return np.ascontiguousarray((data.astype(np.int16) - 128).astype(np.int8))


# op -> its input that holds indices into its first input, along the ``axis`` attribute
INDEX_OPERANDS = {"Gather": 1, "GatherElements": 1}
# ops that pass an integer input on as it is, only shaped or typed differently
PASS_ON = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}


def random_rt_inputs(rm: RuntimeModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random runtime data for every input of ``rm`` (see ``random_rt_input``)."""
    view = GraphView(rm.graph)
    return {d.name: random_rt_input(d, rng, index_bound=index_bound(view, d.name)) for d in rm.inputs}


def index_bound(view: GraphView, name: str) -> int | None:
    """The size of the smallest table that input ``name`` indexes (a class id into an embedding: Gather), if
    it indexes any: random indices must fall within it, or the model stops with 'out of data bounds'."""
    graph = view.graph
    # Declared sizes only: shape inference over a whole model is not worth it for a random input.
    dims = {t.name: list(t.dims) for t in graph.initializer}
    dims.update((vi.name, [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim])
                for vi in [*graph.value_info, *graph.input] if vi.type.tensor_type.HasField("shape"))
    bounds = []
    todo, seen = [name], set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in view.consumers.get(tensor, []):
            if node.op_type in PASS_ON and node.input[0] == tensor:
                todo.append(node.output[0])
            elif node.op_type in INDEX_OPERANDS and node.input[INDEX_OPERANDS[node.op_type]] == tensor:
                table = dims.get(node.input[0])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if table and -len(table) <= axis < len(table) and table[axis] > 0:
                    bounds.append(table[axis])
    return min(bounds) if bounds else None


def random_rt_input(desc: InputDesc, rng: np.random.Generator, *, index_bound: int | None = None) -> np.ndarray:
    """Random runtime data: uniform bytes for images, standard normal featuremaps.

    An integer input takes indices below ``index_bound`` where it indexes a table; else a 32- or 64-bit one
    takes ones (as calibration_type skip does: it is a size, a shape or an index, and one fits all three),
    an 8- or 16-bit one (quantized data, its Quantize removed) values over its range."""
    shape = rt_shape(desc)
    if desc.is_image:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if np.issubdtype(desc.dtype, np.integer):
        if index_bound is not None:
            return rng.integers(0, index_bound, size=shape).astype(desc.dtype)
        if desc.dtype.itemsize >= 4:
            return np.ones(shape, dtype=desc.dtype)
        info = np.iinfo(desc.dtype)
        return rng.integers(max(info.min, -127), min(info.max, 127) + 1, size=shape).astype(desc.dtype)
    return rng.standard_normal(shape).astype(desc.dtype)


def load_rt_file(desc: InputDesc, path: str | Path) -> np.ndarray:
    """Runtime data from a file: ``.npy``, an image (converted to ``type_rt``), or raw bytes."""
    from hbtools.data.images import IMAGE_EXTENSIONS  # the picture reader (and skimage) only when needed

    path = Path(path)
    if path.is_dir():
        raise ResourceError(f"input file '{path}' is a folder; give one file per input (.npy, a picture or raw "
                            "bytes)")
    if not path.is_file():
        raise HbError(f"input file '{path}' does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            data = load_npy(path)
        except (ValueError, OSError) as e:
            raise HbError(f"'{path}' is not a readable .npy file: {e}") from None
        _check_npy_shape(desc, path, data.shape)
        return data
    if suffix in IMAGE_EXTENSIONS:
        return image_to_rt(desc, path)
    raw = np.fromfile(path, dtype=rt_dtype(desc))
    expected = int(np.prod(rt_shape(desc)))
    if raw.size != expected:
        batch = desc.raw.get("batch")
        frames = ""
        if isinstance(batch, int) and batch > 1 and raw.size * batch == expected:  # one frame of a batch-N model
            picture = " (or give a picture, used for every frame)" if desc.is_image else ""
            frames = (f"; the model takes {batch} frames at once (input_batch {batch}), so the file must hold all "
                      f"{batch}, one after another{picture}")
        raise HbError(f"'{path}' holds {raw.size} {rt_dtype(desc)} values; input '{desc.name}' "
                      f"({desc.type_rt}) takes {expected} ({expected * rt_dtype(desc).itemsize} bytes)"
                      f"{frames or _image_hint(desc)}")
    return raw.reshape(rt_shape(desc))


def _image_hint(desc: InputDesc) -> str:
    """How to give an image input its runtime data (nv12 is two planes, which no picture file holds)."""
    if desc.type_rt == "nv12":
        h, w = desc.hw
        return (f"; nv12 data is the Y plane ({h}x{w} bytes) followed by the interleaved UV plane "
                f"({h // 2}x{w} bytes): give a picture file (.jpg, .png, ...), which is converted to nv12, or "
                f"such bytes")
    if desc.is_image:
        return f"; give a picture file (.jpg, .png, ...) or {desc.type_rt} pixels 0..255 as uint8"
    return ""


def _batch_of(desc: InputDesc) -> int:
    """The frames a run of the ``.bin`` takes at once (``input_batch``), 1 without one."""
    batch = desc.raw.get("batch")
    return batch if isinstance(batch, int) and batch > 1 else 1


def _frames_hint(desc: InputDesc, shape: tuple[int, ...]) -> str:
    """What to say of an array holding one frame for an ``input_batch`` N model (N > 1), else ''. One frame
    of the right size got the plain shape error, which does not say that the model takes N of them."""
    batch, want = _batch_of(desc), rt_shape(desc)
    if batch == 1 or math.prod(shape) * batch != math.prod(want):
        return ""
    if len(shape) == len(want) - 1:  # a frame without the batch axis
        how = f"numpy.stack of {batch} such frames, or numpy.repeat(a[None], {batch}, axis=0) to use this one for all"
    else:
        how = (f"numpy.concatenate of {batch} arrays like this one, or numpy.repeat(a, {batch}, axis=0) to use this "
               "one for all")
    picture = "; or give a picture, used for every frame" if desc.is_image else ""
    return (f"; the model takes {batch} frames at once (input_batch {batch}): give an array of shape "
            f"{tuple(want)} with the {batch} frames along the first axis ({how}){picture}")


def _check_npy_shape(desc: InputDesc, path: Path, shape: tuple[int, ...]) -> None:
    """A .npy carries its shape, so it must be the input's: the element count alone takes NCHW data for an
    NHWC input (an RDK X3 .bin takes NHWC whatever input_layout_rt says) and runs on scrambled pixels.
    nv12 is a byte buffer of two planes with no array shape of its own: its size is checked later."""
    want = rt_shape(desc)
    if desc.type_rt == "nv12" or tuple(shape) == tuple(want):
        return
    layout = f" {desc.layout}" if len(want) == 4 and desc.layout in ("NCHW", "NHWC") else ""
    hint = ""
    if layout:
        other, perm = ("NHWC", (0, 2, 3, 1)) if desc.layout == "NCHW" else ("NCHW", (0, 3, 1, 2))
        back = (0, 3, 1, 2) if desc.layout == "NCHW" else (0, 2, 3, 1)
        # one frame of a batch-N model in the other layout: both hints
        frame = (want[0], *shape[1:]) if len(shape) == 4 and shape[0] * _batch_of(desc) == want[0] else shape
        if tuple(frame) == tuple(want[k] for k in perm):
            hint = (f"; it looks like the same data in {other}: transpose it to {desc.layout} "
                    f"(np.transpose(a, {back}))")
    raise HbError(f"'{path}' holds an array of shape {tuple(shape)}; input '{desc.name}' ({desc.type_rt}) takes "
                  f"shape {tuple(want)}{layout}{hint}{_frames_hint(desc, shape)}")


def image_to_rt(desc: InputDesc, path: Path) -> np.ndarray:
    """An image file resized to the input and converted to its runtime type, one copy per batch item."""
    import skimage.transform

    from hbtools.data.images import read_rgb_or_gray

    if not desc.is_image:
        raise HbError(f"input '{desc.name}' is a featuremap; give a .npy or raw .bin file, not an image")
    img = read_rgb_or_gray(Path(path), "image")
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    rgb = skimage.transform.resize(img[..., :3].astype(np.float64), desc.hw, preserve_range=True)
    frame = _rgb_to_rt(rgb, desc)
    batch = _batch_of(desc)
    if batch > 1:  # not an error, but the user may have meant different frames
        log.info("input '%s' takes %d frames at once (input_batch %d): picture %s is used for every frame; for "
                 "different frames give a .npy of shape %s", desc.name, batch, batch, path, tuple(rt_shape(desc)))
    return np.repeat(frame[None], desc.shape[0], axis=0).reshape(rt_shape(desc))


def _rgb_to_rt(rgb: np.ndarray, desc: InputDesc) -> np.ndarray:
    if desc.type_rt == "nv12":
        return colour.rgb_to_nv12(rgb, desc.space_and_range)
    if desc.type_rt == "gray":
        pixels = colour.rgb_to_gray(rgb)
    elif desc.type_rt == "yuv444":
        pixels = colour.rgb_to_yuv444(rgb, desc.space_and_range)
    else:
        pixels = colour.convert(rgb, "rgb", desc.type_rt)
    return from_channels_last(colour.round_to_uint8(pixels)[None], desc.layout)[0]
