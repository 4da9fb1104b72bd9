"""Optimize stage: numerically neutral graph rewrites.

onnxruntime's basic-level optimizer does constant folding (static shape chains
included, since the parse stage fixed the input shapes), Identity/Dropout
removal and Conv+BatchNormalization fusion. On top of it we fold per-channel
or scalar affine constants that follow a Conv (PP-OCR's learnable affine
blocks), fold a BatchNormalization of [N, C] into the Gemm (or MatMul) before it,
write onnxruntime's fused contrib ops (FusedConv, QuickGelu, ...) as the standard ops they fuse,
and turn any remaining BatchNormalization into a depthwise 1x1 Conv,
so the quantizer sees fewer, larger integer ops. LSTM and GRU layers are unrolled over
their time steps (``hbtools.graph.recurrent``), layer normalizations become one node
each (``hbtools.graph.layer_norm``) and exporter patterns the BPU has no form for are
written in forms it has (``hbtools.graph.bpu_forms``).
"""

from __future__ import annotations

import copy
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.errors import HbError, last_line
from hbtools.graph import bpu_forms
from hbtools.graph.batch_reshapes import batch_free_reshapes
from hbtools.graph.bpu_forms._common import _axes_node, _opset, per_channel_const
from hbtools.graph.contrib import expand_contrib_ops
from hbtools.graph.flat_heads import flattens_after_heads, wide_flattens_as_convs
from hbtools.graph.graph import (
    GraphView,
    compact,
    infer_shapes,
    is_static,
    name_unnamed_nodes,
    references,
    remove_dead_nodes,
    topological_sort,
)
from hbtools.graph.layer_norm import fuse_layer_norms
from hbtools.graph.loops import constant_loops_unrolled
from hbtools.graph.masks import MASKED_LOGIT, constant_masks, masked_logits_clamped
from hbtools.graph.model_io import with_horizon_domain
from hbtools.graph.origins import OriginTrace, record_fusions, record_origins
from hbtools.graph.recurrent import RECURRENT_OPS, record_unrolled, unroll_recurrences
from hbtools.march.profiles import MarchProfile
from hbtools.ops import custom
from hbtools.ops.base import DOMAIN
from hbtools.runtime.session import LOAD_ERRORS, RUN_ERRORS, ort_session

log = logging.getLogger("hbtools")


def run(model: ModelProto, profile: MarchProfile | None = None, *, placed: Mapping[str, str] | None = None,
        all_bpu: bool = False) -> ModelProto:
    """Return the optimized copy of an original float model (HzPreprocess kept in front).

    With the march ``profile``, convolutions are also put in forms its BPU takes (a patch
    embedding with a larger kernel or stride than it takes becomes SpaceToDepth and a 1x1 Conv).
    ``placed``: node name -> "BPU" / "CPU" as the config's node_info puts them, ``all_bpu``: every
    node on the BPU (--fast-perf); long recurrent layers are unrolled only where put on the BPU."""
    pre_nodes = [n for n in model.graph.node if n.domain == DOMAIN]  # only read: the body below is a copy
    trace = OriginTrace(model)
    original_inputs = list(model.graph.input)
    body = _without_preprocess(model, pre_nodes)
    cut = _cut_custom_nodes(body)
    recurrent = _recurrent_nodes(body)
    # Before onnxruntime loads the graph too: it has no kernel for batch-first (layout 1) layers.
    unroll_recurrences(body, placed, everything=all_bpu, explain=False, profile=profile)
    loops = constant_loops_unrolled(body)
    if loops:
        log.info("%d Loops of a constant trip count written out step by step", loops)
    contrib = expand_contrib_ops(body)
    if contrib:
        log.info("%d onnxruntime contrib ops (FusedConv, Gelu, ...) written as the standard ops they fuse", contrib)
    # Before onnxruntime fuses nodes around them, and again after it folded the shape arithmetic of an
    # exporter (tf2onnx's Shape / Concat / Reshape chains) to static shapes.
    sequences = bpu_forms.sequences_as_concats(body)  # before the Einsums: they need the shapes a sequence hides
    if sequences:
        log.info("%d ConcatFromSequence of a SequenceConstruct written as Concat", sequences)
    einsums = bpu_forms.einsums_as_matmuls(body)
    expandable = _function_ops(body)
    trace.follow(body)  # onnxruntime's fusions name their nodes after no user node (gemm_input_reshape)
    body = _onnxruntime_basic(body)
    einsums += bpu_forms.einsums_as_matmuls(body)
    if einsums:
        log.info("%d Einsums written as MatMuls", einsums)
    if expandable - {n.op_type for n in body.graph.node if n.domain in ("", "ai.onnx")}:
        # onnxruntime expands an op it has no kernel for (GroupNormalization from opset 21, ...) into its
        # function body after its constant folding ran: a second pass folds the body's Shape / Cast / Div /
        # Concat arithmetic on static shapes, which would otherwise put the op and all after it on the CPU.
        body = _onnxruntime_basic(body)
    # onnxruntime inlines function ops (HardSwish from opset 14, ...) into unnamed nodes;
    # partition, calibration and tables key on node names.
    name_unnamed_nodes(body)
    trace.follow(body)
    scatters = bpu_forms.constant_scatters_as_masks(body)  # after onnxruntime folded the indices' shape arithmetic
    if scatters:
        log.info("%d ScatterNDs of constant updates at constant indices written as a product by a mask", scatters)
    uniform = bpu_forms.uniform_constants_as_scalars(body)  # after onnxruntime folded zeros_like to a constant
    if uniform:
        log.info("%d constants whose elements are all equal read as scalars by element-wise ops", uniform)
    # after onnxruntime folded the threshold and beta to constants
    softplus = bpu_forms.softplus_thresholds_dropped(body, placed)
    if softplus:
        log.info("%d softplus thresholds (Where(x > threshold, x, Softplus(x)) of torch's exporter) left out: above "
                 "them softplus(x) is x to float32 rounding", softplus)
        trace.follow(body)
    undone = bpu_forms.splits_undoing_concats(body)
    if undone:
        log.info("%d Splits at the seams of a Concat (behind a Reshape or Transpose) read the joined tensors instead",
                 undone)
    sliced = bpu_forms.matmuls_read_in_slices(body, placed)
    if sliced:
        log.info("%d MatMuls of two activations read only in row or column slices written as a MatMul per slice",
                 sliced)
    unfolds = bpu_forms.unfolds_as_slices(body, placed)  # after onnxruntime folded the windows' index
    # arithmetic; before the no-ops go: a Reshape of the unfolded map to its own shape (`.view(N, C*k*k, h, w)`)
    if unfolds:
        log.info("%d unfold%s (im2col: Gathers of constant windows along H and W, a 6-D Transpose) written as a "
                 "Slice of the map per window tap and a Concat along the channels", unfolds,
                 "" if unfolds == 1 else "s")
    _single_picks_as_squeezes(body)
    _no_ops_removed(body)
    _sums_as_adds(body)
    masks = constant_masks(body)  # after onnxruntime folded the mask (torch.triu of ones, ...) to a constant
    if masks:
        log.info("%d Wheres over a constant mask (masked_fill) written as a product and a sum with constants", masks)
    clamped = masked_logits_clamped(body)
    if clamped:
        log.info("%d attention-mask constants of -inf or finfo(float32).min set to %g, the same Softmax in float and "
                 "values an integer grid holds", clamped, MASKED_LOGIT)
    indexed = bpu_forms.spatial_index_maps_as_matmuls(body)
    if indexed:
        log.info("%d region%s of index arithmetic over a map's H and W (an adaptive pool torch's exporter wrote as "
                 "gathers and sums) written as a matrix product per axis", indexed, "" if indexed == 1 else "s")
    # those whose weights onnxruntime has folded now
    unroll_recurrences(body, placed, everything=all_bpu, profile=profile)
    left = _recurrent_nodes(body)
    if len(left) < len(recurrent):
        log.info("%d recurrent layers (LSTM / GRU) unrolled over their time steps", len(recurrent) - len(left))
        record_unrolled(body, [name for name in recurrent if name and name not in left])
    fused = fuse_layer_norms(body)
    if fused:
        log.info("%d layer normalizations written as one HzLayerNorm node each", fused)
    # Before the L2 norms are written as sums, which they are only over axes other than the batch axis.
    kept = bpu_forms.scalar_reductions_kept_as_maps(body)
    if kept:
        log.info("%d reductions of a whole tensor keep its rank (keepdims) and leave out a batch axis of one", kept)
    lp = bpu_forms.lp_normalizations_as_divisions(body) if profile is not None else 0
    if lp:
        log.info("%d LpNormalizations written as divisions by the norm", lp)
    # First: the rewrites and integer kernels after this read a node's padding from its pads.
    normed = bpu_forms.norms_as_sums(body, profile) if profile is not None else 0
    if normed:
        log.info("%d L2 reductions (ReduceL2, ReduceSumSquare) written as sums of squares", normed)
    padded = bpu_forms.auto_pads_as_pads(body)
    shaped = bpu_forms.conv_transpose_output_shapes_as_pads(body)
    if shaped:
        log.info("%d ConvTranspose output_shape attributes written as the pads they stand for", shaped)
    # before the rewrites for the march's limits, which then see the one Conv; after onnxruntime folded each
    # branch's BatchNorm into its Conv
    merged = bpu_forms.parallel_convs_merged(body, placed)
    if merged:
        log.info("%d sums of parallel Conv branches reading one tensor (RepVGG / MobileOne blocks in training form) "
                 "written as one Conv each, its kernel the sum of theirs", merged)
        trace.follow(body)
    bpu_forms.spatial_reductions_as_global_pools(body)
    if profile is not None and bpu_forms.axis_reductions_as_pools(body, profile):
        log.info("means or maxima over one spatial axis of a map written as pools over whole columns or rows: %s "
                 "has no BPU reduction", profile.label)
    if profile is not None and bpu_forms.squeeze_unsqueeze_pairs(body):
        log.info("Squeezes undone by the Unsqueeze after them removed")
    if profile is not None and bpu_forms.pools_over_one_axis_as_2d(body, profile):
        log.info("pools over the one axis of a 3-D tensor, or over a 5-D view of a map one channel at a time, or "
                 "over other 5-D tensors, written as pools over 4-D tensors")
    if profile is not None and bpu_forms.reductions_over_the_first_axis(body):
        log.info("reductions over the first axis of a tensor without a batch axis moved behind a batch of one")
    if profile is not None:
        sums = bpu_forms.cumsums_as_matmuls(body)
        if sums:
            log.info("%d CumSums written as MatMuls by a triangle of ones", sums)
        vectors = bpu_forms.matmuls_of_vectors(body)
        if vectors:
            log.info("%d MatMuls of a 1-D tensor written as MatMuls of its 2-D form", vectors)
        weights = bpu_forms.matmuls_with_the_weight_second(body, profile)
        if weights:
            log.info("%d MatMuls of a constant (first, or with leading axes of one) written with a 2-D weight "
                     "second", weights)
        flipped = bpu_forms.gemms_with_the_first_input_transposed(body, profile)
        if flipped:
            log.info("%d Gemms with transA written as a Transpose of the first input and a Gemm", flipped)
        batched = bpu_forms.matmuls_of_batched_weights(body, profile)
        if batched:
            log.info("%d MatMuls of a constant batched along one axis (a weight per head) written as a MatMul per "
                     "batch index with its 2-D weight", batched)
    cropped = bpu_forms.crops_as_slices(body)
    if cropped:
        log.info("%d Pads with negative amounts (crops) written as Slices", cropped)
    bpu_forms.zero_pads_into_convs(body)
    shuffles = bpu_forms.channel_shuffles_as_gathers(body, placed)
    if shuffles:
        log.info("%d channel shuffles (Reshape, Transpose, Reshape) written as Gathers of channels", shuffles)
    unshuffles = bpu_forms.pixel_unshuffles_as_space_to_depth(body, placed)
    if unshuffles:
        log.info("%d pixel unshuffles (Reshape, Transpose, Reshape) written as SpaceToDepth and a Gather of channels",
                 unshuffles)
    gathers = bpu_forms.channel_gathers_into_convs(body)
    if gathers:
        log.info("%d Gathers of channels (a Focus layer's reordering) folded into the Convs that read them", gathers)
    rewritten = {"auto_pad attributes written as explicit pads": padded,
                 "Expands left to the broadcasting of the element-wise ops reading them":
                     bpu_forms.expands_into_broadcasts(body, profile) if profile is not None else 0,
                 # where the BPU has no Tile either (RDK X3) the other Expands stay, and their CPU reason names them
                 "Expands of a tensor written as Tiles": bpu_forms.expands_as_tiles(body)
                 if profile is None or profile.rule("Tile") is not None else 0,
                 "constant Pads written as Concats of constant blocks": bpu_forms.constant_pads_as_concats(body)}
    if profile is not None and profile.int16:  # the reciprocal table needs int16 (quant.plan)
        rewritten["Divs of two tensors written as a product with an int16 reciprocal table"] = \
            bpu_forms.divisions_as_reciprocal_products(body, placed)
    if profile is not None and bpu_forms.resizes_of_one_axis_as_2d(body, profile):
        log.info("Resizes of the length of a 3-D tensor written as Resizes of a 4-D tensor of one row")
    rows = bpu_forms.one_row_chains_as_4d(body, profile, placed) if profile is not None else 0
    if rows:
        log.info("%d nodes of 1-D layers (Conv1d and the nodes between) written over [N, C, 1, L], one Unsqueeze "
                 "and one Squeeze of the row around each chain: %s takes 4-D tensors only", rows, profile.label)
        bpu_forms.spatial_reductions_as_global_pools(body)  # a mean over the length is one over the row too
    channel_means = bpu_forms.channel_reductions_as_convs(body, profile, placed) if profile is not None else 0
    if channel_means:
        log.info("%d ReduceMean / ReduceSum over the channels of a map written as 1x1 Convs to one channel with "
                 "constant weights: %s has no BPU reduction", channel_means, profile.label)
    bpu_forms.upsampling_by_whole_factors(body, profile)
    bpu_forms.interpolations_as_matmuls(body)
    if profile is not None:
        rewritten["ConvTransposes with a kernel or stride beyond the BPU's limits written as a Conv over the "
                  "stride's phases, the phases then put in place"] = \
            bpu_forms.conv_transposes_over_phases(body, profile, placed)
        rewritten["Conv kernels cut to the taps that read the map (the others read only padding)"] = \
            bpu_forms.convs_without_dead_taps(body, profile)
        bpu_forms.large_patch_convs_as_space_to_depth(body, profile)
        rewritten["convs dilated beyond the BPU's limit run over the map's phases"] = \
            bpu_forms.dilated_convs_by_phases(body, profile, placed)
        rewritten["1-D convs strided beyond the BPU's limit, or too long for pieces otherwise, run over the stride's "
                  "phases"] = bpu_forms.strided_convs_over_phases(body, profile, placed)
        rewritten["Convs over a single row with a kernel longer than the BPU takes written as one Conv over copies "
                  "of the row stacked along the row axis"] = bpu_forms.row_convs_as_stacked_rows(body, profile, placed)
        # after the phases, which keep a dilated Conv whole where the map divides
        rewritten["Convs whose kernel is longer or more dilated than the BPU takes written as sums of pieces"] = \
            bpu_forms.convs_in_kernel_pieces(body, profile, placed)
    for what, count in rewritten.items():
        if count:
            log.info("%d %s", count, what)
    if profile is not None:
        # before the folds: the BatchNorm (Mul, Add) a batch Squeeze kept away from its Conv folds into it
        squeezes = bpu_forms.batch_squeezes_around_elementwise(body)
        if squeezes:
            log.info("%d Squeeze/Unsqueeze pairs of a batch of one around element-wise ops removed", squeezes)
    bpu_forms.transposes_in_fewer_axes(body)
    bpu_forms.average_pools_over_whole_windows(body)
    if profile is not None:
        stepped = bpu_forms.large_average_pools_in_steps(body, profile, placed)
        if stepped:
            log.info("%d AveragePools over windows larger than the BPU takes written as a global pool or as "
                     "pools in steps", stepped)
        cascaded = bpu_forms.large_max_pools_in_steps(body, profile, placed)
        if cascaded:
            log.info("%d MaxPools with a kernel larger than the BPU takes written as a cascade of smaller ones (an "
                     "SPP block; a max over a long axis)", cascaded)
    _fold_affine_into_conv(body)
    shifted = bpu_forms.shifts_into_next_convs(body)
    if shifted:
        log.info("%d Add%s of a constant per channel before convolutions without padding folded into their biases",
                 shifted, "" if shifted == 1 else "s")
    _fold_batchnorm_into_gemm(body)
    _batchnorm_to_depthwise_conv(body)
    if _affine_to_depthwise_conv(body):
        _fold_affine_into_conv(body)  # the Add of a Mul+Add pair goes into the new conv's bias
    # after the BatchNorm1d of a Linear's tokens folded into its Gemm
    tokens = bpu_forms.token_mlps_as_4d(body, profile, placed) if profile is not None else 0
    if tokens:
        log.info("%d Linear layers over tokens and element-wise ops between them written over the tokens viewed as "
                 "[tokens, C, 1, 1] or as the map a Transpose made them of, one Reshape to that view and one back "
                 "around each chain: %s takes 4-D tensors only", tokens, profile.label)
        _fold_affine_into_conv(body)  # a layer scale per channel after a Linear, now a Conv
    widened = wide_flattens_as_convs(body, profile) if profile is not None else 0
    if widened:
        log.info("%d Gemm%s over flattened maps wider than the BPU's channel limit written as Convs over the maps",
                 widened, "" if widened == 1 else "s")
    # after BatchNorm1d became a depthwise conv between an Unsqueeze and a Squeeze: that Unsqueeze undoes a flatten
    if profile is not None and flattens_after_heads(body, profile):
        log.info("flattens of pooled maps moved after the Gemms reading them (1x1 Convs): %s has no BPU flatten",
                 profile.label)
    # after the dense layers became Convs above (VGG's 4096-wide fc7 and fc8 on RDK X3)
    pieces = bpu_forms.wide_convs_in_channel_pieces(body, profile, placed) if profile is not None else 0
    if pieces:
        log.info("%d Conv%s with more channels than the BPU's limit of %s written as Convs over pieces of their "
                 "channels (summed by Adds, or joined by a Concat for whole groups)", pieces,
                 "" if pieces == 1 else "s", profile.rule("Conv").channels)
    # last: the 4-D views above make the tensors whose broadcast over the channels this copies
    copied = bpu_forms.channel_broadcasts_as_convs(body, profile, placed) if profile is not None else 0
    if copied:
        log.info("%d element-wise ops of a map and a one-channel tensor read that channel copied to the map's "
                 "channels by a 1x1 Conv: %s does not broadcast over the channels", copied, profile.label)
    remove_dead_nodes(body)
    _restore_custom_nodes(body, cut)
    if not body.graph.node:
        _refuse_computing_nothing(body)
    out = _with_preprocess(body, pre_nodes, original_inputs, model)
    topological_sort(out)
    trace.follow(out)
    record_origins(out, trace.differing())
    record_fusions(out, trace.fused_into)
    # last: the rewrites above read the folded targets as they were
    batch_free_reshapes(out)
    log.info("Optimized model: %d nodes (from %d)", len(out.graph.node), len(model.graph.node))
    return compact(out)  # the rewrites above replaced weights in place: their old values are still held


def _refuse_computing_nothing(body: ModelProto) -> None:
    """A model onnxruntime folds to no node at all (only ``Shape(x)``) has nothing to run on the BPU or the
    CPU; said in the model's terms, before a later stage reads the empty optimized model back as unreadable."""
    inputs = {i.name for i in body.graph.input}
    outputs = [o.name for o in body.graph.output]
    passed = [o for o in outputs if o in inputs]
    what = "constants" if not passed else "inputs passed through" if len(passed) == len(outputs) else \
        "constants or inputs passed through"
    names = ", ".join(f"'{o}'" for o in outputs)
    raise HbError(f"the model computes nothing at run time: with its input shapes fixed, its outputs ({names}) are "
                  f"{what}", hint="they do not depend on the input values (a Shape of an input is a constant once "
                                  "the shape is fixed): use them as they are, or convert a model that computes on its "
                                  "inputs")


def _without_preprocess(model: ModelProto, pre_nodes: list) -> ModelProto:
    """The float body: each HzPreprocess output becomes a float graph input."""
    body = copy.deepcopy(model)
    shapes = GraphView(model).shapes
    pre_names = {n.name for n in pre_nodes}
    keep = [n for n in body.graph.node if n.name not in pre_names]
    del body.graph.node[:]
    body.graph.node.extend(keep)
    new_inputs = [i for i in body.graph.input if not any(i.name == n.input[0] for n in pre_nodes)]
    for n in pre_nodes:
        new_inputs.append(helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, shapes.get(n.input[0])))
    del body.graph.input[:]
    body.graph.input.extend(new_inputs)
    with_horizon_domain(body)
    return body


@dataclass
class _CustomCut:
    nodes: list[NodeProto]
    inputs: set[str]  # custom outputs, graph inputs of the body while onnxruntime optimizes it
    outputs: set[str]  # custom inputs, graph outputs of the body meanwhile (so they survive)
    constants: list[onnx.TensorProto]
    opsets: list[onnx.OperatorSetIdProto]


def _cut_custom_nodes(body: ModelProto) -> _CustomCut:
    """Take the custom CPU ops out of the body: onnxruntime cannot load them.

    Their outputs become body inputs and their inputs body outputs, so what
    onnxruntime rewrites around them keeps the tensor names they connect to.
    """
    nodes = [n for n in body.graph.node if custom.custom_op_of(n) is not None]
    if not nodes:
        return _CustomCut([], set(), set(), [], [])
    view = GraphView(body)
    shapes = view.shapes
    for n in nodes:
        body.graph.node.remove(n)
    outs = {o for n in nodes for o in n.output if o}
    ins = {i for n in nodes for i in n.input if i and i not in outs}
    consts = [t for t in body.graph.initializer if t.name in ins]
    produced = {o for n in body.graph.node for o in n.output}
    present = {o.name for o in body.graph.output}
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in [*body.graph.value_info, *body.graph.input]}
    extra_out = sorted(i for i in ins if i in produced and i not in present)
    body.graph.output.extend(helper.make_tensor_value_info(i, elem.get(i, onnx.TensorProto.FLOAT), None)
                             for i in extra_out)
    body.graph.input.extend(helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, shapes.get(o))
                            for o in sorted(outs))
    domains = {n.domain for n in nodes}
    opsets = [o for o in body.opset_import if o.domain in domains]
    return _CustomCut(nodes, outs, set(extra_out), consts, opsets)


def _restore_custom_nodes(body: ModelProto, cut: _CustomCut) -> None:
    if not cut.nodes:
        return
    kept_in = [i for i in body.graph.input if i.name not in cut.inputs]
    del body.graph.input[:]
    body.graph.input.extend(kept_in)
    kept_out = [o for o in body.graph.output if o.name not in cut.outputs]
    del body.graph.output[:]
    body.graph.output.extend(kept_out)
    have = {t.name for t in body.graph.initializer}
    body.graph.initializer.extend(t for t in cut.constants if t.name not in have)
    body.graph.node.extend(cut.nodes)
    imported = {o.domain for o in body.opset_import}
    body.opset_import.extend(o for o in cut.opsets if o.domain not in imported)
    topological_sort(body)
    remove_dead_nodes(body)


def _with_preprocess(body: ModelProto, pre_nodes: list, inputs: list, source: ModelProto) -> ModelProto:
    pre_outputs = {n.output[0] for n in pre_nodes}
    kept_inputs = [i for i in body.graph.input if i.name not in pre_outputs]
    del body.graph.input[:]
    # Keep the original input order: preprocessed inputs come back as the raw inputs.
    order = {i.name: k for k, i in enumerate(inputs)}
    merged = {i.name: i for i in kept_inputs}
    for i in inputs:
        merged[i.name] = i
    body.graph.input.extend(sorted(merged.values(), key=lambda vi: order.get(vi.name, len(order))))
    nodes = [*pre_nodes, *body.graph.node]
    del body.graph.node[:]
    body.graph.node.extend(nodes)
    body.ir_version = source.ir_version
    with_horizon_domain(body)
    out = infer_shapes(body)
    # An output after an op that shape inference does not know (a com.microsoft op of a model
    # onnxruntime optimized before us) keeps the shape the parsed model declares: the checker needs one.
    declared = {o.name: o for o in source.graph.output if o.type.tensor_type.HasField("shape")}
    for o in out.graph.output:
        if not o.type.tensor_type.HasField("shape") and o.name in declared:
            o.type.tensor_type.shape.CopyFrom(declared[o.name].type.tensor_type.shape)
    return out


def _recurrent_nodes(model: ModelProto) -> list[str]:
    """The names of the model's LSTM / GRU nodes (one per node: unnamed ones count too)."""
    return [n.name for n in model.graph.node if n.op_type in RECURRENT_OPS and n.domain in ("", "ai.onnx")]


def _function_ops(model: ModelProto) -> set[str]:
    """Types of the model's standard ops whose ONNX schema defines them by a function body."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return set()
    found = set()
    for op_type in {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}:
        try:
            schema = onnx.defs.get_schema(op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        if schema.has_function or schema.has_context_dependent_function:
            found.add(op_type)
    return found


def _onnxruntime_basic(model: ModelProto) -> ModelProto:
    for out in model.graph.output:  # stale output shapes make onnxruntime warn
        out.type.tensor_type.ClearField("shape")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "optimized.onnx")
        try:
            ort_session(model, optimized_model_path=path, per_node=True, rounding_fusions=True)
        except (*RUN_ERRORS, *LOAD_ERRORS) as e:  # the user's model: what onnxruntime cannot load is theirs to change
            raise HbError(f"onnxruntime cannot load the model, and hbtools computes with it: {last_line(e)}",
                          hint="export the model with ops, attributes and element types onnxruntime's CPU kernels "
                               "take (float32 for bfloat16)") from None
        optimized = onnx.load(path)
    optimized.ir_version = model.ir_version
    _fused_nodes_named_as_before(model, optimized)
    with_horizon_domain(optimized)
    # onnxruntime-only ops must never reach an artefact unless the model had them already (a model
    # quantized by onnxruntime carries com.microsoft ops of its own).
    own = {(n.domain, n.op_type) for n in model.graph.node}
    unexpected = {(n.domain, n.op_type) for n in optimized.graph.node if n.domain not in ("", "ai.onnx")} - own
    if unexpected:
        log.warning("onnxruntime's optimizations made ops the model does not have (%s); keeping the unoptimized "
                    "graph", ", ".join(sorted(f"{d}.{op}" for d, op in unexpected)))
        return model
    return optimized


def _fused_nodes_named_as_before(model: ModelProto, optimized: ModelProto) -> None:
    """Give a node onnxruntime fused the name of the node it was made from: onnxruntime names it
    ``<node>/<fusion>`` (``MatMul_0/MatMulAddFusion`` for a MatMul and Add made one Gemm), and the
    user's node_info, run_on_cpu and the debugger know the model's own names."""
    before = {n.name for n in model.graph.node if n.name}
    taken = {n.name for n in optimized.graph.node}
    for node in optimized.graph.node:
        if node.name in before or "/" not in node.name:
            continue
        parts = node.name.split("/")
        for k in range(len(parts) - 1, 0, -1):  # the longest prefix: model names may hold "/" themselves
            base = "/".join(parts[:k])
            if base in before and base not in taken:
                taken.discard(node.name)
                taken.add(base)
                node.name = base
                break


def _no_ops_removed(model: ModelProto) -> None:
    """Drop each node that hands its input on unchanged, also where it makes a graph output (onnxruntime
    keeps those, and neither has a BPU form, so it held the nodes before it on the CPU beside it): a Cast
    to the type its input already has (what a float16 export's Casts become once the parse stage
    computes the model in float32), an inference Dropout whose mask nobody reads, a Pad by zero amounts,
    a Resize to its own size, a Reshape or Flatten to the shape it has, a Slice of everything, and an Identity (a graph
    output that ``bpu_forms.splits_undoing_concats`` gave back as a piece). The producer writes the node's
    output instead, where the node is its only reader; otherwise the node's readers read its input."""
    while True:
        view = GraphView(model)
        outputs = set(view.graph_outputs)
        for node in model.graph.node:
            if node.domain not in ("", "ai.onnx") or not node.input or not _hands_on(node, view):
                continue
            src, out = node.input[0], node.output[0]
            producer = view.producer.get(src)
            if producer is not None and src not in outputs \
                    and sum(src in references(n) for n in model.graph.node) == 1:  # sub-graphs read by name too
                producer.output[list(producer.output).index(src)] = out
            elif out not in outputs:
                # the input has other readers (or is a graph input): the node's readers read it instead, inside the
                # bodies of an If or Loop too (a Dropout whose output a branch read stayed, "not supported")
                for reader in model.graph.node:
                    reader.input[:] = [src if name == out else name for name in reader.input]
                    _rename_in_bodies(reader, out, src)
            else:
                continue
            model.graph.node.remove(node)
            break
        else:
            return


def _single_picks_as_squeezes(model: ModelProto) -> None:
    """A Gather of one constant index (a scalar) along an axis of size 1 drops that axis and keeps every value: a
    Squeeze of it. torchvision's detection models pick ``images[0]`` of a batch of one so; on RDK X3 a Gather along
    the batch went to the CPU, where the Squeeze and the Unsqueeze after it go away
    (``bpu_forms.batch_squeezes_around_elementwise``)."""
    view = GraphView(model)
    for k, node in enumerate(model.graph.node):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        index = view.const(node.input[1])
        if index is None or index.ndim != 0 or int(index) not in (0, -1):
            continue
        shape = view.shapes.get(node.input[0])  # shape inference only for a model with such a pick
        axis = int(view.attrs(node).get("axis", 0))
        if not is_static(shape) or not -len(shape) <= axis < len(shape) or shape[axis] != 1:
            continue
        model.graph.node[k].CopyFrom(_axes_node(model, _opset(model), "Squeeze", node.input[0], node.output[0],
                                                [axis % len(shape)], node.name))


def _rename_in_bodies(node: NodeProto, old: str, new: str) -> None:
    """Inside the graphs ``node`` holds (an If's branches, a Loop's body) at any depth, read ``new`` where an input
    read the outer tensor ``old`` (names are unique across a model and its graphs: no body makes an ``old``)."""
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in graph.node:
                inner.input[:] = [new if name == old else name for name in inner.input]
                _rename_in_bodies(inner, old, new)
            for out in graph.output:  # a body output that is the outer tensor itself
                if out.name == old:
                    out.name = new


def _has_subgraph(node: NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _hands_on(node: NodeProto, view: GraphView) -> bool:
    """Whether ``node`` outputs its first input unchanged (see ``_no_ops_removed``)."""
    if node.op_type == "Identity":
        return True
    if node.op_type in ("Split", "Concat"):
        # into one piece, of one input: torchvision's detection models take ``list(images)`` of a batch of one and
        # join it again, which on RDK X3 put the input's normalisation on the CPU between two BPU subgraphs
        pieces = node.output if node.op_type == "Split" else [i for i in node.input if i]
        return len(node.output) == 1 and len(pieces) == 1 and _keeps_its_shape(node, view)
    if node.op_type == "Gather":
        # of the one index an axis of size 1 has, kept as an axis ([0]: ``x[[0]]``)
        index, shape = (view.const(node.input[1]) if len(node.input) > 1 else None), view.shapes.get(node.input[0])
        axis = int(view.attrs(node).get("axis", 0))
        return index is not None and index.size == 1 and index.ndim > 0 and _keeps_its_shape(node, view) and \
            -len(shape) <= axis < len(shape) and shape[axis] == 1
    if node.op_type == "Slice":
        # of everything, forwards: GhostNet's cat([x1, x2], 1)[:, :oup], where the halves make oup channels
        steps = view.const(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1)
        return _keeps_its_shape(node, view) and steps is not None and bool(np.all(steps == 1))
    if node.op_type == "Cast":
        return view.elem_types.get(node.input[0]) == view.attrs(node).get("to")
    if node.op_type == "Pad":
        # a Pad by nothing: torchvision's Swin pads its map to whole windows, F.pad(x, (0, 0, 0, W % 2, ...)),
        # by amounts that are all zero at the sizes the model is exported for
        pads = view.const(node.input[1]) if len(node.input) > 1 and node.input[1] else view.attrs(node).get("pads")
        return pads is not None and not np.asarray(pads).any()
    if node.op_type in ("Resize", "Upsample"):
        # to its own size: torchvision's detection transform resizes the image to the size it is exported at;
        # every mode but crop-and-resize then reads each pixel at its own coordinates
        mode = view.attrs(node).get("coordinate_transformation_mode", b"half_pixel")
        return _keeps_its_shape(node, view) and mode not in (b"tf_crop_and_resize", "tf_crop_and_resize")
    if node.op_type in ("Reshape", "Flatten"):
        # to the shape it already has: MobileOne's and FastViT's squeeze-and-excitation view their [N, C, 1, 1]
        # gate as (-1, C, 1, 1), which put the gate on the CPU on RDK X3, whose BPU has no Reshape
        return _keeps_its_shape(node, view)
    if node.op_type == "Dropout":
        mask_read = len(node.output) > 1 and node.output[1] and (
            node.output[1] in view.consumers or node.output[1] in view.graph_outputs)
        training = node.input[2] if len(node.input) > 2 else ""
        return not mask_read and (not training or (view.is_const(training) and not view.const(training).any()))
    return False


def _keeps_its_shape(node: NodeProto, view: GraphView) -> bool:
    """Whether ``node``'s output has its first input's shape, static."""
    shape = view.shapes.get(node.input[0])
    return is_static(shape) and shape == view.shapes.get(node.output[0])


def _sums_as_adds(model: ModelProto) -> None:
    """``Sum`` (Caffe2's and old exporters' residual joins) as a chain of ``Add``: the BPU op.

    The chain adds in input order, as onnxruntime's Sum does, so the float model is unchanged.
    """
    nodes = []
    for node in model.graph.node:
        ins = [i for i in node.input if i]
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or len(ins) < 2:
            nodes.append(node)
            continue
        acc = ins[0]
        for k, term in enumerate(ins[1:], start=1):
            last = k == len(ins) - 1
            out = node.output[0] if last else f"{node.output[0]}_sum{k}"
            name = node.name if last else f"{node.name}_sum{k}"
            nodes.append(helper.make_node("Add", [acc, term], [out], name=name))
            acc = out
    del model.graph.node[:]
    model.graph.node.extend(nodes)


_MOVEMENTS = ("Transpose", "Squeeze")


def _before_movement(value: np.ndarray, moved: NodeProto, view: GraphView) -> np.ndarray | None:
    """A constant that broadcasts against the output of Transpose / Squeeze ``moved``, as the constant that
    broadcasts the same way against its input (None: it has more axes than that output)."""
    out = view.shapes.get(moved.output[0])
    shape = view.shapes.get(moved.input[0])
    if out is None or shape is None or value.ndim > len(out):
        return None
    value = value.reshape((1,) * (len(out) - value.ndim) + value.shape)
    if moved.op_type == "Transpose":
        perm = view.attrs(moved).get("perm", list(range(len(out)))[::-1])
        value = np.transpose(value, np.argsort(perm))
    else:
        a = view.attrs(moved)
        axes = a["axes"] if "axes" in a else view.const(moved.input[1]) \
            if len(moved.input) > 1 and moved.input[1] and view.is_const(moved.input[1]) else None
        if axes is None:
            return None
        value = np.expand_dims(value, tuple(int(x) % len(shape) for x in axes))
    # one value per channel (axis 1) or one in all: anything else is no affine map of the conv's channels
    return value if all(d == 1 for k, d in enumerate(value.shape) if k != 1) else None


def _fold_affine_into_conv(model: ModelProto) -> None:
    """Conv/ConvTranspose -> Mul(c) / Add(c) / Sub(c) / Div(c), c per-channel or scalar: fold into W and B.

    Also through a Transpose or Squeeze between them (a converter that moves the channels last, or drops
    the batch axis, before a BatchNormalization written as Mul and Add) where the constant is still one
    value per channel of the conv's output: the movement then reads the folded conv's output."""
    changed = True
    while changed:
        changed = False
        view = GraphView(model)
        for node in model.graph.node:
            if node.op_type not in ("Mul", "Add", "Sub", "Div"):
                continue
            act = [i for i in node.input if not view.is_const(i)]
            if len(act) != 1:
                continue
            conv = view.producer.get(act[0])
            moved = None  # a Transpose / Squeeze between the conv and the affine op
            if conv is not None and conv.op_type in _MOVEMENTS and conv.domain in ("", "ai.onnx") \
                    and len(view.consumers.get(act[0], [])) == 1 and act[0] not in view.graph_outputs:
                moved, conv = conv, view.producer.get(conv.input[0])
            source = moved.input[0] if moved is not None else act[0]
            if conv is None or conv.op_type not in ("Conv", "ConvTranspose") \
                    or len(view.consumers.get(source, [])) != 1:
                continue
            if source in view.graph_outputs or not view.is_const(conv.input[1]):
                continue
            if len(conv.input) > 2 and not view.is_const(conv.input[2]):
                continue
            const_name = next(i for i in node.input if view.is_const(i))
            if node.op_type in ("Sub", "Div") and node.input[1] != const_name:
                continue  # c - x and c / x are not affine in x
            weight = view.const(conv.input[1]).astype(np.float64)
            # ConvTranspose weights are [C_in, C_out / group, k...]: output channels on axis 1.
            transposed = conv.op_type == "ConvTranspose"
            group = int(view.attrs(conv).get("group", 1))
            channels = weight.shape[1] * group if transposed else weight.shape[0]
            if transposed and group != 1 and node.op_type in ("Mul", "Div"):
                continue
            value = view.const(const_name).astype(np.float64)
            if moved is not None:
                value = _before_movement(value, moved, view)
            c = None if value is None else per_channel_const(value, channels)
            if c is None:
                continue
            bias = view.const(conv.input[2]).astype(np.float64) if len(conv.input) > 2 and conv.input[2] \
                else np.zeros(channels)
            along = [1, -1] + [1] * (weight.ndim - 2) if transposed else [-1] + [1] * (weight.ndim - 1)
            if node.op_type == "Mul":
                weight, bias = weight * c.reshape(along), bias * c
            elif node.op_type == "Div":
                weight, bias = weight / c.reshape(along), bias / c
            elif node.op_type == "Add":
                bias = bias + c
            else:
                bias = bias - c
            if moved is None:
                _set_conv_params(model, conv, weight, bias, node.output[0])
            else:  # the movement now makes what the affine op made
                _set_conv_params(model, conv, weight, bias, conv.output[0])
                moved.output[0] = node.output[0]
            model.graph.node.remove(node)
            changed = True
            break


def _set_conv_params(model: ModelProto, conv, weight: np.ndarray, bias: np.ndarray, new_output: str) -> None:
    w_name, b_name = f"{conv.name}_weight_folded", f"{conv.name}_bias_folded"
    for name in (w_name, b_name):
        for t in list(model.graph.initializer):
            if t.name == name:
                model.graph.initializer.remove(t)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(weight.astype(np.float32), w_name),
            numpy_helper.from_array(bias.astype(np.float32), b_name),
        ]
    )
    conv.input[1] = w_name
    if len(conv.input) > 2:
        conv.input[2] = b_name
    else:
        conv.input.append(b_name)
    conv.output[0] = new_output


def _affine_to_depthwise_conv(model: ModelProto) -> bool:
    """Mul / Add / Sub by a per-channel constant of a 4-D tensor no conv precedes (a BatchNormalization
    an exporter wrote as Mul + Add after an activation): a depthwise 1x1 Conv, which the BPU runs."""
    view = GraphView(model)
    changed = False
    for node in list(model.graph.node):
        if node.op_type not in ("Mul", "Add", "Sub") or len(node.input) != 2:
            continue
        act = [i for i in node.input if not view.is_const(i)]
        shape = view.shapes.get(act[0]) if len(act) == 1 else None
        if shape is None or len(shape) != 4 or not isinstance(shape[1], int) or shape[1] <= 1:
            continue
        const_name = next(i for i in node.input if view.is_const(i))
        if node.op_type == "Sub" and node.input[1] != const_name:
            continue  # c - x
        value = view.const(const_name).astype(np.float64)
        c = per_channel_const(value, shape[1]) if value.ndim in (3, 4) and value.size == shape[1] else None
        if c is None:
            continue  # scalars stay lookup tables; other shapes are no per-channel affine
        weight = c if node.op_type == "Mul" else np.ones(shape[1])
        bias = np.zeros(shape[1]) if node.op_type == "Mul" else (c if node.op_type == "Add" else -c)
        conv = helper.make_node("Conv", [act[0], "", ""], [node.output[0]], name=node.name, group=shape[1],
                                kernel_shape=[1, 1])
        index = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        model.graph.node.insert(index, conv)
        _set_conv_params(model, model.graph.node[index], weight.reshape(-1, 1, 1, 1), bias, node.output[0])
        changed = True
    return changed


def _batchnorm_affine(node: NodeProto, view: GraphView) -> tuple[np.ndarray, np.ndarray] | None:
    """A BatchNormalization (inference form, constant statistics) as per-channel ``k * x + shift``."""
    if node.op_type != "BatchNormalization" or len(node.output) != 1:
        return None
    params = [view.const(i) for i in node.input[1:5]]
    if any(p is None for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    k = gamma / np.sqrt(var + view.attrs(node).get("epsilon", 1e-5))
    return k, beta - mean * k


def _fold_batchnorm_into_gemm(model: ModelProto) -> None:
    """A BatchNormalization of a 2-D [N, C] tensor that only a Gemm, or a MatMul by a constant weight
    (with an Add of a constant bias), produces (``nn.Linear`` + ``nn.BatchNorm1d``: ArcFace embedding
    heads, MLPs) folds into that layer's weight columns and bias, as onnxruntime folds it into a Conv.
    The layer becomes one Gemm (``beta`` 1, the bias its C) named after the layer."""
    changed = True
    while changed:
        changed = False
        view = GraphView(model)
        for node in model.graph.node:
            affine = _batchnorm_affine(node, view)
            shape = view.shapes.get(node.input[0]) if affine is not None else None
            if shape is None or len(shape) != 2:
                continue
            layer = _gemm_like(node.input[0], view, affine[0].size)
            if layer is None:
                if _fold_through_rows(model, node, view, affine):
                    changed = True
                    break
                continue
            k, shift = affine
            gemm, a, weight, bias, transposed, alpha, dropped = layer
            weight = weight * (k[:, None] if transposed else k[None, :])  # scale each output column
            bias = shift if bias is None else bias * k + shift
            names = (f"{gemm.name}_weight_folded", f"{gemm.name}_bias_folded")
            kept = [t for t in model.graph.initializer if t.name not in names]
            del model.graph.initializer[:]
            model.graph.initializer.extend([*kept, numpy_helper.from_array(weight.astype(np.float32), names[0]),
                                            numpy_helper.from_array(bias.astype(np.float32), names[1])])
            attrs = {"alpha": alpha, "beta": 1.0, "transB": int(transposed)}
            if gemm.op_type == "Gemm":
                attrs["transA"] = int(view.attrs(gemm).get("transA", 0))
            folded = helper.make_node("Gemm", [a, *names], [node.output[0]], name=gemm.name, **attrs)
            index = list(model.graph.node).index(gemm)
            for gone in [gemm, node, *dropped]:
                model.graph.node.remove(gone)
            model.graph.node.insert(index, folded)
            changed = True
            break


def _fold_through_rows(model: ModelProto, bn: NodeProto, view: GraphView,
                       affine: tuple[np.ndarray, np.ndarray]) -> bool:
    """LeViT's Linear_BN: a MatMul of a [..., K] activation by a constant [K, C] weight (maybe + a constant
    bias), a Reshape of its result to rows [M, C] (the leading axes merged), then the BatchNormalization.
    The activation is reshaped to rows first, and one Gemm with the BatchNorm in its weight columns and bias
    makes the BatchNorm's output (the form onnxruntime gives a MatMul + Add of such a tensor). Whether it
    folded."""
    reshape = view.producer.get(bn.input[0])
    if reshape is None or reshape.op_type != "Reshape" or len(view.consumers.get(bn.input[0], [])) != 1 \
            or bn.input[0] in view.graph_outputs:
        return False
    k, shift = affine
    shape = view.shapes.get(reshape.input[0])
    layer = _gemm_like(reshape.input[0], view, k.size, rows=True) \
        if shape is not None and len(shape) >= 3 and shape[-1] == k.size else None
    if layer is None or layer[0].op_type != "MatMul":
        return False
    matmul, a, weight, bias, _, _, dropped = layer
    a_shape = view.shapes.get(a)
    if not is_static(a_shape):
        return False
    names = (f"{matmul.name}_weight_folded", f"{matmul.name}_bias_folded", f"{matmul.name}_rows_shape")
    model.graph.initializer.extend([
        numpy_helper.from_array((weight * k[None, :]).astype(np.float32), names[0]),
        numpy_helper.from_array((shift if bias is None else bias.reshape(-1) * k + shift).astype(np.float32),
                                names[1]),
        numpy_helper.from_array(np.array([-1, a_shape[-1]], np.int64), names[2])])
    rows = f"{a}_{matmul.name}_rows"
    index = list(model.graph.node).index(matmul)
    for gone in [matmul, *dropped, reshape, bn]:
        model.graph.node.remove(gone)
    model.graph.node.insert(index, helper.make_node("Reshape", [a, names[2]], [rows], name=f"{matmul.name}_rows"))
    model.graph.node.insert(index + 1, helper.make_node("Gemm", [rows, names[0], names[1]], [bn.output[0]],
                                                        name=matmul.name))
    return True


def _gemm_like(x: str, view: GraphView, channels: int, rows: bool = False) -> tuple | None:
    """The layer that produces 2-D ``x`` and nothing else reads, as (node that multiplies, its activation
    input, weight, bias or None (beta applied), weight transposed, alpha, other nodes it takes):
    a Gemm with a constant B (and C), or a MatMul by a constant [K, C] weight, maybe then an Add of a
    constant bias. With ``rows``, a MatMul's activation may have any rank of at least 2 (``x`` then too).
    None for anything else."""
    def only_use(t: str) -> bool:
        return len(view.consumers.get(t, [])) == 1 and t not in view.graph_outputs

    node = view.producer.get(x)
    if node is None or not only_use(x):
        return None
    dropped = []
    bias = None
    if node.op_type == "Add" and len(node.input) == 2:
        const = [i for i in node.input if view.is_const(i)]
        act = [i for i in node.input if not view.is_const(i)]
        matmul = view.producer.get(act[0]) if len(const) == 1 and len(act) == 1 else None
        if matmul is None or matmul.op_type != "MatMul" or not only_use(act[0]):
            return None
        bias = view.const(const[0]).astype(np.float64)
        if bias.ndim > 2 or bias.shape[-1] not in (1, channels):
            return None
        dropped, node = [node], matmul
    if node.op_type == "MatMul":
        weight = view.const(node.input[1])
        a_shape = view.shapes.get(node.input[0])
        if weight is None or weight.ndim != 2 or weight.shape[1] != channels or a_shape is None \
                or not (len(a_shape) >= 2 if rows else len(a_shape) == 2):
            return None
        return node, node.input[0], weight.astype(np.float64), bias, False, 1.0, dropped
    if node.op_type != "Gemm":
        return None
    attrs = view.attrs(node)
    weight = view.const(node.input[1])
    transposed = bool(attrs.get("transB", 0))
    has_c = len(node.input) > 2 and bool(node.input[2])
    c = view.const(node.input[2]) if has_c else None
    if weight is None or weight.ndim != 2 or weight.shape[0 if transposed else 1] != channels or (has_c and c is None):
        return None
    if c is not None:
        bias = c.astype(np.float64) * float(attrs.get("beta", 1.0))
        if bias.ndim > 2 or (bias.ndim and bias.shape[-1] not in (1, channels)):
            return None
    return node, node.input[0], weight.astype(np.float64), bias, transposed, float(attrs.get("alpha", 1.0)), dropped


def _batchnorm_to_depthwise_conv(model: ModelProto) -> None:
    """Each remaining BatchNormalization of a 4-D tensor becomes a depthwise 1x1 Conv, of a 5-D one
    (a BatchNorm3d after an activation) a depthwise 1x1x1 Conv; of a 3-D tensor [N, C, L] (after a
    Squeeze, in sequence heads) or a 2-D one [N, C] (a BatchNorm1d no Gemm folds) the 1x1 Conv
    between an Unsqueeze and a Squeeze, so it runs on the BPU too."""
    view = GraphView(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    for node in list(model.graph.node):
        affine = _batchnorm_affine(node, view)
        shape = view.shapes.get(node.input[0]) if affine is not None else None
        rank = len(shape) if shape is not None else 0
        if rank not in (2, 3, 4, 5):
            continue
        k, shift = affine
        channels = k.size
        x, y = node.input[0], node.output[0]
        nodes = []
        axes = list(range(rank, 4))  # the axes that make the tensor 4-D
        if axes:
            x, y = f"{node.input[0]}_{node.name}_4d", f"{node.output[0]}_4d"
            nodes.append(_axes_node(model, opset, "Unsqueeze", node.input[0], x, axes, f"{node.name}_unsqueeze"))
        kernel = [1] * (max(rank, 4) - 2)
        nodes.append(helper.make_node("Conv", [x, "", ""], [y], name=node.name, group=channels, kernel_shape=kernel))
        if axes:
            nodes.append(_axes_node(model, opset, "Squeeze", y, node.output[0], axes, f"{node.name}_squeeze"))
        index = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        for k_node, new in enumerate(nodes):
            model.graph.node.insert(index + k_node, new)
        conv = model.graph.node[index + (1 if axes else 0)]  # protobuf inserted a copy; edit that one
        _set_conv_params(model, conv, k.reshape(-1, 1, *kernel), shift, y)
