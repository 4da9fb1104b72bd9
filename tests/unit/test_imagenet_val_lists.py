"""``horizon_tc_ui.data.imagenet_val`` entries are one-element lists, as the vendor's are (hunt 29 D2): the
classification samples print an entry (``class ['goose']``) and take ``imagenet_val[label][0]`` as the name,
which on a plain string gave its first letter."""

from __future__ import annotations

import numpy as np

from horizon_tc_ui.data.imagenet_val import imagenet_val


def test_each_entry_is_a_list_of_one_name_string() -> None:
    assert sorted(imagenet_val) == list(range(1000))
    assert all(isinstance(v, list) and len(v) == 1 and isinstance(v[0], str) and v[0] for v in imagenet_val.values())
    assert imagenet_val[99] == ["goose"]
    assert imagenet_val[98] == ["red-breasted merganser, Mergus serrator"]


def test_the_samples_idioms_give_the_whole_name() -> None:
    label = int(np.argmax(np.eye(1000)[99]))
    assert f"class {imagenet_val[label]}" == "class ['goose']"  # the vendor's cls_inference log line
    assert f"class_name: {imagenet_val[np.int64(label)][0]}" == "class_name: goose"  # its postprocess.py
