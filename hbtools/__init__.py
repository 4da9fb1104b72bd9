"""hbtools: post-training quantization toolchain compatible with hb_mapper."""

__version__ = "0.1.0"
