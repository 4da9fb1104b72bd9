"""ImageNet-1k class names by class index, as the vendor's classification post-processing reads
them: ``from horizon_tc_ui.data.imagenet_val import imagenet_val``, then ``imagenet_val[index]``.

The names are the WordNet lemmas of the 1000 ILSVRC-2012 synsets in their usual (sorted WordNet
id) order, as timm 1.0.31 ships them (``timm/data/_info``, Apache-2.0), in
``hbtools/data/imagenet_classes.txt``.
"""

from importlib import resources

_NAMES = resources.files("hbtools.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8").splitlines()
imagenet_val: dict[int, str] = dict(enumerate(_NAMES))

__all__ = ["imagenet_val"]
