"""``hb_custom_op create``: the Python template of a custom CPU operator."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from hbtools import outputs
from hbtools.errors import HbError

DEFAULT_NAME = "SampleCustom"
DEFAULT_FILE = "sample_custom.py"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

TEMPLATE = '''"""Custom CPU operator {name}: template written by `hb_custom_op create`.

hbtools runs this op on the CPU, in float, wherever the model has a node whose
op type is "{name}" in a domain of its own (for example "horizon.custom"). A
vendor-style node of op type "PyOp" with the attribute class_name="{name}" is
recognised as well.

Two things to fill in:
  * {name}.compute  - the numerics: numpy arrays in, numpy arrays out;
  * infer_shape     - the output shapes for given input shapes.

Every hbtools stage that executes the model (calibration, every ONNX artefact
through HB_ONNXRuntime, the .bin simulator) calls this compute, so the op has
exactly one definition. Outputs are stored as float32.

Register the file in the makertbin config:

    custom_op:
      custom_op_method: register
      op_register_files: {file}
      custom_op_dir: ./custom_op    # folder of this file, relative to the config

In a Python session of your own, load it before running a model that uses it:

    from hbtools.ops.custom import load_op_files
    load_op_files(["{file}"])
"""

import numpy as np

from hbtools.ops.custom import op_implement_register, op_shape_infer_register


@op_implement_register("{name}")
class {name}:
    def __init__(self, **attributes):
        # The node's ONNX attributes, by name. Spell them out to document the op,
        # e.g. `def __init__(self, alpha=1.0):`.
        self.attributes = attributes

    def compute(self, *inputs):
        # One numpy array per node input, in node order. Return one array per node
        # output (a tuple or list when there are several).
        # Placeholder: pass the first input through unchanged.
        x = inputs[0]
        return np.array(x, dtype=np.float32, copy=True)


@op_shape_infer_register("{name}")
def infer_shape(input_shapes):
    # input_shapes: one list of ints per node input. Return a list with one shape
    # (a list of ints) per node output.
    # Placeholder: the output is shaped like the first input.
    return [list(input_shapes[0])]
'''


def render(name: str, file_name: str) -> str:
    return TEMPLATE.format(name=name, file=file_name)


def create(output: str | Path = DEFAULT_FILE, name: str = DEFAULT_NAME, *, force: bool = False) -> Path:
    """Write the template for op ``name`` to ``output``; refuses to overwrite unless ``force``."""
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise HbError(f"op name {name!r} is not a valid Python class name",
                      hint="use letters, digits and '_', starting with a letter, e.g. ScaledSigmoid")
    path = Path(output)
    if path.suffix != ".py":
        raise HbError(f"'{path}' does not end in .py; the op file must be a Python module",
                      hint=f"e.g. -o {path.stem or 'custom_op'}.py")
    if path.exists() and not force:
        raise HbError(f"'{path}' already exists", hint="choose another --output, or add --force to overwrite it")
    outputs.output_file(path, "--output")
    outputs.write_file(path, render(name, path.name))
    return path
