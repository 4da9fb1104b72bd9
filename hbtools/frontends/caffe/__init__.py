"""Caffe 1.0 front end: a deploy prototxt plus its .caffemodel become an ONNX model.

``load_caffe`` is what the parse stage calls for ``--model-type caffe``; the
message classes (``proto.NetParameter`` ...) let tests and tools write Caffe files.
"""

from hbtools.frontends.caffe.convert import SUPPORTED_TYPES
from hbtools.frontends.caffe.convert import caffe_to_onnx as load_caffe

__all__ = ["SUPPORTED_TYPES", "load_caffe"]
