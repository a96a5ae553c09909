"""SugarCrepe (Hsieh et al., 2023): seven files of (COCO image, caption, hard negative).

Layout: `<root>/{add_att,add_obj,replace_att,replace_obj,replace_rel,swap_att,swap_obj}.json`,
each a dict id -> {"filename", "caption", "negative_caption"}, and the COCO val2017 images
(default `<root>/val2017`). Score as the authors' `main_eval.py`: share of items with
s(image, caption) > s(image, negative_caption) (a tie is wrong), per file; `mean` over the
seven files (those with items scored, when images are missing and skipped) is lace's addition. So is the split of the two swap files by words (`pairs.same_words_split`):
`swap_att/same_words`, `swap_att/other`, `swap_att/same_words_share`, the same for `swap_obj`; the files'
own figures and `mean` stay the authors'.
"""

from __future__ import annotations

from pathlib import Path

from lace.errors import LaceInputError
from lace.eval.benchmarks.base import (
    Benchmark,
    register_benchmark,
    text_field,
)
from lace.eval.benchmarks.pairs import PairItems, pair_scores, same_words_split
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import pairwise_accuracy
from lace.io import read_json

SUGARCREPE_FILES = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SWAP_FILES = ("swap_att", "swap_obj")
COCO_URL = "cocodataset.org (val2017 images)"


@register_benchmark("sugarcrepe")
class SugarCrepe(Benchmark):
    published_at = "github.com/RAIVNLab/sugar-crepe"
    image_folder_flag = "--sugarcrepe-images"

    def load(self, root: str | Path, image_root: str | Path | None = None) -> dict[str, PairItems]:
        root = Path(root)
        image_root = Path(image_root) if image_root is not None else root / "val2017"
        if not image_root.is_dir():
            raise LaceInputError(
                f"sugarcrepe: image folder not found: {image_root}; SugarCrepe uses the COCO val2017 "
                f"images, published at {COCO_URL} (pass the folder as the image root)"
            )
        data = {}
        for name in SUGARCREPE_FILES:
            path = self.require_file(root / f"{name}.json")
            items = read_json(path, dict, "a JSON object of id -> item")
            pairs = PairItems()
            for key, item in items.items():
                pairs.image_paths.append(str(image_root / text_field(item, "filename", path, key)))
                pairs.captions.append(text_field(item, "caption", path, key))
                pairs.negatives.append(text_field(item, "negative_caption", path, key))
            data[name] = self.usable(name, pairs, [[path] for path in pairs.image_paths], COCO_URL)
        return data

    def score(self, cache: EmbeddingCache, data: dict[str, PairItems]) -> dict[str, float]:
        figures, split = {}, {}
        for name, items in data.items():
            positive, negative = pair_scores(cache, items)
            figures[name] = pairwise_accuracy(positive, negative)
            if name in SWAP_FILES:
                split.update(same_words_split((positive > negative).numpy(), items.captions, items.negatives, name))
        scored = [value for name, value in figures.items() if len(data[name].captions)]
        figures["mean"] = sum(scored) / len(scored) if scored else float("nan")  # over the files with items scored
        return figures | split

