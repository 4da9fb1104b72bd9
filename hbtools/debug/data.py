"""Calibration samples for the debugger: a ``calibration_data/`` folder or a dataset object.

The folder is what ``debug_mode: dump_calibration_data`` writes (SPEC §5): one
sub-folder per model input holding ``0.npy, 1.npy, ...`` in the intermediate type,
fed to the calibrated model as they are. A dataset object is a mapping
``{input_name: [array, ...]}``, or an iterable of ``{input_name: array}`` dicts
(``hbtools.data.calibration`` sources are such iterables).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from hbtools.data.calibration import folder_names
from hbtools.data.folders import sample_files
from hbtools.data.npy import load_npy
from hbtools.debug.model import CalibratedModel, GraphInput
from hbtools.errors import HbError
from hbtools.runtime.session import convert_feed

Sample = dict[str, np.ndarray]
IMAGE_OFFSET = 128  # uint8 pictures become the int8 intermediate type by subtracting 128
# The plotting functions take no data_num; they use at most this many samples (the first).
PLOT_SAMPLES = 8


def load_samples(calibrated_data: object, cm: CalibratedModel, data_num: int | None = None,
                 *, param: str = "data_num", at_most: int | None = None) -> list[Sample]:
    """The first ``data_num`` samples (all when None; no more than ``at_most``), checked against the model's
    inputs. Only those are read."""
    if calibrated_data is None:
        raise HbError("calibrated_data is required: the calibration_data folder written with "
                      "debug_mode: 'dump_calibration_data', or a dataset object")
    if isinstance(calibrated_data, str | Path):
        files = _folder_files(Path(calibrated_data), cm)
        count = len(next(iter(files.values())))
        take = min(_count(data_num, count, param, f"'{calibrated_data}'"), at_most or count)
        return [{name: _checked(_load_npy(paths[i]), cm_input, str(paths[i]))
                 for (name, paths), cm_input in zip(files.items(), cm.inputs, strict=True)}
                for i in range(take)]
    samples = _dataset(calibrated_data, cm)
    take = min(_count(data_num, len(samples), param, "the dataset"), at_most or len(samples))
    # numbered from 1, as every other message about a sample
    return [{i.name: _checked(np.asarray(s[i.name]), i, f"sample {k} of input '{i.name}'") for i in cm.inputs}
            for k, s in enumerate(samples[:take], start=1)]


def _load_npy(path: Path) -> np.ndarray:
    try:
        return load_npy(path)
    except (OSError, ValueError, EOFError) as exc:
        raise HbError(f"cannot read calibration sample {path}: {exc}; dump the calibration data again "
                      f"(debug_mode: 'dump_calibration_data')") from None


def _count(data_num: int | None, available: int, param: str, where: str) -> int:
    if data_num is None:
        return available
    if isinstance(data_num, bool) or not isinstance(data_num, int | np.integer) or not 1 <= data_num <= available:
        raise HbError(f"{param} must be an integer from 1 to {available} (the number of samples in {where}), "
                      f"got {data_num!r}")
    return int(data_num)


def _folder_files(root: Path, cm: CalibratedModel) -> dict[str, list[Path]]:
    if not root.is_dir():
        raise HbError(f"calibrated_data folder '{root}' does not exist; pass the calibration_data folder that "
                      "debug_mode: 'dump_calibration_data' writes to working_dir")
    names = [i.name for i in cm.inputs]
    safe = folder_names(names)
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    files: dict[str, list[Path]] = {}
    for name in names:
        folder = next((root / d for d in (safe[name], name) if (root / d).is_dir()), None)
        if folder is None and len(names) == 1 and _npy(root):
            folder = root  # a one-input model's samples directly in the folder
        if folder is None:
            expected = ", ".join(safe[n] for n in names)
            raise HbError(f"calibrated_data '{root}' has no folder for model input '{name}'; the model's inputs "
                          f"need the sub-folders [{expected}], found [{', '.join(subdirs)}]",
                          hint="give the calibration_data folder that makertbin writes to working_dir with "
                               "debug_mode: 'dump_calibration_data' (not cal_data_dir)")
        found = _npy(folder)
        if not found:
            raise HbError(f"calibrated_data folder '{folder}' for input '{name}' holds no .npy files")
        files[name] = found
    counts = {n: len(f) for n, f in files.items()}
    if len(set(counts.values())) > 1:
        raise HbError(f"calibrated_data '{root}': the input folders hold different numbers of samples {counts}")
    return files


def _npy(folder: Path) -> list[Path]:
    return sample_files(folder, ".npy")  # 0.npy, 1.npy, ..., 10.npy


def _dataset(data: object, cm: CalibratedModel) -> list[Mapping[str, np.ndarray]]:
    names = [i.name for i in cm.inputs]
    if isinstance(data, Mapping):
        missing = [n for n in names if n not in data]
        if missing:
            raise HbError(f"the calibrated_data mapping has no entry for model input(s) {missing}; "
                          f"its keys are {sorted(map(str, data))}")
        lists = [list(data[n]) for n in names]
        if len({len(v) for v in lists}) > 1:
            raise HbError("the calibrated_data mapping holds different numbers of samples per input")
        if not lists[0]:
            raise HbError("the calibrated_data mapping holds no samples; give at least one per input")
        return [dict(zip(names, values, strict=True)) for values in zip(*lists, strict=True)]
    if isinstance(data, Iterable):
        samples = []
        for k, s in enumerate(data):
            if isinstance(s, np.ndarray) and len(names) == 1:
                s = {names[0]: s}
            if not isinstance(s, Mapping) or any(n not in s for n in names):
                raise HbError(f"calibrated_data sample {k} must be a dict with the model inputs {names}")
            samples.append(s)
        if not samples:
            raise HbError("calibrated_data holds no samples")
        return samples
    raise HbError(f"calibrated_data must be a folder path or a dataset, not {type(data).__name__}")


def _checked(data: np.ndarray, spec: GraphInput, where: str) -> np.ndarray:
    shape = tuple(spec.shape)
    if None not in shape and data.size != int(np.prod(shape, dtype=np.int64)):
        raise HbError(f"{where} holds {data.dtype} {list(data.shape)}, but model input '{spec.name}' "
                      f"takes shape {list(shape)}")
    if None not in shape:
        data = data.reshape(shape)
    if data.dtype.kind in "fc" and not np.all(np.isfinite(data)):
        bad = int(np.count_nonzero(~np.isfinite(data)))
        raise HbError(f"{where} holds {bad} of {data.size} values that are NaN or infinite; the metrics compare "
                      f"with the float model, which needs real numbers: regenerate that sample or leave it out")
    try:  # (float64 values beyond float32's range are refused there)
        return np.ascontiguousarray(convert_feed(data, spec.dtype.type, IMAGE_OFFSET, spec.name))
    except HbError as exc:
        raise HbError(f"{where}: {exc}") from exc
