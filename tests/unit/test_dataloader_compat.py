"""horizon_tc_ui.data.dataloader: the sample scripts' loaders read, transform and batch pictures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from hbtools.data.transforms import CenterCropTransformer, HWC2CHWTransformer, read_image
from hbtools.errors import HbError
from horizon_tc_ui.data.dataloader import ImageNetDataLoader, SingleImageDataLoader, SingleImageDataLoaderWithOrigin

RNG = np.random.default_rng(5)


def write_png(path: Path, h: int = 10, w: int = 12) -> np.ndarray:
    rgb = RNG.integers(0, 256, size=(h, w, 3)).astype(np.uint8)
    PIL.Image.fromarray(rgb).save(path)
    return rgb


def chain() -> list:
    return [CenterCropTransformer(crop_size=8), HWC2CHWTransformer()]


def test_single_image_loader_gives_one_transformed_picture_with_a_batch_axis(tmp_path: Path):
    rgb = write_png(tmp_path / "cat.png")
    data = SingleImageDataLoader(chain(), tmp_path / "cat.png", imread_mode="opencv")
    assert data.shape == (1, 3, 8, 8) and data.dtype == np.float32  # CenterCrop's data_type='float', as the vendor's
    bgr = rgb[..., ::-1]  # what cv2.imread gives for a PNG
    np.testing.assert_array_equal(data[0], bgr[1:9, 2:10].transpose(2, 0, 1))


def test_single_image_loader_in_skimage_mode_is_read_image_then_the_transformers(tmp_path: Path):
    write_png(tmp_path / "cat.png")
    data = SingleImageDataLoader(chain(), str(tmp_path / "cat.png"), imread_mode="skimage")
    expected = read_image(tmp_path / "cat.png", "skimage")[1:9, 2:10].transpose(2, 0, 1).astype(np.float32)
    np.testing.assert_array_equal(data, expected[None])


def test_with_origin_also_gives_the_picture_as_read(tmp_path: Path):
    rgb = write_png(tmp_path / "dog.png")
    origin, data = SingleImageDataLoaderWithOrigin(chain(), tmp_path / "dog.png", imread_mode="opencv")
    np.testing.assert_array_equal(np.squeeze(origin), rgb[..., ::-1])
    assert data.shape == (1, 3, 8, 8)


@pytest.fixture
def imagenet_folder(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    pictures = {f"val_{i}.png": write_png(tmp_path / f"val_{i}.png") for i in range(3)}
    labels = tmp_path / "val.txt"
    labels.write_text("val_0.png 65\nval_1.png 970\n\nval_2.png 0\n")
    return tmp_path, labels, pictures


def test_imagenet_loader_batches_pictures_with_labels_and_names(imagenet_folder):
    folder, labels, pictures = imagenet_folder
    loader = ImageNetDataLoader(chain(), folder, labels, imread_mode="opencv", batch_size=2, return_img_name=True)
    assert len(loader) == 2
    batches = list(loader)
    (data0, labels0, names0), (data1, labels1, names1) = batches
    assert data0.shape == (2, 3, 8, 8) and data1.shape == (1, 3, 8, 8)
    np.testing.assert_array_equal(labels0, [65, 970])
    np.testing.assert_array_equal(labels1, [0])
    assert names0 == ["val_0.png", "val_1.png"] and names1 == ["val_2.png"]
    np.testing.assert_array_equal(data1[0], pictures["val_2.png"][1:9, 2:10, ::-1].transpose(2, 0, 1))


def test_imagenet_loader_as_the_classification_samples_use_it(imagenet_folder):
    folder, labels, _ = imagenet_folder
    loader = ImageNetDataLoader(chain(), folder, labels, imread_mode="skimage")
    data, label = next(loader)  # without names: (data, labels)
    assert data.shape == (1, 3, 8, 8)
    assert 65 == label  # the samples compare a predicted class with the batch's label like this


def test_imagenet_loader_says_which_label_line_is_wrong(imagenet_folder):
    folder, labels, _ = imagenet_folder
    labels.write_text("val_0.png 65\nval_1.png\n")
    with pytest.raises(HbError, match=r"val.txt:2: expected '<image file> <class number>'"):
        ImageNetDataLoader(chain(), folder, labels)
    with pytest.raises(HbError, match="batch_size"):
        ImageNetDataLoader(chain(), folder, labels.with_name("missing.txt"), batch_size=0)
    with pytest.raises(HbError, match="cannot read the label file"):
        ImageNetDataLoader(chain(), folder, labels.with_name("missing.txt"))
