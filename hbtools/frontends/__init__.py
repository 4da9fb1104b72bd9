"""Readers that turn models of other frameworks into ONNX at the parse stage."""
