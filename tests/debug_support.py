"""Shared pieces of the debugger tests: converted models with dumped data, PNG checks, edits.

A converted model is a makertbin run with ``debug_mode: dump_calibration_data`` on a
small model from ``builders`` (or a PP-OCR config), so the debugger reads exactly
what a user's conversion leaves behind.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from builders import FloatModel, _Graph, make_project
from matplotlib import image as mpimg
from onnx import helper

import hbtools.log
from hbtools.pipeline.runner import makertbin


@dataclass(frozen=True)
class Dumped:
    calibrated: Path
    data: Path
    paths: dict[str, Path]

    def model(self) -> onnx.ModelProto:
        return onnx.load(str(self.calibrated))


def convert_with_dump(root: Path, fm: FloatModel, cal_count: int = 4) -> Dumped:
    project = make_project(root, fm, cal_count=cal_count)
    inputs = project.config["input_parameters"]
    if fm.featuremap and len(fm.inputs) > 1:  # featuremaps take no mean / scale
        for key in ("mean_value", "scale_value"):
            inputs[key] = "; ".join(inputs[key] if n not in fm.featuremap else "None" for n in fm.inputs)
    project.write(model_parameters={"debug_mode": "dump_calibration_data"}, input_parameters=inputs)
    hbtools.log.setup(None)
    paths = makertbin(project.config_path, "onnx")
    return Dumped(paths["calibrated"], project.working_dir / "calibration_data", paths)


def two_inputs() -> FloatModel:
    """An image and a featuremap input: conv(image) + featuremap -> conv."""
    g = _Graph(7)
    a = g.op("Add", [g.conv("data", 3, 4), "feat"])
    out = g.conv(g.op("Relu", [a]), 4, 2)
    return g.model({"data": [1, 3, 8, 8], "feat": [1, 4, 8, 8]}, [out], featuremap={"feat"})


def degrade(model: onnx.ModelProto, factors: dict[str, float]) -> onnx.ModelProto:
    """Multiply the thresholds and scales of calibration nodes (a worse calibration)."""
    model = copy.deepcopy(model)
    for node in model.graph.node:
        if node.name in factors:
            for attr in node.attribute:
                if attr.name in ("thresholds", "scales"):
                    attr.CopyFrom(helper.make_attribute(attr.name, [v * factors[node.name] for v in attr.floats]))
    return model


def assert_png(path: Path, min_width: int = 300, min_height: int = 200) -> None:
    """A readable PNG of at least the given size with a drawing on it (not one flat colour)."""
    assert path.suffix == ".png" and path.is_file(), path
    pixels = mpimg.imread(str(path))
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, (path, pixels.shape)
    rgb = (pixels[..., :3] * 255).astype(np.uint32)
    not_white = (rgb < 242).any(axis=-1).mean()
    assert not_white > 0.01, f"{path} is blank"
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert colours.size > 3, f"{path} has almost no colours"
