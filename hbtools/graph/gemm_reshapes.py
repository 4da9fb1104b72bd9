"""The Reshapes around onnxruntime's Gemm of a 3-D Linear, written without the batch size.

onnxruntime's MatMulAddFusion writes a MatMul + Add over ``[1, T, K]`` as
``Reshape [T, K] -> Gemm -> Reshape [1, T, N]``, the batch of one folded into both shapes.
The model the user exported takes any batch (a script's ``set_dim_param(0, 0, '?')``), and
every artefact made from it failed on a batch of several at those Reshapes (hunt 41 D4: a
text recogniser's Linear). With ``[-1, K]`` and ``[-1, T, N]`` they compute the same for one
sample and follow the batch for more.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, numpy_helper

from hbtools.graph.graph import GraphView

# the names onnxruntime gives the Reshapes it writes around the Gemm
FUSION_NAMES = ("gemm_input_reshape", "gemm_output_reshape")


def batch_free_gemm_reshapes(model: ModelProto) -> int:
    """Rewrite in place the shapes of the fusion's Reshapes that hold a batch of one (see the module); how many."""
    view = GraphView(model)
    shapes = view.shapes
    taken = {t.name for t in model.graph.initializer}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Reshape" or not node.name.startswith(FUSION_NAMES) or len(node.input) < 2:
            continue
        target = view.const(node.input[1])
        source = shapes.get(node.input[0])
        if target is None or target.ndim != 1 or not source or not all(isinstance(d, int) and d > 0 for d in source) \
                or any(int(d) <= 0 for d in target):
            continue
        target = [int(d) for d in target]
        if len(source) > 2 and source[0] == 1 and target == [int(np.prod(source[:-1])), source[-1]]:
            new = [-1, target[1]]  # the rows of the Gemm's input: the batch with the tokens
        elif len(target) > 2 and target[0] == 1 and np.prod(target) == np.prod(source):
            new = [-1, *target[1:]]  # the Gemm's rows back as [batch, tokens, ...]
        else:
            continue
        name = f"{node.input[1]}_any_batch"
        while name in taken:
            name += "_"
        taken.add(name)
        model.graph.initializer.append(numpy_helper.from_array(np.array(new, np.int64), name))
        node.input[1] = name
        changed += 1
    return changed
