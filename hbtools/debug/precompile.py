"""onnxruntime's graph optimizations for a stage body before it goes inside an ``If``.

onnxruntime applies its layout optimization (NCHWc convolutions, fused activations)
to the main graph only, so a convolution inside an ``If`` branch runs about 1.5x
slower. Each stage body is therefore optimized on its own, once, when the debugger
builds its session, and the optimized nodes are what the branch holds. The
temporary session used for this never runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import GraphProto, NodeProto, OperatorSetIdProto, TensorProto, ValueInfoProto, helper

log = logging.getLogger("hbtools")


def optimized_body(nodes: Sequence[NodeProto], imports: Sequence[ValueInfoProto], exports: Sequence[ValueInfoProto],
                   initializers: Sequence[TensorProto], opsets: Sequence[OperatorSetIdProto],
                   ir_version: int, name: str, scratch: Path) -> tuple[GraphProto, list[OperatorSetIdProto]]:
    """The nodes as an optimized ``If`` branch (no inputs; reads ``imports`` from the outer scope).

    ``scratch`` is a folder for onnxruntime's output file.
    """
    graph = helper.make_graph(list(nodes), name, list(imports), list(exports), list(initializers))
    model = helper.make_model(graph, opset_imports=list(opsets))
    model.ir_version = ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    path = scratch / f"{name}.onnx"
    options.optimized_model_filepath = str(path)
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(path))
    except Exception:  # only slower without: keep the body as it is
        log.debug("stage %s left unoptimized", name, exc_info=True)
        optimized = model
    body = optimized.graph
    del body.input[:]
    body.name = name
    return body, list(optimized.opset_import)
