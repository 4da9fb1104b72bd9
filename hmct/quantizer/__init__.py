"""Compatibility package: the newest toolkit imports the debugger as ``hmct.quantizer.debugger``."""
