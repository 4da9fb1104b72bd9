"""Linear layers over tokens, and the element-wise ops between them, as 1x1 Convs over a batch of tokens (RDK X3).

A transformer's MLP reads tokens [B, L, C]; onnxruntime writes each Linear as a Reshape to [B*L, C], a Gemm
and a Reshape back. Where the BPU takes 4-D tensors only, the Gemm ran on the BPU alone and every Relu, GELU,
scale and residual Add between two Linears on the CPU ('Relu on a 3-D tensor'): one BPU call per Linear. The
tokens viewed as [B*L, C, 1, 1] (the same values in the same order) make each Linear a 1x1 Conv and each
element-wise op one of that view, so the Reshapes between them cancel and an MLP is one BPU subgraph.

Tokens made from a channels-first map, a ViT's patch tokens ``conv(x).flatten(2).transpose(1, 2)`` ([N, C, H, W]
to [N, HW, C]), channels-last tokens ``x.permute(0, 2, 3, 1)`` ([N, H, W, C]: ConvNeXt's pointwise MLP) or a 1-D
net's frames ``y.transpose(1, 2)`` of a row [N, C, 1, L], are that map read in another order: token l of item n
is the pixel (l // W, l % W) of the map. Over the map itself a Linear is a 1x1 Conv, an element-wise op stays one,
and the mean over the tokens is a GlobalAveragePool, so no Transpose of a 3-D tensor (a CPU node there) comes
between the patch conv and the MLP, or between a 1-D net and its per-frame head.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import reshape_node
from hbtools.graph.bpu_forms.rows import _BROADCASTING, _UNARY, _Rows
from hbtools.march.profiles import MarchProfile


def token_mlps_as_4d(model: ModelProto, profile: MarchProfile, placed: Mapping[str, str] | None = None) -> int:
    """On a march whose BPU takes no 2-D or 3-D tensor (RDK X3): each Gemm or MatMul by a constant weight of
    tokens [..., C] (3-D, or 2-D behind a Reshape of 3-D ones) as a 1x1 Conv of their view [M, C, 1, 1] (M the
    count of tokens), and the element-wise ops that read such views (of scalar or per-channel constants, or of
    tokens of the same shape) over them too; a Reshape of tokens to other tokens with the same channels reads the
    view. A Reshape back to tokens follows each, read only where a node has no such form (see the module
    docstring). Tokens a Transpose made of a channels-first map [N, C, H, W] (or of a row [N, C, 1, L]) are
    viewed as that map first (``_MapTokens``): a mean over them is then its GlobalAveragePool, and a Reshape and
    a Transpose give the tokens back where a node without such a form reads them. Nodes ``placed`` on the CPU
    stay. Returns how many nodes it wrote over views."""
    conv = profile.rule("Conv")
    if profile.takes_rank(2) or profile.takes_rank(3) or conv is None or not conv.ranks[0] <= 4 <= conv.ranks[1]:
        return 0
    over_maps = _MapTokens(model, placed or {}).run()
    return over_maps + _Tokens(model, placed or {}).run()


class _Tokens(_Rows):
    """``_Rows`` with tokens [..., C] for rows: ``rows`` holds each one's [M, C, 1, 1] view."""

    into, out_of = "to_4d", "from_4d"

    def _static(self, tensor: str) -> list[int] | None:
        shape = self.shapes.get(tensor)
        if shape is None or len(shape) not in (2, 3, 4) or not all(isinstance(d, int) and d > 0 for d in shape):
            return None
        return list(shape)

    def _view_shape(self, shape: list | None) -> list | None:
        return None if shape is None else [int(np.prod(shape[:-1])), shape[-1], 1, 1]

    def _to_view(self, tensor: str, view: str, name: str) -> NodeProto:
        return reshape_node(self.model, tensor, view, self._view_shape(self.shapes[tensor]), name)

    def _from_view(self, view: str, tensor: str, name: str) -> NodeProto:
        return reshape_node(self.model, view, tensor, list(self.shapes[tensor]), name)

    def _layout(self, node: NodeProto) -> bool:
        """A Reshape of tokens that have a view to tokens of the same channels and count: the same view, the
        Reshape (read where a node needs its output as it is) written from the view."""
        if node.op_type != "Reshape" or node.input[0] not in self.rows:
            return False
        out = self._static(node.output[0])
        if out is None or self._view_shape(out) != self.shapes.get(self.rows[node.input[0]]):
            return False
        self.rows[node.output[0]] = self.rows[node.input[0]]
        self.nodes.append(self._from_view(self.rows[node.input[0]], node.output[0], node.name))
        return True

    def _tokens_read(self, tensor: str) -> str | None:
        """The tokens whose view a Linear of ``tensor`` reads: ``tensor``, or the 3-D or 4-D tokens a Reshape
        flattened to it (onnxruntime's Gemm of a [N, L, C] or a channels-last [N, H, W, C] tensor); None where it
        is no tokens."""
        shape = self._static(tensor)
        if tensor in self.rows or (shape is not None and len(shape) == 3):
            return tensor
        flatten = self.view.producer.get(tensor)
        if shape is None or flatten is None or flatten.op_type != "Reshape":
            return None
        source = self._static(flatten.input[0])
        if source is None or len(source) < 3 or self._view_shape(source) != self._view_shape(shape):
            return None
        return flatten.input[0]

    def _joins_a_chain(self, node: NodeProto, tokens: str) -> bool:
        """Whether a Linear over views would join another node over views: it reads a view, or a node with a view
        form reads its output (through onnxruntime's Reshape back to tokens). A Linear alone keeps its form: its
        view and the Reshapes around it would gain nothing."""
        if tokens in self.rows:
            return True
        readers = list(self.view.consumers.get(node.output[0], []))
        readers += [r for back in readers if back.op_type == "Reshape"
                    for r in self.view.consumers.get(back.output[0], [])]
        return any(r.op_type in (*_UNARY, *_BROADCASTING) or (r.op_type in ("Gemm", "MatMul") and len(r.input) > 1
                                                              and self.view.is_const(r.input[1])) for r in readers)

    def _conv(self, node: NodeProto) -> bool:
        """A Gemm (A as it is) or MatMul of tokens by a constant 2-D weight as the 1x1 Conv of their view."""
        if node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2 or self._static(node.output[0]) is None:
            return False
        a = self.view.attrs(node)
        b = self.view.const(node.input[1])
        tokens = self._tokens_read(node.input[0])
        if a.get("transA", 0) or b is None or b.ndim != 2 or tokens is None or not self._joins_a_chain(node, tokens):
            return False
        weight = (b if a.get("transB", 0) else b.T) * np.float32(a.get("alpha", 1.0))  # [N, K]
        inputs = [self._row_of(tokens, node), self._fresh(f"{node.name}_tokens_weight")]
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            c = self.view.const(node.input[2])
            if c is None or c.size not in (1, weight.shape[0]) or (c.ndim == 2 and c.shape[0] != 1):
                return False  # a bias per token is not a conv's
            bias = np.broadcast_to(c.reshape(-1), weight.shape[:1]) * np.float32(a.get("beta", 1.0))
            inputs.append(self._fresh(f"{node.name}_tokens_bias"))
            self.model.graph.initializer.append(numpy_helper.from_array(bias.astype(b.dtype), inputs[2]))
        self.model.graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(weight[:, :, None, None]).astype(b.dtype), inputs[1]))
        self._emit(node, inputs, {"alpha": None, "beta": None, "transA": None, "transB": None,
                                  "kernel_shape": [1, 1]}, op_type="Conv")
        return True

    def _fits(self, name: str, shape: list[int]) -> bool:
        """Whether operand ``name`` of an element-wise op writing tokens of ``shape`` has a view form: tokens of
        that shape, or a constant of one value or one per channel."""
        value = self.view.const(name)
        if value is None:  # views broadcast only as their tokens did where they are of the output's shape
            return self._static(name) == shape or self.shapes.get(self.rows.get(name, "")) == self._view_shape(shape)
        return value.size == 1 or (value.shape[-1:] == (shape[-1],) and value.size == shape[-1])

    def _constant(self, name: str, reader: NodeProto) -> str:
        value = self.view.const(name)
        if value.size == 1:
            return name
        per_channel = self._fresh(f"{name}_{reader.name}_tokens")
        self.model.graph.initializer.append(numpy_helper.from_array(value.reshape(-1, 1, 1), per_channel))
        return per_channel

    def _over_rows(self, node: NodeProto) -> bool:
        """An element-wise op reading a view, whose operands all have view forms (``_fits``), over the views."""
        shape = self._static(node.output[0]) if len(node.output) == 1 else None
        if shape is None or not any(i in self.rows for i in node.input) or \
                not all(self._fits(i, shape) for i in node.input if i):
            return False
        if node.op_type in _UNARY and node.input[0] in self.rows:
            self._emit(node, [self.rows[node.input[0]], *node.input[1:]], {})
            return True
        if node.op_type not in _BROADCASTING:
            return False
        self._emit(node, [(self._constant(i, node) if self.view.is_const(i) else self._row_of(i, node)) if i else ""
                          for i in node.input], {})
        return True


class _MapTokens(_Tokens):
    """``_Tokens`` whose view of tokens [..., C] (M of them) is the channels-first map [N, C, H, W] they were
    transposed from (M = N * H * W): ``grids`` holds (N, H, W) for each count of tokens made so. A count two maps
    of other grids would give is left alone: their tokens, mixed, would be read at other pixels."""

    into, out_of = "to_map", "from_map"

    def __init__(self, model: ModelProto, placed: Mapping[str, str]) -> None:
        super().__init__(model, placed)
        found: dict[int, set[tuple[int, int, int]]] = {}
        self.seeds: dict[str, str] = {}  # the output of each Transpose making tokens -> the map it reads
        self.back: dict[str, str] = {}  # tokens of a view transposed back to [N, C, L] -> that view
        for node in model.graph.node:
            seed = self._seed(node)
            if seed is not None:
                self.seeds[node.output[0]] = seed
                n, _, h, w = self.shapes[seed]
                found.setdefault(n * h * w, set()).add((n, h, w))
        self.grids = {m: next(iter(g)) for m, g in found.items() if len(g) == 1}
        self.seeds = {t: m for t, m in self.seeds.items() if self._view_shape(self._static(t)) is not None}

    def _seed(self, node: NodeProto) -> str | None:
        """The map [N, C, H, W] whose tokens [N, HW, C] a Transpose (perm [0, 2, 1]) of its flatten [N, C, HW]
        (a Reshape, or a Squeeze of a row [N, C, 1, L]) writes, or whose channels-last tokens [N, H, W, C] a
        Transpose (perm [0, 2, 3, 1]) of it writes (ConvNeXt's and ConvFormer's pointwise MLPs); None for any
        other node."""
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            return None
        perm = list(self.view.attrs(node).get("perm", []))
        if perm == [0, 2, 3, 1]:
            return node.input[0] if len(self._static(node.input[0]) or []) == 4 else None
        if perm != [0, 2, 1]:
            return None
        flat = self.view.producer.get(node.input[0])
        if flat is None or flat.op_type not in ("Reshape", "Squeeze", "Flatten") or flat.domain not in ("", "ai.onnx"):
            return None
        shape, source = self._static(node.input[0]), self._static(flat.input[0])
        if shape is None or source is None or len(shape) != 3 or len(source) != 4 or \
                source[:2] != shape[:2] or source[2] * source[3] != shape[2]:
            return None
        return flat.input[0]

    def _view_shape(self, shape: list | None) -> list | None:
        grid = None if shape is None or len(shape) < 2 else self.grids.get(int(np.prod(shape[:-1])))
        return None if grid is None else [grid[0], shape[-1], grid[1], grid[2]]

    def _to_view(self, tensor: str, view: str, name: str) -> NodeProto:
        n, c, h, w = self._view_shape(self.shapes[tensor])
        if list(self.shapes[tensor]) == [n, h, w, c]:  # channels-last: one Transpose, which the BPU takes
            return helper.make_node("Transpose", [tensor], [view], name=name, perm=[0, 3, 1, 2])
        tokens, channels_first = self._fresh(f"{view}_tokens"), self._fresh(f"{view}_channels_first")
        self.nodes.append(reshape_node(self.model, tensor, tokens, [n, h * w, c], self._fresh_node(f"{name}_tokens")))
        self.nodes.append(helper.make_node("Transpose", [tokens], [channels_first],
                                           name=self._fresh(f"{name}_transpose"), perm=[0, 2, 1]))
        return reshape_node(self.model, channels_first, view, [n, c, h, w], name)

    def _from_view(self, view: str, tensor: str, name: str) -> NodeProto:
        n, c, h, w = self.shapes[view]
        if list(self.shapes[tensor]) == [n, h, w, c]:
            return helper.make_node("Transpose", [view], [tensor], name=name, perm=[0, 2, 3, 1])
        flat, tokens = self._fresh(f"{view}_{name}_flat"), self._fresh(f"{view}_{name}_tokens")
        self.nodes.append(reshape_node(self.model, view, flat, [n, c, h * w], self._fresh_node(f"{name}_flat")))
        if list(self.shapes[tensor]) == [n, h * w, c]:
            return helper.make_node("Transpose", [flat], [tensor], name=name, perm=[0, 2, 1])
        self.nodes.append(helper.make_node("Transpose", [flat], [tokens], name=self._fresh(f"{name}_transpose"),
                                           perm=[0, 2, 1]))
        return reshape_node(self.model, tokens, tensor, list(self.shapes[tensor]), name)

    def _layout(self, node: NodeProto) -> bool:
        """A Transpose making tokens of a map: their view is that map (the Transpose stays for other readers).
        The tokens of a view transposed back to channels first and shaped as the view (``t.transpose(1, 2)
        .reshape(N, C, H, W)`` after the MLP, or ``.unsqueeze(2)`` to the row): that view, read in its place."""
        if node.output and node.output[0] in self.seeds:
            self.rows[node.output[0]] = self.seeds[node.output[0]]
            self.nodes.append(node)
            return True
        rank = len(self._static(node.input[0]) or []) if node.input else 0
        if node.op_type == "Transpose" and node.input[0] in self.rows and rank > 2 and \
                list(self.view.attrs(node).get("perm", [])) == [0, rank - 1, *range(1, rank - 1)]:
            self.back[node.output[0]] = self.rows[node.input[0]]  # channels first, the tokens in their order
            if self._is_the_view(node.output[0]):
                return True
        elif node.op_type in ("Reshape", "Unsqueeze") and node.input[0] in self.back and \
                self._is_the_view(node.output[0], self.back[node.input[0]]):
            return True
        return super()._layout(node)

    def _is_the_view(self, tensor: str, view: str | None = None) -> bool:
        """Whether channels-first tokens ``tensor`` (of ``view``, or of their own entry in ``back``) have the
        view's shape: then the view is read in their place (``renamed``)."""
        view = view or self.back[tensor]
        readers = self.view.consumers.get(tensor, [])
        if self._static(tensor) != self.shapes.get(view) or tensor in self.view.graph_outputs or \
                not all(tensor in r.input for r in readers):  # a Loop / If body names it otherwise
            return False
        self.renamed[tensor] = view
        return True

    def _joins_a_chain(self, node: NodeProto, tokens: str) -> bool:
        return tokens in self.rows  # tokens of no map have no grid to view them on

    def _fits(self, name: str, shape: list[int]) -> bool:
        """As ``_Tokens._fits``, but tokens of no view do not fit: turning them into a map would take a CPU
        Transpose, where the op kept on the tokens (a ViT's residual Add of attention's output) takes none."""
        if self._view_shape(shape) is None or (not self.view.is_const(name) and name not in self.rows):
            return False
        return super()._fits(name, shape)

    def _over_rows(self, node: NodeProto) -> bool:
        if node.op_type == "ReduceMean" and node.input[0] in self.rows:
            return self._token_mean(node)
        return super()._over_rows(node)

    def _token_mean(self, node: NodeProto) -> bool:
        """A mean over the tokens of each item ([N, L, C], or channels-last [N, H, W, C]) as the GlobalAveragePool
        of their map, flattened to the mean's shape."""
        shape, out = self._static(node.input[0]), self._static(node.output[0])
        axes = self.view.reduced_axes(node)
        if shape is None or out is None or len(shape) < 3 or axes != list(range(1, len(shape) - 1)):
            return False
        pooled = self._fresh(f"{node.output[0]}_pooled")
        self.nodes.append(helper.make_node("GlobalAveragePool", [self.rows[node.input[0]]], [pooled], name=node.name))
        self.shapes[pooled] = [shape[0], shape[-1], 1, 1]
        self.nodes.append(reshape_node(self.model, pooled, node.output[0], out,
                                       self._fresh_node(f"{node.name}_{self.out_of}")))
        return True
