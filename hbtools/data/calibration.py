"""Calibration samples, streamed one at a time in the intermediate type (SPEC §5).

A source yields ``{input_name: array}`` dicts that can be fed straight to the
original/optimized/calibrated ONNX artefacts. Nothing is kept between samples,
so memory does not grow with the size of the calibration set.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from hbtools.config.model import InputSpec
from hbtools.config.schema import CAL_DATA_TYPES
from hbtools.data.folders import sample_files
from hbtools.data.images import IMAGE_EXTENSIONS, load_images
from hbtools.data.intermediate import to_intermediate
from hbtools.data.npy import load_npy
from hbtools.errors import HbError, os_error
from hbtools.log import logger
from hbtools.outputs import file_names, replace_atomically


class CalibrationSource:
    """Common interface: ``names``, ``len()`` and iteration over sample dicts."""

    def __init__(self, specs: Sequence[InputSpec]) -> None:
        for s in specs:
            if s.name is None or s.shape is None:
                raise ValueError("calibration needs resolved input specs (name and shape)")
        self.specs = list(specs)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        raise NotImplementedError

    def picked(self, indices: set[int]) -> list[dict[str, np.ndarray]]:
        """The samples at ``indices``, in order."""
        return [sample for index, sample in enumerate(self) if index in indices]


def raw_dtype(spec: InputSpec, path: Path | None = None) -> np.dtype:
    """The element type of the raw calibration file ``path`` (or of the files in general) of one input."""
    if spec.cal_data_type:
        return np.dtype(spec.cal_data_type)
    # Featuremaps are documented as float32 tofile dumps whatever the folder name; the vendor's docs mark
    # float32 files by a folder name or a file extension ending in _f32.
    if spec.is_featuremap or Path(spec.cal_data_dir or "").name.endswith("_f32") or \
            (path is not None and path.suffix.endswith("_f32")):
        return np.dtype(np.float32)
    return np.dtype(np.uint8)


def _listing(spec: InputSpec) -> list[Path]:
    folder = spec.cal_data_dir
    if folder is None:
        raise HbError(f"input '{spec.name}': cal_data_dir is not set")
    folder = Path(folder)
    if not folder.is_dir():
        raise HbError(f"calibration data folder {folder} for input '{spec.name}' does not exist")
    files = sample_files(folder)
    broken = [p for p in files if p.is_symlink() and not p.exists()]
    if broken:
        raise HbError(f"calibration file {broken[0]} for input '{spec.name}' is a broken symbolic link "
                      f"(it points to {broken[0].readlink()}, which does not exist); fix or remove it")
    if not files:
        raise HbError(f"calibration data folder {folder} for input '{spec.name}' is empty")
    return files


def _check_npy_order(path: Path, shape: list[int], spec: InputSpec, what: str) -> None:
    """A .npy file's shape holds the input's dimensions in another order (an HWC picture saved for a CHW
    input): read in the input's order its values would be scrambled, so it is refused. A shape with or
    without the size-1 axes (a sample without its batch), or flat, is read as it is."""
    got, want = [d for d in shape if d != 1], [int(d) for d in spec.shape if d != 1]
    if got == want or sorted(got) != sorted(want):
        return
    hint = f"save it in the order {list(spec.shape)}"
    batch = (0,) if len(shape) == 4 else ()  # the file's own batch axis stays first
    last, first = (tuple(b + len(batch) for b in (2, 0, 1)), tuple(b + len(batch) for b in (1, 2, 0)))
    if len(want) == 3 and got == [*want[1:], want[0]]:
        hint += f" (an HWC picture: numpy.transpose(x, {batch + last}))"
    elif len(want) == 3 and want == [*got[1:], got[0]]:
        hint += f" (a CHW sample for an NHWC input: numpy.transpose(x, {batch + first}))"
    raise HbError(f"{what} {path} holds {list(shape)}, the dimensions of input '{spec.name}' ({list(spec.shape)}) "
                  f"in another order: its values would be read scrambled", hint=hint)


def _inputs_it_fits(spec: InputSpec, others: Sequence[InputSpec], *, values: int | None = None,
                    nbytes: int | None = None) -> list[str]:
    """The other inputs whose data a file of ``values`` numbers (a .npy file) or of ``nbytes`` bytes (a raw
    file, in that input's own file type) would be: a two-input model's folders or files given in the wrong
    order, or one given twice."""
    return [o.name for o in others if o.name != spec.name and o.shape is not None
            and (values is None or math.prod(o.shape) == values)
            and (nbytes is None or math.prod(o.shape) * raw_dtype(o).itemsize == nbytes)]


def _other_input_error(what: str, path: Path, found: str, expected: str, spec: InputSpec, fitting: list[str],
                       others: Sequence[InputSpec], also: str = "", *, raw: bool) -> HbError:
    """The error for a file that holds another input's data: where the folders or files of the inputs are
    given, not input_shape, is what to check. ``raw``: a raw file, whose size fits the other input's shape in
    that input's own file type (a .npy file's count fits the shape alone)."""
    names = " or ".join(f"'{n}'" for n in fitting)
    shapes = " / ".join("x".join(map(str, o.shape)) + (f" {raw_dtype(o).name}" if raw else "")
                        for o in others if o.name in fitting)
    if what == "calibration file":
        order = ";".join(o.name for o in others)
        hint = (f"the folder {path.parent} looks like the data of input {names}: cal_data_dir lists one folder per "
                f"input, in the order of input_name ({order})")
    else:
        hint = f"the file looks like the data of input {names}: give each --image-file NAME FILE the file of that input"
    return HbError(f"{what} {path} {found}, expected {expected} for input '{spec.name}'; that is the size of input "
                   f"{names} ({shapes}){also}", hint=hint)


def _check_raw(path: Path, spec: InputSpec, what: str = "calibration file",
               others: Sequence[InputSpec] = ()) -> None:
    """``what``: how the message names the file (``hb_mapper infer`` checks its --image-file here too);
    ``others``: every input of the model, so a file of another input's size is said to be that input's data."""
    count = math.prod(spec.shape)
    if path.suffix.lower() == ".npy":
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            except (ValueError, EOFError) as e:  # a damaged or cut header
                raise HbError(f"{what} {path} is not a valid .npy file: {e}",
                              hint=f"write it again with numpy.save (an array of shape {spec.shape})") from e
        if math.prod(shape) != count and (fitting := _inputs_it_fits(spec, others, values=math.prod(shape))):
            raise _other_input_error(what, path, f"holds {dtype} {list(shape)}",
                                     f"{count} numbers (shape {spec.shape})", spec, fitting, others, raw=False)
        if math.prod(shape) != count or dtype.kind not in "biuf":
            raise HbError(
                f"{what} {path} holds {dtype} {list(shape)}, "
                f"expected {count} numbers (shape {spec.shape}) for input '{spec.name}'"
            )
        _check_npy_order(path, list(shape), spec, what)
        return
    dtype = raw_dtype(spec, path)
    expected = count * dtype.itemsize
    size = path.stat().st_size
    batch = int(spec.shape[0]) if spec.shape else 1
    if size != expected and batch > 1 and size * batch == expected:
        one = "x".join(str(d) for d in [1, *spec.shape[1:]])
        raise HbError(
            f"calibration file {path} holds one sample ({size} bytes) but input '{spec.name}' has batch {batch} "
            f"(shape {spec.shape}, dtype {dtype}: {expected} bytes)",
            hint=f"the model declares batch {batch}; set input_shape: '{one}' "
            f"in input_parameters to convert for one sample, or write {batch} samples per file")
    if size != expected:
        picture = path.suffix.lower() in IMAGE_EXTENSIONS
        # The commonest cause is the data type: say which one the size fits, if one does.
        # The model input's own type first: an int64 featuremap's files are int64, not float64.
        fits = [t for t in dict.fromkeys((spec.model_dtype, "uint8", "float32", "int16", "float64"))
                if t in CAL_DATA_TYPES and t != dtype.name and size == count * np.dtype(t).itemsize]
        fitting = [] if picture else _inputs_it_fits(spec, others, nbytes=size)
        if fitting:  # another input's data, unless (also said) the files are this input's in another type
            also = f" (or this input's in {fits[0]}: cal_data_type)" if fits else ""
            raise _other_input_error(what, path, f"has {size} bytes",
                                     f"{expected} bytes (shape {spec.shape}, dtype {dtype})", spec, fitting, others,
                                     also, raw=True)
        shape = None if fits or picture or size % dtype.itemsize else _other_shape(size // dtype.itemsize, spec)
        if shape is not None:  # the data type fits; the files hold another shape than input_shape says
            raise HbError(
                f"{what} {path} has {size} bytes, expected {expected} bytes (shape {spec.shape}, dtype {dtype}) "
                f"for input '{spec.name}'; its size fits a {shape} {dtype} tensor",
                hint=f"the files were written for another input_shape than {'x'.join(map(str, spec.shape))}: write "
                     f"them at that shape, or set input_shape to the one they were made for")
        raise HbError(
            f"{what} {path} has {size} bytes, expected {expected} bytes "
            f"(shape {spec.shape}, dtype {dtype}) for input '{spec.name}'"
            + (": it is a picture, and calibration files are raw tensors" if picture else "")
            + (f"; its size fits dtype {fits[0]} (cal_data_type: {fits[0]})" if fits and not picture else ""),
            hint="set preprocess_on: True in calibration_parameters to read pictures (resized to the input "
            "shape), or convert them to raw tensors first" if picture else
            "Set cal_data_type (or end the folder name with _f32 for float32 data) to match how the files "
            "were written, and keep only calibration files in the folder." if what == "calibration file" else
            f"Give a file prepared like the calibration data of input '{spec.name}' (cal_data_type / a "
            "folder name ending in _f32 set the data type).",
        )


def _other_shape(values: int, spec: InputSpec) -> str | None:
    """The shape ``values`` numbers make with the input's batch and channels and square picture sides (an NCHW or
    NHWC image tensor of another size), as 1x3x256x256; None where they make none."""
    if not spec.shape or len(spec.shape) != 4:
        return None
    nhwc = spec.layout_train == "NHWC"
    channels = spec.shape[3] if nhwc else spec.shape[1]
    per_channel = values // max(spec.shape[0] * channels, 1)
    side = int(round(per_channel ** 0.5))
    if side * side * spec.shape[0] * channels != values or side == 0:
        return None
    dims = [spec.shape[0], side, side, channels] if nhwc else [spec.shape[0], channels, side, side]
    return "x".join(map(str, dims))


def _plan_input(spec: InputSpec, preprocess_on: bool, specs: Sequence[InputSpec] = ()) -> list[tuple[Path, ...]]:
    """``specs``: every input of the model (to recognise another input's data in ``spec``'s folder)."""
    files = _listing(spec)
    if spec.is_featuremap or not preprocess_on:
        for f in files:
            _check_raw(f, spec, others=specs)
        return [(f,) for f in files]
    for f in files:
        if f.suffix.lower() not in IMAGE_EXTENSIONS:
            raise HbError(
                f"calibration file {f} is not an image ({'/'.join(IMAGE_EXTENSIONS)}); "
                "preprocess_on is True"
            )
    batch = spec.shape[0]
    if len(files) < batch:
        raise HbError(
            f"input '{spec.name}' has batch {batch} but {spec.cal_data_dir} holds {len(files)} images"
        )
    if len(files) % batch:
        logger.warning(
            "input '%s': %d images do not fill batches of %d; the last %d are ignored",
            spec.name,
            len(files),
            batch,
            len(files) % batch,
        )
    return [tuple(files[i : i + batch]) for i in range(0, len(files) - batch + 1, batch)]


def _plan(specs: Sequence[InputSpec], preprocess_on: bool) -> list[list[tuple[Path, ...]]]:
    plans = [_plan_input(s, preprocess_on, specs) for s in specs]
    counts = {len(p) for p in plans}
    if len(counts) > 1:
        detail = ", ".join(f"{s.cal_data_dir}: {len(p)}" for s, p in zip(specs, plans, strict=True))
        raise HbError(f"calibration folders hold different numbers of samples ({detail})")
    return plans


def preflight(specs: Sequence[InputSpec], preprocess_on: bool = False) -> int:
    """Check the calibration folders without reading any sample; return the sample count."""
    CalibrationSource(specs)  # name/shape check
    return len(_plan(specs, preprocess_on)[0])


# Pixel values of image inputs are 0..255 (before mean/scale). Values a little outside
# (resampling overshoot) are clipped; far outside means the data is not pixels at all.
PIXEL_RANGE = (-128.0, 383.0)


def _load_raw(paths: tuple[Path, ...], spec: InputSpec, preprocess_on: bool,
              what: str = "calibration file") -> np.ndarray:
    """One sample as stored, checked: readable, complete, finite, pixels in 0..255 (``what``: the file's role, as
    messages name it)."""
    if preprocess_on and not spec.is_featuremap:
        return load_images(paths, spec, what.replace("file", "image"))
    (path,) = paths
    try:
        data = load_npy(path) if path.suffix.lower() == ".npy" \
            else np.fromfile(path, raw_dtype(spec, path))
        data = data.reshape(spec.shape)
    except (OSError, ValueError, EOFError) as e:
        if isinstance(e, PermissionError):  # the file is fine, the machine refuses: not "rewrite it"
            raise os_error(e, f"cannot read {what} for input '{spec.name}'") from None
        reason = getattr(e, "strerror", None) or e
        raise HbError(f"cannot read {what} {path} for input '{spec.name}': {reason}; "
                      f"rewrite it (numpy.save or ndarray.tofile of shape {spec.shape})") from None
    if data.dtype.kind == "f":
        finite = np.isfinite(data)
        if not finite.all():
            bad = int(data.size - np.count_nonzero(finite))
            # An attention mask given as an input holds -inf at masked positions: -1e4 masks the same
            mask = " (an attention mask: write -1e4 where it holds -inf, which masks the same)" \
                if not np.isnan(data).any() and np.all(data[~finite] < 0) else ""
            raise HbError(f"{what} {path} for input '{spec.name}' holds {bad} of {data.size} values "
                          f"that are NaN or infinite; the model needs real numbers, regenerate the file{mask}")
        if spec.is_featuremap and np.dtype(spec.model_dtype).kind in "iu" and data.size:
            fraction = data[data != np.round(data)]
            if fraction.size:
                # int32 files read as float32 are tiny denormals that the cast to the model's type makes 0:
                # the calibration ran on zeros with no word (hunt 46 D1). A .npy file carries its own type.
                written = next((t for t in dict.fromkeys((spec.model_dtype, "int32", "int64", "int16", "uint8"))
                                if t in CAL_DATA_TYPES and np.dtype(t).itemsize == data.dtype.itemsize), None)
                hint = f"save the file as an array of {spec.model_dtype} (numpy.save of " \
                       f"x.astype(numpy.{spec.model_dtype}))" if path.suffix.lower() == ".npy" else \
                    "set cal_data_type to the type the files were written in for this input" + \
                    (f" ({written} if they hold {written} values)" if written else "")
                raise HbError(f"{what} {path} for input '{spec.name}' holds {data.dtype} values that are not whole "
                              f"numbers ({fraction.size} of {data.size}, such as {float(fraction.flat[0]):.6g}), "
                              f"but the model's input '{spec.name}' is {spec.model_dtype}", hint=hint)
        if not spec.is_featuremap and data.size:
            lo, hi = float(data.min()), float(data.max())
            if lo < PIXEL_RANGE[0] or hi > PIXEL_RANGE[1]:
                raise HbError(f"{what} {path} for image input '{spec.name}' holds values from "
                              f"{lo:g} to {hi:g}, outside the pixel range 0..255; give the image before "
                              f"mean/scale (the model's preprocessing applies them), or declare the input "
                              f"as featuremap")
    elif not spec.is_featuremap and data.dtype.kind == "b":
        # True/False would be read as pixels 1/0: a black picture, whose thresholds fit no real image
        raise HbError(f"{what} {path} for image input '{spec.name}' holds bool values (True/False), "
                      f"not pixels; an image input takes input_type_train pixels 0..255 (before mean/scale): "
                      f"save the pictures as uint8 or float32 arrays, or declare the input as featuremap if it "
                      f"is a mask rather than an image")
    elif not spec.is_featuremap and data.size and data.dtype.kind in "iu":
        # Whole numbers have no resampling overshoot to forgive: one outside 0..255 is not a pixel, and
        # clipping it made most of an int8 picture black, so the thresholds came from black pictures.
        lo, hi = int(data.min()), int(data.max())
        if lo < 0 or hi > 255:
            dumped = ("; int8 data is what debug_mode: dump_calibration_data writes, the calibrated model's own "
                      "input (pixel - 128 in the intermediate colour space), not data for cal_data_dir: point "
                      "cal_data_dir at the pixel files the dump was made from") if data.dtype == np.int8 else ""
            raise HbError(f"{what} {path} for image input '{spec.name}' holds {data.dtype} values "
                          f"from {lo} to {hi}; an image input takes input_type_train pixels 0..255 (before "
                          f"mean/scale){dumped}")
    if spec.is_featuremap and np.dtype(spec.model_dtype).kind in "iu" and data.size and data.dtype.kind in "fiu":
        _check_integer_range(data, spec, path, what)
    return data


def _check_integer_range(data: np.ndarray, spec: InputSpec, path: Path, what: str) -> None:
    """Values an integer model input cannot hold would wrap around in the cast to its type (hunt 47 D6)."""
    info = np.iinfo(spec.model_dtype)
    lo, hi = data.min(), data.max()
    if lo < info.min or hi > info.max:
        raise HbError(f"{what} {path} for input '{spec.name}' holds values from {lo} to {hi}, but the model's input "
                      f"'{spec.name}' is {spec.model_dtype} ({info.min}..{info.max}): they would wrap around",
                      hint="give the values the model's input takes, or check cal_data_type for this input")


def _read_sample(paths: tuple[Path, ...], spec: InputSpec, preprocess_on: bool,
                 what: str = "calibration file") -> np.ndarray:
    return to_intermediate(_load_raw(paths, spec, preprocess_on, what), spec)


def read_sample_file(path: Path, spec: InputSpec, preprocess_on: bool = False,
                     specs: Sequence[InputSpec] = ()) -> np.ndarray:
    """One file prepared exactly as a calibration sample of ``spec`` (``hb_mapper infer``).

    Image files (jpg/png/bmp) are read like ``preprocess_on`` calibration images
    whatever the config says (raw bytes could not be them anyway); ``.npy`` and raw
    files must match the input's shape and data type. ``specs``: every input of the model, so a file of
    another input's size is said to be that input's.
    """
    path = Path(path)
    if not path.is_file():
        raise HbError(f"input file {path} for input '{spec.name}' does not exist")
    image = not spec.is_featuremap and (preprocess_on or path.suffix.lower() in IMAGE_EXTENSIONS)
    if not image:
        _check_raw(path, spec, "input file", specs)
    elif spec.shape[0] != 1:
        raise HbError(f"input '{spec.name}' has batch {spec.shape[0]}; give a raw or .npy sample, not one image")
    return _read_sample((path,), spec, image, "input file")


class FolderCalibrationSource(CalibrationSource):
    """Samples read from ``cal_data_dir`` folders (one per input, files in name order)."""

    def __init__(self, specs: Sequence[InputSpec], preprocess_on: bool = False) -> None:
        super().__init__(specs)
        self.preprocess_on = preprocess_on
        self._plans = _plan(self.specs, preprocess_on)

    def __len__(self) -> int:
        return len(self._plans[0])

    def check_all(self) -> None:
        """Read and check every sample once, so bad data fails before anything is written."""
        for spec, plan in zip(self.specs, self._plans, strict=True):
            for paths in plan:
                _load_raw(paths, spec, self.preprocess_on)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(len(self)):
            yield self._sample(i)

    def picked(self, indices: set[int]) -> list[dict[str, np.ndarray]]:
        return [self._sample(i) for i in sorted(indices) if 0 <= i < len(self)]  # only these files read

    def _sample(self, i: int) -> dict[str, np.ndarray]:
        return {s.name: _read_sample(p[i], s, self.preprocess_on) for s, p in zip(self.specs, self._plans, strict=True)}


class RandomCalibrationSource(CalibrationSource):
    """Generated samples for ``calibration_type: skip``: uniform 0..255 images, N(0, 1) featuremaps
    (ones for integer ones, uniform 0..1 for single numbers).

    Every iteration restarts from ``seed``, so repeated passes see the same data.
    """

    def __init__(self, specs: Sequence[InputSpec], num_samples: int = 4, seed: int = 0) -> None:
        super().__init__(specs)
        self.num_samples = num_samples
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        rng = np.random.default_rng(self.seed)
        for _ in range(self.num_samples):
            sample = {}
            for s in self.specs:
                if s.is_featuremap and np.issubdtype(np.dtype(s.model_dtype), np.integer):
                    # An integer input is a size, a shape or an index: ones are valid for all of them
                    # (noise cast to integers made Expand targets and indices the model refuses).
                    data = np.ones(s.shape)
                elif s.is_featuremap and int(np.prod(s.shape, dtype=np.int64)) == 1:
                    # One number is a threshold, a ratio or a scale (NMS iou_threshold / score_threshold, a
                    # resize factor): a negative one is outside what the model accepts.
                    data = rng.uniform(0.0, 1.0, size=s.shape)
                elif s.is_featuremap:
                    data = rng.standard_normal(s.shape)
                else:
                    data = rng.integers(0, 256, size=s.shape, dtype=np.uint8)
                sample[s.name] = to_intermediate(data, s)
            yield sample


def folder_names(names: Sequence[str]) -> dict[str, str]:
    """Filesystem-safe, distinct folder name for each input name (the dump and the debugger that reads it)."""
    return file_names(names, fallback="input")


def dump_calibration_data(source: CalibrationSource, working_dir: str | Path) -> Path:
    """Write every sample to ``working_dir/calibration_data/<input>/<i>.npy``; return that folder."""
    root = Path(working_dir) / "calibration_data"
    dirs = {n: root / d for n, d in folder_names(source.names).items()}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
        # A previous, longer run would otherwise leave extra samples behind.
        for old in d.glob("*.npy"):
            if old.stem.isdigit():
                old.unlink()
    for i, sample in enumerate(source):
        for name, data in sample.items():
            # an OSError naming the file (in the staging folder), a short write as ENOSPC
            replace_atomically(dirs[name] / f"{i}.npy", lambda fh, d=data: np.save(fh, d))
    return root
