"""The accuracy debugger: which nodes of a calibrated model cost accuracy, and why.

Every function takes a calibrated model (``*_calibrated_model.onnx`` or an
``onnx.ModelProto``) and the ``calibration_data`` folder that ``debug_mode:
'dump_calibration_data'`` writes (or a dataset object). The command line
``hmct-debugger`` exposes the same functions.
"""

from hbtools.debug.accumulate import plot_acc_error
from hbtools.debug.analysis import sensitivity_analysis
from hbtools.debug.channelwise import get_channelwise_data_distribution
from hbtools.debug.distribution import plot_distribution
from hbtools.debug.runall import runall
from hbtools.debug.sensitivity import get_sensitivity_of_nodes

__all__ = [
    "get_channelwise_data_distribution",
    "get_sensitivity_of_nodes",
    "plot_acc_error",
    "plot_distribution",
    "runall",
    "sensitivity_analysis",
]
