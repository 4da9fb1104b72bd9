"""Compatibility import: ``import horizon_nn.debug as dbg`` is ``hbtools.debug``."""

from hbtools.debug import (
    get_channelwise_data_distribution,
    get_sensitivity_of_nodes,
    plot_acc_error,
    plot_distribution,
    runall,
    sensitivity_analysis,
)

__all__ = [
    "get_channelwise_data_distribution",
    "get_sensitivity_of_nodes",
    "plot_acc_error",
    "plot_distribution",
    "runall",
    "sensitivity_analysis",
]
