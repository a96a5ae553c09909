"""`lace eval` as a library call: benchmarks plus geometry diagnostics for one model.

Results (JSON-ready dict):
    {"model", "pretrained", "benchmarks": {name: {metric: value}},
     "items": {name: {part: {"scored": n, "skipped": n}}}, "skipped_images": [one line per benchmark],
     "diagnostics": {metric: value}, "diagnostics_skipped": why (only when no diagnostics were measured),
     "config": {...}, "seconds": {...}}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lace.config import config_to_dict
from lace.edits.config import EditConfig
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.benchmarks import BENCHMARKS, get_benchmark
from lace.eval.benchmarks.retrieval import dataset_embeddings
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.neighbours import KnnOptions
from lace.eval.rerank import QueryBank, RerankOptions


@dataclass
class EvalConfig:
    """What `lace eval` measures and where the benchmark files are."""

    benchmarks: tuple[str, ...] = ("retrieval",)
    """Benchmarks to run, comma-separated: retrieval, sugarcrepe, aro, winoground, valse, world, zeroshot."""
    data: str | None = None
    """Retrieval dataset: COCO/Flickr30k Karpathy JSON, COCO captions JSON, CSV/TSV; also used for diagnostics."""
    split: str | None = "test"
    """Karpathy split of --data to evaluate."""
    image_root: str | None = None
    """Folder the --data image paths are relative to (default: beside the file)."""
    missing_images: str = "error"
    """Image files of any benchmark that are missing or unreadable: error (name them) or skip (score the items
    whose images are usable, and report items scored and skipped per file)."""
    sugarcrepe_root: str | None = None
    """Folder with SugarCrepe's seven JSON files (add_att.json, ..., swap_obj.json)."""
    sugarcrepe_images: str | None = None
    """COCO val2017 image folder for SugarCrepe (default: <sugarcrepe-root>/val2017)."""
    aro_root: str | None = None
    """ARO folder with visual_genome_relation.json, visual_genome_attribution.json and images/."""
    aro_coco: str | None = None
    """COCO Karpathy test JSON for COCO-Order (dataset_coco.json or coco_karpathy_test.json)."""
    aro_coco_images: str | None = None
    """Folder the COCO-Order image paths are relative to (default: beside the JSON)."""
    aro_flickr: str | None = None
    """Flickr30k Karpathy test JSON for Flickr30k-Order."""
    aro_flickr_images: str | None = None
    """Folder the Flickr30k-Order image paths are relative to (default: beside the JSON)."""
    aro_tagger: str = "vocabulary"
    """Parts of speech for the Order perturbations: vocabulary (lace's words) or spacy (as ARO; needs spaCy)."""
    winoground_root: str | None = None
    """Winoground folder with examples.jsonl and images/."""
    valse_root: str | None = None
    """Folder with VALSE's JSON files."""
    valse_images: str | None = None
    """VALSE image folder (default: <valse-root>/images)."""
    valse_all_items: bool = False
    """Score every VALSE item, not only those annotators validated (the authors' mturk caption >= 2)."""
    world: str | None = None
    """Shapes world folder written by `lace world` (benchmarks/<split>.json, *_winoground.json)."""
    zeroshot_root: str | None = None
    """Zero-shot image folder, one subfolder per class (default: --world, for its shape/colour/count tasks)."""
    zeroshot_classnames: str | None = None
    """Class names of --zeroshot-root: JSON list, JSON folder->name, CLIP_benchmark JSON, or one a line."""
    zeroshot_templates: str | None = None
    """Prompt templates with {c}: JSON list, CLIP_benchmark JSON, or one a line (default: 'a photo of a {c}.')."""
    zeroshot_per_class: int = 20
    """Images per class of a world's zero-shot tasks (written into <world>/zeroshot on first use)."""
    world_split: str = "test"
    """World split whose binding items are scored (val, test or test_comp)."""
    vocabulary: str | None = None
    """Vocabulary for rule-edit brittleness and the Order tagger (default: the world's, else natural)."""
    diagnostics: bool = True
    """Compute geometry diagnostics (hubness, one-way neighbours, mutual k-NN, brittleness)."""
    k: int = 10
    """Neighbourhood size of hubness and mutual k-NN."""
    baseline: bool = True
    """Also report the geometry of isotropic random vectors of the same sizes."""
    batch_size: int = 64
    """Images per embedding batch (texts use 4x)."""
    cache_dir: str | None = None
    """Folder for an on-disk embedding cache keyed by model and data (off when unset)."""
    seed: int = 0
    """Seed of perturbations, rule edits and the random baseline."""
    dictionary: str | None = None
    """Concept dictionary folder (`lace dict fit`) for counterfactual brittleness and edit retrieval."""
    transplants: tuple[str, ...] = ()
    """Edit-retrieval transplants 'a=b' (default: chosen among same-type concepts in the captions)."""
    auto_transplants: int = 3
    """How many transplants to choose when none are named."""
    edit: EditConfig = field(default_factory=EditConfig)
    """The editor of counterfactual brittleness and edit retrieval (`--edit-strength` sizes the transplants)."""
    counterfactual_edits: int = 4
    """Counterfactual edits per caption for counterfactual brittleness."""
    rerank: RerankOptions = field(default_factory=RerankOptions)
    """Hubness fixes to diagnose besides the plain scores (`--rerank csls,qbnorm,dn`: figures rerank/<fix>/...)
    and their knobs (`--csls-k`, `--qbnorm-beta`, `--qbnorm-k`, `--dn-weight`)."""
    bank: str | None = None
    """Unlabelled image-caption set the fixes take statistics from (e.g. the training split; default: the test set)."""
    bank_split: str | None = "train"
    """Karpathy split of --bank."""
    bank_size: int = 5000
    """Images and captions drawn (seeded) from --bank; 0 takes all."""
    knn: KnnOptions = field(default_factory=lambda: KnnOptions(seed=None))
    """Top-k search of the diagnostics (`--knn exact|faiss`, `--knn-index`, ...); its seed is --seed unless set."""

    FLAG_NAMES: ClassVar[dict[str, tuple[str, ...]]] = {
        "knn.backend": ("--knn",), "rerank.fixes": ("--rerank",), "rerank.csls_k": ("--csls-k",),
        "rerank.qbnorm_beta": ("--qbnorm-beta",), "rerank.qbnorm_k": ("--qbnorm-k",),
        "rerank.dn_weight": ("--dn-weight",)}
    """The flags of `lace eval` from before the search and the fixes were nested configs."""


BenchmarkInputs = Callable[[EvalConfig], tuple[Any, dict[str, Any], str]]
# For each benchmark: (root, load options, the flag that names the root).
BENCHMARK_INPUTS: dict[str, BenchmarkInputs] = {
    "retrieval": lambda c: (c.data, {"split": c.split, "image_root": c.image_root}, "--data"),
    "sugarcrepe": lambda c: (c.sugarcrepe_root, {"image_root": c.sugarcrepe_images}, "--sugarcrepe-root"),
    "aro": lambda c: (c.aro_root or c.aro_coco or c.aro_flickr, {
        "root": c.aro_root, "coco_karpathy": c.aro_coco, "coco_images": c.aro_coco_images,
        "flickr_karpathy": c.aro_flickr, "flickr_images": c.aro_flickr_images,
        "vocabulary": c.vocabulary or "natural", "seed": c.seed, "tagger": c.aro_tagger},
        "--aro-root, --aro-coco or --aro-flickr"),
    "winoground": lambda c: (c.winoground_root, {}, "--winoground-root"),
    "valse": lambda c: (c.valse_root, {"image_root": c.valse_images, "all_items": c.valse_all_items}, "--valse-root"),
    "world": lambda c: (c.world, {"split": c.world_split}, "--world"),
    "zeroshot": lambda c: (c.zeroshot_root or c.world, {
        "classnames": c.zeroshot_classnames, "templates": c.zeroshot_templates, "per_class": c.zeroshot_per_class},
        "--zeroshot-root (an image folder per class) or --world"),
}


def _load(name: str, config: EvalConfig):
    benchmark = get_benchmark(name, config.missing_images)
    if name not in BENCHMARK_INPUTS:
        raise LaceInputError(f"benchmark {name!r} has no inputs known to lace eval")
    root, options, flag = BENCHMARK_INPUTS[name](config)
    if root is None:
        raise LaceInputError(f"benchmark {name!r} needs {flag}")
    if "root" in options:  # ARO takes all its inputs as options
        return benchmark, benchmark.load(**options)
    return benchmark, benchmark.load(root, **options)


def _retrieval_set(path, split: str | None, config: EvalConfig, image_root: str | None = None):
    """The image-caption set of `path` under the image policy of `config`."""
    return get_benchmark("retrieval", config.missing_images).load(path, split=split, image_root=image_root).dataset


# Fields that change what is measured but not which images and captions are embedded.
NOT_EMBEDDING_INPUTS = ("diagnostics", "k", "baseline", "batch_size", "cache_dir", "benchmarks", "dictionary",
                        "transplants", "auto_transplants", "edit", "counterfactual_edits", "rerank", "knn")


def cache_key(model: str, pretrained: str | None, config: EvalConfig) -> str:
    """A name for the on-disk cache of (model, checkpoint state, data inputs)."""
    checkpoint = None
    if pretrained and Path(pretrained).is_file():
        stat = Path(pretrained).stat()
        checkpoint = [str(Path(pretrained).resolve()), stat.st_size, stat.st_mtime_ns]
    inputs = config_to_dict(config)
    for name in NOT_EMBEDDING_INPUTS:
        inputs.pop(name)
    text = json.dumps({"model": model, "pretrained": pretrained, "checkpoint": checkpoint, "inputs": inputs},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _diagnostic_dataset(config: EvalConfig, loaded: dict):
    """The image-caption set the geometry is measured on: the retrieval data, else the world's test split."""
    if "retrieval" in loaded:
        return loaded["retrieval"].dataset
    if config.data is not None:
        return _retrieval_set(config.data, config.split, config, config.image_root)
    if config.world is not None:
        path = Path(config.world) / "karpathy_coco.json"
        if path.is_file():
            return _retrieval_set(path, config.world_split, config)
    return None


def diagnostics_skipped(config: EvalConfig) -> str:
    """Why no geometry was measured although diagnostics are on (no image-caption set to measure it on)."""
    if config.world is not None:
        return f"--world {config.world} has no karpathy_coco.json to measure the geometry on"
    return "no image-caption set to measure the geometry on: pass --data (or --world)"


def rule_negatives(config: EvalConfig):
    """The rule-made caption edits of `config`'s diagnostics, from its vocabulary (the world's, else natural English)."""
    from lace.concepts.vocabulary import load_vocabulary
    from lace.edits.captions import RuleNegatives

    vocabulary = config.vocabulary
    if vocabulary is None:
        world_vocabulary = Path(config.world) / "vocabulary.yaml" if config.world else None
        vocabulary = str(world_vocabulary) if world_vocabulary is not None and world_vocabulary.is_file() else "natural"
    return RuleNegatives(load_vocabulary(vocabulary))


def _finite(figures: dict[str, float]) -> dict[str, float | None]:
    """JSON has no NaN: undefined figures become null."""
    return {key: (None if isinstance(value, float) and not np.isfinite(value) else value)
            for key, value in figures.items()}


LoadedBenchmarks = dict[str, tuple[Any, Any]]
"""By benchmark name: the benchmark (its image checks and item counts) and the data it loaded."""


def load_benchmarks(config: EvalConfig) -> LoadedBenchmarks:
    """Every benchmark of `config` read from its files, its images checked, before any embedding: a missing file
    fails here. Several models measured on one config share the result (`run_evaluation(loaded=...)`): scoring
    reads it and changes nothing in it."""
    _check_names(config)
    return {name: _load(name, config) for name in config.benchmarks}


def _check_names(config: EvalConfig) -> None:
    unknown = [name for name in config.benchmarks if name not in BENCHMARKS]
    if unknown:
        raise LaceInputError(f"unknown benchmark(s) {unknown}; expected some of {sorted(BENCHMARKS)}")


def run_evaluation(
    encoder: DualEncoder, config: EvalConfig, model: str, pretrained: str | None = None, progress: bool = False,
    cache: EmbeddingCache | None = None, loaded: LoadedBenchmarks | None = None,
) -> dict:
    """Load every requested benchmark, embed each image and caption once, score, diagnose.

    `cache`: embeddings of `encoder` to reuse and fill (several evaluations of one model
    share it); a fresh one by default. `loaded`: `load_benchmarks(config)`, read once for several models; read
    here by default.
    """
    if loaded is not None and list(loaded) != list(config.benchmarks):
        raise ValueError(f"loaded benchmarks {list(loaded)} are not the config's {list(config.benchmarks)}")
    _check_names(config)
    labelled = _load_dictionary(encoder, config, model) if config.dictionary else None
    bank = _load_bank(config) if config.rerank.fixes else None
    if config.diagnostics:
        knn_options(config)  # bad --knn flags or a missing FAISS fail before anything is embedded
    cache = cache if cache is not None else EmbeddingCache(encoder, batch_size=config.batch_size, progress=progress)
    cache_file = Path(config.cache_dir) / f"{cache_key(model, pretrained, config)}.npz" if config.cache_dir else None
    if cache_file is not None and cache_file.is_file():
        cache.load(cache_file)
    seconds: dict[str, float] = {}
    inputs = loaded if loaded is not None else load_benchmarks(config)  # all first: a missing file fails here
    benchmarks = {name: benchmark for name, (benchmark, _) in inputs.items()}
    data = {name: loaded_data for name, (_, loaded_data) in inputs.items()}
    results = {}
    skipped_images = [line for line in (b.image_summary() for b in benchmarks.values()) if line]
    for name in config.benchmarks:
        start = time.perf_counter()
        results[name] = _finite(benchmarks[name].evaluate(encoder, data[name], cache=cache, progress=progress))
        seconds[name] = round(time.perf_counter() - start, 3)
    diagnostics: dict[str, float | None] = {}
    skipped_because = None if config.diagnostics else "--no-diagnostics"
    if config.diagnostics:
        start = time.perf_counter()
        dataset = _diagnostic_dataset(config, data)
        if dataset is not None:
            diagnostics = _finite(diagnose(encoder, cache, dataset, config, progress, labelled, bank))
        else:
            skipped_because = diagnostics_skipped(config)
        seconds["diagnostics"] = round(time.perf_counter() - start, 3)
    if cache_file is not None:
        cache.save(cache_file)
    return {
        "model": model,
        "pretrained": pretrained,
        "benchmarks": results,
        "items": {name: benchmark.item_counts for name, benchmark in benchmarks.items()},
        "skipped_images": skipped_images,
        "diagnostics": diagnostics,
        **({"diagnostics_skipped": skipped_because} if skipped_because else {}),
        "config": config_to_dict(config),
        "seconds": seconds,
    }


def _load_dictionary(encoder: DualEncoder, config: EvalConfig, model: str):
    """The labelled dictionary of --dictionary, checked against the model and the named transplants
    before any embedding work."""
    from lace.eval.dictionary_diagnostics import check_transplants, load_dictionary_for_model
    from lace.eval.edit_retrieval import caption_concepts

    if not config.diagnostics:
        raise LaceInputError("--dictionary adds to the diagnostics: drop --no-diagnostics")
    if config.data is None and config.world is None:
        raise LaceInputError("--dictionary needs an image-caption set to diagnose: pass --data or --world")
    if config.auto_transplants < 0 or config.counterfactual_edits < 1:
        raise LaceInputError("expected --auto-transplants >= 0 and --counterfactual-edits >= 1")
    config.edit.validate("eval config: edit")
    labelled = load_dictionary_for_model(config.dictionary, encoder.embed_dim, model)
    concept_names = caption_concepts([], rule_negatives(config))[1]
    check_transplants(labelled, config.transplants, concept_names)
    return labelled


def _load_bank(config: EvalConfig):
    """The --bank image-caption set, checked before any embedding work (None: the fixes use the test set)."""
    if not config.diagnostics:
        raise LaceInputError("--rerank adds to the diagnostics: drop --no-diagnostics")
    if config.bank_size < 0:
        raise LaceInputError(f"--bank-size: expected >= 0 (0 takes all), got {config.bank_size}")
    if config.bank is None:
        return None
    return _retrieval_set(config.bank, config.bank_split, config)


def _bank_embeddings(cache: EmbeddingCache, bank, config: EvalConfig):
    """A `QueryBank` of up to `bank_size` images and captions of the bank set, drawn with the seed."""
    generator = np.random.default_rng(config.seed)
    images, captions = [str(record.image_path) for record in bank.records], list(bank.captions)
    if config.bank_size:
        images = [images[i] for i in sorted(generator.permutation(len(images))[: config.bank_size])]
        captions = [captions[i] for i in sorted(generator.permutation(len(captions))[: config.bank_size])]
    return QueryBank(cache.images([(path, None) for path in images]), cache.texts(captions))


def knn_options(config: EvalConfig) -> KnnOptions:
    """The diagnostics' top-k search: `config.knn`, seeded with `config.seed` unless it sets its own seed."""
    options = config.knn if config.knn.seed is not None else dataclasses.replace(config.knn, seed=config.seed)
    if options.backend == "faiss":
        from lace.eval.faiss_search import import_faiss

        import_faiss()
    return options


def diagnose(encoder: DualEncoder, cache: EmbeddingCache, dataset, config: EvalConfig, progress: bool,
             labelled=None, bank=None) -> dict:
    """Geometry figures and rule-edit brittleness on one image-caption set (`lace.eval.measure`); with a
    labelled dictionary also counterfactual brittleness and edit retrieval (`lace.eval.dictionary_diagnostics`);
    with `config.rerank` the geometry again under each hubness fix, statistics from the `bank` set."""
    from lace.eval.measure import MeasureConfig, MeasuredSplit, measure

    images, texts = dataset_embeddings(cache, dataset)
    owner = dataset.caption_image_index
    figures = {"n_images": float(images.shape[0]), "n_captions": float(texts.shape[0])}
    knn = knn_options(config)
    if config.rerank.fixes:
        from lace.eval.diagnostics import GeometryOptions, reranked_geometry

        figures.update(reranked_geometry(
            images, texts, owner, config.rerank.fixes,
            _bank_embeddings(cache, bank, config) if bank is not None else None,
            GeometryOptions(k=config.k, baseline=False, knn=knn), config.rerank))
    negatives = rule_negatives(config)
    figures.update(measure(MeasuredSplit(images, texts, owner, dataset.captions, encoder),
                           MeasureConfig(("geometry", "rule_brittleness"), k=config.k, baseline=config.baseline,
                                         seed=config.seed, knn=knn),
                           rules=negatives, progress=progress))
    if labelled is not None:
        from lace.eval.dictionary_diagnostics import dictionary_diagnostics

        figures.update(dictionary_diagnostics(
            labelled, images, texts, owner, [record.captions for record in dataset.records], negatives,
            transplants=config.transplants, auto_transplants=config.auto_transplants,
            config=config.edit, n_edits=config.counterfactual_edits, k=config.k, seed=config.seed,
        ))
    return figures
