"""Compatibility package: the vendor's custom-op import path (``horizon_nn.custom.op_registration``)."""
