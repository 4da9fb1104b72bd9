"""Exporter patterns in forms the BPU takes (the optimize stage's rewrites).

Each function rewrites a model in place. The new nodes compute the same values as the
pattern (float results agree to float32 rounding): sums in another order, the same data
moved another way. docs/checker.md lists them with the exports they come from.

The rewrites live in modules by the kind of node they rewrite; every one is importable from here.
"""

from hbtools.graph.bpu_forms.activations import softplus_thresholds_dropped
from hbtools.graph.bpu_forms.branches import parallel_convs_merged
from hbtools.graph.bpu_forms.convs import (
    conv_transposes_over_phases,
    convs_in_kernel_pieces,
    convs_without_dead_taps,
    dilated_convs_by_phases,
    large_patch_convs_as_space_to_depth,
    row_convs_as_stacked_rows,
    shifts_into_next_convs,
    strided_convs_over_phases,
    wide_convs_in_channel_pieces,
)
from hbtools.graph.bpu_forms.elementwise import (
    batch_squeezes_around_elementwise,
    channel_broadcasts_as_convs,
    constant_scatters_as_masks,
    divisions_as_reciprocal_products,
    expands_as_tiles,
    expands_into_broadcasts,
    squeeze_unsqueeze_pairs,
    uniform_constants_as_scalars,
)
from hbtools.graph.bpu_forms.layout import (
    channel_gathers_into_convs,
    channel_shuffles_as_gathers,
    pixel_unshuffles_as_space_to_depth,
    sequences_as_concats,
    splits_undoing_concats,
    transposes_in_fewer_axes,
    unfolds_as_slices,
)
from hbtools.graph.bpu_forms.linear_maps import cumsums_as_matmuls, spatial_index_maps_as_matmuls
from hbtools.graph.bpu_forms.matmuls import (
    einsums_as_matmuls,
    gemms_with_the_first_input_transposed,
    matmuls_of_batched_weights,
    matmuls_of_vectors,
    matmuls_read_in_slices,
    matmuls_with_the_weight_second,
)
from hbtools.graph.bpu_forms.pads import (
    auto_pads_as_pads,
    constant_pads_as_concats,
    conv_transpose_output_shapes_as_pads,
    crops_as_slices,
    zero_pads_into_convs,
)
from hbtools.graph.bpu_forms.pools import (
    average_pools_over_whole_windows,
    large_average_pools_in_steps,
    large_max_pools_in_steps,
    pools_over_one_axis_as_2d,
)
from hbtools.graph.bpu_forms.reductions import (
    axis_reductions_as_pools,
    channel_reductions_as_convs,
    lp_normalizations_as_divisions,
    norms_as_sums,
    reductions_over_the_first_axis,
    scalar_reductions_kept_as_maps,
    spatial_reductions_as_global_pools,
)
from hbtools.graph.bpu_forms.resizes import (
    interpolations_as_matmuls,
    resizes_of_one_axis_as_2d,
    upsampling_by_whole_factors,
)
from hbtools.graph.bpu_forms.rows import one_row_chains_as_4d
from hbtools.graph.bpu_forms.tokens import token_mlps_as_4d

__all__ = [
    "auto_pads_as_pads",
    "average_pools_over_whole_windows",
    "batch_squeezes_around_elementwise",
    "constant_scatters_as_masks",
    "squeeze_unsqueeze_pairs",
    "uniform_constants_as_scalars",
    "channel_broadcasts_as_convs",
    "channel_gathers_into_convs",
    "channel_reductions_as_convs",
    "channel_shuffles_as_gathers",
    "constant_pads_as_concats",
    "conv_transpose_output_shapes_as_pads",
    "conv_transposes_over_phases",
    "convs_in_kernel_pieces",
    "convs_without_dead_taps",
    "crops_as_slices",
    "cumsums_as_matmuls",
    "dilated_convs_by_phases",
    "divisions_as_reciprocal_products",
    "einsums_as_matmuls",
    "gemms_with_the_first_input_transposed",
    "expands_as_tiles",
    "expands_into_broadcasts",
    "interpolations_as_matmuls",
    "large_average_pools_in_steps",
    "large_max_pools_in_steps",
    "large_patch_convs_as_space_to_depth",
    "shifts_into_next_convs",
    "matmuls_of_batched_weights",
    "matmuls_of_vectors",
    "matmuls_read_in_slices",
    "matmuls_with_the_weight_second",
    "lp_normalizations_as_divisions",
    "norms_as_sums",
    "one_row_chains_as_4d",
    "parallel_convs_merged",
    "pixel_unshuffles_as_space_to_depth",
    "pools_over_one_axis_as_2d",
    "reductions_over_the_first_axis",
    "row_convs_as_stacked_rows",
    "resizes_of_one_axis_as_2d",
    "scalar_reductions_kept_as_maps",
    "sequences_as_concats",
    "softplus_thresholds_dropped",
    "spatial_index_maps_as_matmuls",
    "spatial_reductions_as_global_pools",
    "axis_reductions_as_pools",
    "splits_undoing_concats",
    "strided_convs_over_phases",
    "wide_convs_in_channel_pieces",
    "token_mlps_as_4d",
    "transposes_in_fewer_axes",
    "unfolds_as_slices",
    "upsampling_by_whole_factors",
    "zero_pads_into_convs",
]
