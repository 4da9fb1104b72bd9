"""Compatibility import: op files written for the vendor toolkit register into ``hbtools.ops.custom``."""

from hbtools.ops.custom import op_implement_register, op_shape_infer_register

__all__ = ["op_implement_register", "op_shape_infer_register"]
