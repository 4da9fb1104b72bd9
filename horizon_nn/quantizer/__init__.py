"""Compatibility package: newer toolkit releases import the debugger as ``horizon_nn.quantizer.debugger``."""
