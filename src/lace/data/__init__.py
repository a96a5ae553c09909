"""Image-text data: one dataset abstraction, readers for COCO, Karpathy, CSV and webdataset."""

from lace.data.dataset import ImageTextDataset, ImageTextRecord
from lace.data.readers import (
    read_coco_captions,
    read_csv,
    read_dataset,
    read_karpathy,
    read_webdataset,
)

__all__ = [
    "ImageTextDataset", "ImageTextRecord", "read_coco_captions", "read_csv", "read_dataset",
    "read_karpathy", "read_webdataset",
]
