"""ImageNet-1k class names by class index, as the vendor's classification post-processing reads
them: ``from horizon_tc_ui.data.imagenet_val import imagenet_val``, then ``imagenet_val[index]``, a list
of one string (``['red-breasted merganser, Mergus serrator']``); ``imagenet_val[index][0]`` is the string.

The names are the WordNet lemmas of the 1000 ILSVRC-2012 synsets in their usual (sorted WordNet
id) order, as timm 1.0.31 ships them (``timm/data/_info``, Apache-2.0), in
``hbtools/data/imagenet_classes.txt``.
"""

from importlib import resources

_NAMES = resources.files("hbtools.data").joinpath("imagenet_classes.txt").read_text(encoding="utf-8").splitlines()
# Each entry is a one-element list holding the class's names as one string, as the vendor's table has it:
# its samples print the entry (``class ['goose']``) and take ``imagenet_val[label][0]`` as the class name.
imagenet_val: dict[int, list[str]] = {index: [names] for index, names in enumerate(_NAMES)}

__all__ = ["imagenet_val"]
