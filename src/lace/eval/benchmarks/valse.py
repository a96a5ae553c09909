"""VALSE (Parcalabescu et al., ACL 2022): captions against linguistically made foils.

Layout: the release's JSON files under `<root>` (existence.json, plurals.json,
counting-*.json, relations.json, action-*.json, coreference-*.json, foil-it.json), each
a dict id -> {"image_file", "caption", "foils" (list), "dataset", ...}, and the images
under an image folder, as `<images>/<image_file>` or `<images>/<dataset>/<image_file>`.
Score: pairwise accuracy (the caption strictly beats the foil) per file over every
(caption, foil) pair, and the mean over files. All items are used (the paper's
annotator-validated subset is not applied).
"""

from __future__ import annotations

from pathlib import Path

from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.benchmarks.base import (
    Benchmark,
    cache_for,
    item_field,
    read_json_as,
    register_benchmark,
    text_field,
)
from lace.eval.benchmarks.pairs import PairItems, score_pairs
from lace.eval.embedding_cache import EmbeddingCache


@register_benchmark("valse")
class VALSE(Benchmark):
    published_at = "github.com/Heidelberg-NLP/VALSE"

    def load(self, root: str | Path, image_root: str | Path | None = None) -> dict[str, PairItems]:
        root = Path(root)
        image_root = Path(image_root) if image_root is not None else root / "images"
        files = sorted(root.glob("*.json"))
        if not files:
            raise LaceInputError(f"valse: no JSON files (e.g. 'existence.json') found in {root}; "
                                 f"the original is published at {self.published_at}")
        data = {}
        for path in files:
            items = read_json_as(path, dict, "a JSON object of id -> item")
            pairs = PairItems()
            for key, item in items.items():
                image = _resolve_image(image_root, text_field(item, "image_file", path, key), item.get("dataset"))
                caption = text_field(item, "caption", path, key)
                foils = item_field(item, "foils", path, key)
                if not isinstance(foils, list) or not all(isinstance(f, str) for f in foils):
                    raise LaceInputError(f"{path}: item {key}: field 'foils': expected a list of strings (got {foils!r})")
                for foil in foils:
                    pairs.image_paths.append(str(image))
                    pairs.captions.append(caption)
                    pairs.negatives.append(foil)
            self.require_images(pairs.image_paths)
            data[path.stem] = pairs
        return data

    def evaluate(
        self, encoder: DualEncoder, data: dict[str, PairItems], cache: EmbeddingCache | None = None,
        progress: bool = False,
    ) -> dict[str, float]:
        cache = cache_for(encoder, cache, progress)
        figures = {name: score_pairs(cache, pairs) for name, pairs in data.items() if pairs.captions}
        figures["mean"] = sum(figures.values()) / len(figures) if figures else float("nan")
        return figures


def _resolve_image(image_root: Path, image_file: str, dataset: object) -> Path:
    direct = image_root / image_file
    if direct.is_file() or not isinstance(dataset, str):
        return direct
    nested = image_root / dataset / image_file
    return nested if nested.is_file() else direct
