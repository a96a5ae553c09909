"""`run_demo`: the whole LACE story on the shapes world, stage by stage, cached.

1. generate the world; 2. pretrain the base on web-like captions (the CLIP that does
not bind) and report its calibration; 3. fit and label the concept dictionary; 4. edit
retrieval; 5. fine-tune in every variant from the base with the same data order;
6. evaluate every model on val, test and test_comp, and on the world's zero-shot tasks;
7. with --full (or chosen arms), mix plain and LACE back into the base (WiSE-FT) at a few alphas; 8. write the
report.

Stages 1-4 and the base's zero-shot figures run in this process with `threads` threads; the fine-tunes (the local
arms after the one editor they share, `lace.demo.local_editor_stage`), the evaluations (the base's and each
fine-tune's), the edit grids and WiSE-FT do not depend on each other beyond their own order and run side by side
in `workers` one-thread processes (`lace.experiment.parallel`), forked after this process has read and decoded
what every evaluation shares (`lace.demo.evaluation.prepare_world_evaluation`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from lace.concepts.labelled import load_labelled_dictionary
from lace.config import config_to_dict, with_changes
from lace.data.world import WorldConfig, generate_world
from lace.demo.config import CALIBRATED_WORLD, CLIP_SUGARCREPE, DemoConfig
from lace.demo.dictionary_stage import (
    atom_bar_figure,
    edit_grids_stage,
    edit_retrieval_stage,
    fit_dictionary,
)
from lace.demo.evaluation import evaluate_on_world, prepare_world_evaluation
from lace.demo.local_editor_stage import (
    editor_file,
    edits_locally,
    fit_shared_editor,
    load_shared_editor,
)
from lace.demo.provenance_stage import (
    ProvenanceInstrument,
    fit_instrument,
    fit_instrument_shade,
    held_out_split,
    provenance_figures,
)
from lace.demo.report import write_demo_report
from lace.demo.world_data import rendered_train_negatives, world_pairs
from lace.edits import CounterfactualEditor, EditConfig, build_editor
from lace.edits.records import EDIT_KINDS
from lace.encoders import load_encoder
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.runner import EvalConfig
from lace.experiment.parallel import Preparation, Stage, run_stages
from lace.experiment.protocol import ArmStages, Measure, Run, runs
from lace.experiment.stages import StageRunner, stage_key
from lace.experiment.variants import (
    VARIANTS,
    negative_sources,
    uses_counterfactuals,
    uses_local,
    uses_rendered,
    variant_config,
)
from lace.experiment.wise_ft import ALPHAS as WISE_FT_ALPHAS
from lace.experiment.wise_ft import wise_ft_stage
from lace.experiment.zeroshot import world_zeroshot_root, zeroshot_figures
from lace.io import atomic_write_json, read_json
from lace.train import TensorPairs, export_run, train
from lace.train.config import TrainConfig
from lace.train.config import train_config as train_config_of

INSTRUMENT_EDITS = 4
"""M of the one instrument every model's brittleness to counterfactual edits is measured with (the default editor
on the base's dictionary), whatever M the fine-tunes train with."""
IMAGES_PER_WORLD_WORKER = 2000
"""A world process renders about 1,000 images a second and takes about 2 s to start: fewer images than this
per process are rendered sooner by fewer processes."""


def world_config(config: DemoConfig) -> WorldConfig:
    """The demo's world, rendered by up to the demo's worker processes (the files do not depend on how many)."""
    workers = max(1, min(config.workers, config.world_images // IMAGES_PER_WORLD_WORKER))
    return WorldConfig(n_images=config.world_images, seed=config.seed, image_size=config.image_size,
                       benchmark_items_per_family=1, png_compression=1, workers=workers, **CALIBRATED_WORLD)


def world_key(world: WorldConfig) -> str:
    """The stage key of a world: every setting but the number of processes that render it."""
    return stage_key(config_to_dict(replace(world, workers=1)))


@dataclass
class Foundation:
    """What the demo's first three stages leave: the world, the base model and its labelled dictionary."""

    config: DemoConfig
    world_dir: Path
    vocabulary: str
    base_path: Path
    dictionary_dir: Path
    encoder: DualEncoder
    """The base model."""
    world_key: str
    base_key: str
    dictionary_key: str
    base: dict
    """The base stage's summary."""
    dictionary: dict
    """The dictionary stage's summary."""


def run_foundation(config: DemoConfig, out: Path, runner: StageRunner,
                   train_pairs: Callable[[Path, str], TensorPairs]) -> Foundation:
    """Stages 1-3, cached under `out`: generate the world, pretrain the base, fit and label the dictionary.

    `train_pairs(world_dir, style)`: the train split with captions of `style`, in the model's input format.
    """
    world = world_config(config)
    world_dir = out / "world"
    key = world_key(world)
    runner.run("world", key, lambda: _generate(world, world_dir, config.progress))
    vocabulary = str(world_dir / "vocabulary.yaml")
    base_key = base_stage_key(config, key)
    base_path = out / "models" / "base.pt"
    base = runner.run("base", base_key, lambda: _pretrain(config, train_pairs(world_dir, "web"), out, base_path))
    encoder = load_encoder(config.model, str(base_path))
    dictionary_dir = out / "dictionary"
    dictionary_key = stage_key(base_key, config_to_dict(config.dictionary))
    dictionary = runner.run("dictionary", dictionary_key, lambda: _dictionary(
        config, encoder, train_pairs(world_dir, "coco"), world_dir, vocabulary, dictionary_dir, out / "figures"))
    return Foundation(config, world_dir, vocabulary, base_path, dictionary_dir, encoder, key, base_key, dictionary_key,
                      base, dictionary)


def base_stage_key(config: DemoConfig, world_key: str) -> str:
    """The base's stage key: its world, model, pretraining settings and seed; the loss and a --base-seed other than
    --seed only where set, so that the default demo keeps its keys."""
    return stage_key(world_key, config.model, config.base_steps, config.base_lr, config.batch_size, config.seed,
                     *(() if config.loss == "clip" else (config.loss,)),
                     *(() if config.pretraining_seed == config.seed else ("base seed", config.pretraining_seed)))


def demo_model_and_dictionary(config: DemoConfig, out: str | Path, log=print) -> Foundation:
    """The demo's world, base model and dictionary under `out`, reused when cached, else made (stages 1-3)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    pixel_encoder = load_encoder(config.model)
    return run_foundation(config, out, StageRunner(out, log),
                          lambda world_dir, style: world_pairs(world_dir, "train", style, pixel_encoder))


def run_demo(config: DemoConfig, out: str | Path, log=print, decoded: dict[str, TensorPairs] | None = None) -> dict:
    """Run (or resume) every stage under `out`; return the summary written to `results.json`.

    `decoded`: train pairs by caption style (and the split's pixels, shared by both styles), filled as
    they are decoded; runs on the same world and model (a sweep's settings) pass one dict so the images
    are decoded once.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started, load_at_start = time.perf_counter(), os.getloadavg()
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    runner = StageRunner(out, log)
    softmax = softmax_run_figures(config) if config.softmax_run else None  # read first: a bad folder fails now
    pixel_encoder = load_encoder(config.model)  # only its preprocess is used: the same for every checkpoint
    decoded = {} if decoded is None else decoded

    def train_pairs(world_dir: Path, style: str) -> TensorPairs:
        """The train split with captions of `style`, decoded once for all stages."""
        if style not in decoded:
            decoded[style] = world_pairs(world_dir, "train", style, pixel_encoder, decoded)
        return decoded[style]

    foundation = run_foundation(config, out, runner, train_pairs)  # stages 1-3
    labelled = load_labelled_dictionary(foundation.dictionary_dir)
    measured = _measure_the_base(config, out, runner, foundation, labelled, pixel_encoder)  # stage 4, the base's share of 6
    coco = train_pairs(foundation.world_dir, "coco")
    provenance = _provenance(config, foundation, coco, pixel_encoder, decoded) if measures_provenance(config) else None
    arms = _demo_arms(config, out, foundation, labelled, measured, coco, pixel_encoder, decoded, provenance)
    editors = _local_editor_stages(config, out, foundation, coco, arms)
    stages, wise_ft = _stages_after_the_base(config, out, foundation, labelled, measured, arms, editors)  # stages 5-7
    provenance_stages = _provenance_stages(runner, foundation, arms, provenance) if provenance else []
    parent_stages = list(runner.wall_times)  # the rest run side by side
    results = run_stages(runner, stages + provenance_stages, config.workers, config.progress)
    measured.evaluations["base"] = results[BASE_EVALUATION]
    for run, evaluation in arms.results(results, "eval").items():
        measured.evaluations[run.label] = evaluation
    for run, zeroshot in arms.results(results, "zeroshot").items():
        measured.zeroshot[run.label] = zeroshot
    summary = _summary(config, runner, foundation, measured, results["edit_grids"],
                       results["wise_ft"] if isinstance(wise_ft, Stage) else wise_ft, started, load_at_start)
    summary["machine"]["parent_stages"] = parent_stages
    summary["runs"] = {run.label: run.record() for run in arms.runs}
    if provenance_stages:
        summary["provenance"] = {"base": results["provenance base"],
                                 **{run.label: figures for run, figures in arms.results(results, "provenance").items()}}
    if softmax is not None:
        summary["softmax_run"] = softmax
    _write_results(summary, out)  # stage 8
    return summary


@dataclass
class BaseMeasures:
    """What the demo measures on the base in this process before the fine-tunes fork off."""

    edit_retrieval: dict
    zeroshot_config: EvalConfig
    """Zero-shot on the world's shape/colour/count tasks, written beside the run."""
    editor: CounterfactualEditor
    """The one instrument of brittleness to counterfactual edits: the default editor on the dictionary."""
    eval_pixels: dict
    """Every evaluation image, decoded once for every model."""
    eval_inputs: dict
    """Each split's benchmarks and captions (`lace.demo.evaluation.SplitInputs`), read once for every model."""
    zeroshot: dict
    """Zero-shot figures by model: the base's, then each fine-tune's."""
    evaluations: dict
    """`evaluate_on_world` results by model: the base's, then each fine-tune's (filled after their stages)."""
    base_evaluation: Stage
    """The stage measuring the base on the world (`evaluate_on_world`), run side by side with the fine-tunes."""
    preparation: Preparation
    """What every evaluation shares, read and decoded once in this process before the first evaluation starts
    (`lace.demo.evaluation.prepare_world_evaluation`)."""


BASE_EVALUATION = "eval base"
"""The stage name of the base's `evaluate_on_world`."""


def _measure_the_base(config: DemoConfig, out: Path, runner: StageRunner, foundation: Foundation, labelled,
                      pixel_encoder: DualEncoder) -> BaseMeasures:
    """Edit retrieval and the base's zero-shot figures, each one cached stage run here; and the stage of the base's
    evaluation, run side by side with the fine-tunes."""
    world_dir, vocabulary, encoder = foundation.world_dir, foundation.vocabulary, foundation.encoder
    edit_key = stage_key(foundation.dictionary_key, config.finetune.negatives.edit.strength, config.finetune.negatives.edit.n_edits)
    edits = runner.run("edit_retrieval", edit_key, lambda: edit_retrieval_stage(
        labelled, encoder, world_dir, vocabulary, config))
    # zero-shot on the world's shape/colour/count tasks, written beside the run: the world may be shared read-only
    zeroshot_config = EvalConfig(benchmarks=("zeroshot",), world=str(world_dir), world_split="test", seed=config.seed,
                                 zeroshot_root=str(world_zeroshot_root(world_dir, out / "zeroshot")))
    zeroshot = {"base": runner.run("zeroshot base", stage_key(foundation.base_key, "zeroshot"),
                                   lambda: zeroshot_figures(encoder, "base", zeroshot_config))}
    # Brittleness to counterfactual edits is measured with one fixed instrument, the default editor on this
    # dictionary, so that every model and every setting of the LACE knobs is measured alike; evaluation
    # keys include the dictionary's.
    editor = build_editor(labelled, EditConfig(kinds=EDIT_KINDS))
    # every model is one architecture: each evaluation image is decoded once for all, in this process, before the
    # first evaluation is forked off
    eval_pixels: dict = {}
    eval_inputs: dict = {}
    preparation = Preparation("prepare evaluations", partial(
        prepare_world_evaluation, world_dir, vocabulary, pixel_encoder, config.seed, pixels=eval_pixels,
        inputs=eval_inputs))
    base_evaluation = Stage(BASE_EVALUATION, stage_key(foundation.base_key, foundation.dictionary_key, "eval"), partial(
        _evaluate, encoder, "base", world_dir, vocabulary, editor, config.seed, eval_pixels, eval_inputs),
        preparation=preparation)
    return BaseMeasures(edits, zeroshot_config, editor, eval_pixels, eval_inputs, zeroshot, {}, base_evaluation,
                        preparation)


def _stages_after_the_base(config: DemoConfig, out: Path, foundation: Foundation, labelled, measured: BaseMeasures,
                           arms: ArmStages, editors: dict[int, Stage]) -> tuple[list[Stage], Stage | dict]:
    """The stages that run side by side: the local arms' shared editors (by seed), every fine-tune (costliest arm
    first; a local arm after its editor), WiSE-FT, the base's evaluation, the edit grids, then each fine-tune's
    evaluation and zero-shot; with the WiSE-FT stage (or the summary saying why it was skipped)."""
    grids = Stage("edit_grids", stage_key(foundation.dictionary_key, config_to_dict(config.finetune.negatives.edit), "grids"),
                  partial(edit_grids_stage, labelled, foundation.encoder, foundation.world_dir, config, out / "figures"))
    wise_ft = _wise_ft(config, out, foundation.base_key, arms, measured.zeroshot_config)
    # The longest stages start first, so that none runs alone at the end: the fine-tunes, costliest arm first,
    # then WiSE-FT (a dozen models scored), then the rest; a stage waiting for another leaves its place to the next
    # one ready (the local arms wait for their editor, so the costliest other arm starts beside it).
    finetunes = [replace(arms.train_stage(run), after=(editors[run.seed].name,)) if edits_locally(run.arm)
                 else arms.train_stage(run)
                 for run in sorted(arms.runs, key=lambda run: negative_sources(run.arm), reverse=True)]
    measures = [replace(stage, preparation=measured.preparation) if stage.name == run.stage("eval") else stage
                for run in arms.runs for stage in arms.measure_stages(run, ("eval", "zeroshot"))]
    return [*editors.values(), *finetunes, *([wise_ft] if isinstance(wise_ft, Stage) else []),
            measured.base_evaluation, grids, *measures], wise_ft


def _local_editor_stages(config: DemoConfig, out: Path, foundation: Foundation, coco: TensorPairs,
                         arms: ArmStages) -> dict[int, Stage]:
    """By fine-tune seed, the stage fitting the editor that seed's local arms share (none without a local arm)."""
    local = config.finetune.negatives.local
    return {seed: Stage(f"local-editor-seed{seed}",
                        stage_key(foundation.base_key, config_to_dict(local), seed, "local editor"),
                        partial(fit_shared_editor, local, config.model, foundation.base_path, coco,
                                foundation.vocabulary, seed, editor_file(out, seed)))
            for seed in dict.fromkeys(run.seed for run in arms.runs if edits_locally(run.arm))}


def _demo_arms(config: DemoConfig, out: Path, foundation: Foundation, labelled, measured: BaseMeasures,
               coco: TensorPairs, pixel_encoder: DualEncoder, decoded: dict,
               provenance: Provenance | None) -> ArmStages:
    """The demo's arms x seeds: each fine-tune from the base, keyed on the base, the general knobs, the arm's delta,
    the seed and the knobs only its arm reads; measured on the world (`eval`), by zero-shot (`zeroshot`) and, when
    some arm edits the images themselves, by the provenance probe (`provenance`)."""
    world_dir, vocabulary, dictionary_key = foundation.world_dir, foundation.vocabulary, foundation.dictionary_key
    # side by side, the fine-tunes' progress bars would overwrite each other: the stages' bar stands for them
    quiet = replace(config, progress=False) if config.workers > 1 else config
    knobs = config_to_dict(config.finetune.train_config())  # keyed as when the fine-tune was a whole TrainConfig
    general = {name: value for name, value in knobs.items() if name not in LACE_KNOBS + ("local",)}
    finetune_key = stage_key(foundation.base_key, general, config.batch_size)
    lace_key = stage_key(dictionary_key, {name: knobs[name] for name in LACE_KNOBS})

    def train_key(run: Run) -> str:
        return stage_key(finetune_key, VARIANTS[run.arm], run.seed, *_own_keys(config, run.arm, lace_key))

    def finetune(run: Run) -> dict:
        rendered = partial(rendered_train_negatives, world_dir, pixel_encoder, decoded) if uses_rendered(run.arm) else None
        local_editor = partial(load_shared_editor, editor_file(out, run.seed)) if edits_locally(run.arm) else None
        return _finetune(quiet, run, coco, out, foundation.base_path, labelled, vocabulary, rendered, local_editor)

    measures = {
        "eval": Measure(lambda trained: stage_key(trained, dictionary_key, "eval"), partial(
            _evaluate_saved, config.model, out, world_dir, vocabulary, measured.editor, config.seed,
            measured.eval_pixels, measured.eval_inputs)),
        "zeroshot": Measure(lambda trained: stage_key(trained, "zeroshot"),
                            partial(_zeroshot_saved, config.model, out, measured.zeroshot_config))}
    if provenance is not None:
        measures["provenance"] = Measure(lambda trained: stage_key(trained, provenance.key),
                                         lambda run: provenance.figures(run.model_file(out, ".pt")))
    return ArmStages(runs(config.variants, range(config.seed, config.seed + config.seeds)), "finetune", train_key,
                     finetune, measures)


def _summary(config: DemoConfig, runner: StageRunner, foundation: Foundation, measured: BaseMeasures, grids: dict,
             wise_ft: dict, started: float, load_at_start: tuple[float, float, float]) -> dict:
    """Everything results.json holds: the config, every stage's figures, and what the run cost."""
    return {
        "config": config_to_dict(config),
        "world": config_to_dict(world_config(config)),
        "base": foundation.base,
        "dictionary": foundation.dictionary,
        "edit_retrieval": measured.edit_retrieval,
        "edit_grids": grids,
        "zeroshot": measured.zeroshot,
        "wise_ft": wise_ft,
        "evaluations": measured.evaluations,
        "calibration_targets": CLIP_SUGARCREPE,
        "wall_seconds": dict(runner.wall_times),
        "cpu_seconds": dict(runner.cpu_times),
        "reused": dict(runner.reused),
        # Wall time depends on what else runs on the machine: the load average (1, 5, 15 min) says how busy it was.
        "machine": {"threads": torch.get_num_threads(), "cpus": os.cpu_count(), "workers": config.workers,
                    "load_average_at_start": [round(x, 2) for x in load_at_start],
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                    "wall_seconds_before_report": time.perf_counter() - started},
    }


def _write_results(summary: dict, out: Path) -> None:
    """results.json, then the report, then results.json again with the report's time."""
    atomic_write_json(out / "results.json", summary)
    start, cpu_start = time.perf_counter(), time.process_time()
    write_demo_report(summary, out)
    summary["wall_seconds"]["report"] = time.perf_counter() - start
    summary["cpu_seconds"]["report"] = time.process_time() - cpu_start
    atomic_write_json(out / "results.json", summary)


WISE_FT_VARIANTS = ("plain", "LACE")
"""The fine-tunes mixed back into the base for the WiSE-FT trade-off (first seed each)."""


def _wise_ft(config: DemoConfig, out: Path, base_key: str, arms: ArmStages, zeroshot_config: EvalConfig) -> Stage | dict:
    """The stage scoring zero-shot against swap-attribute (test split) with plain and LACE mixed into the base at
    each alpha, after their fine-tunes; or, in the default demo (which leaves it to --full and chosen arms) or when
    neither is fine-tuned, the summary saying why not."""
    if not (config.full or config.only_variants):
        return {"skipped": "the default demo, kept short, leaves it to --full (or arms chosen with --only-variants)"}
    chosen = [run for run in (Run(arm, config.seed) for arm in WISE_FT_VARIANTS) if run in arms.keys]
    if not chosen:
        return {"skipped": f"none of {WISE_FT_VARIANTS} was fine-tuned"}
    paths = {run.arm: run.model_file(out, ".pt") for run in chosen}
    key = stage_key(base_key, [arms.keys[run] for run in chosen], WISE_FT_ALPHAS, "wise-ft")
    return Stage("wise_ft", key, partial(wise_ft_stage, config.model, out / "models" / "base.pt", paths,
                                         zeroshot_config, out / "figures" / "wise_ft.png"),
                 after=tuple(run.stage(arms.train_step) for run in chosen))


def measures_provenance(config: DemoConfig) -> bool:
    """Whether the demo runs the provenance stage: with --full or chosen arms, when some variant edits the images
    themselves (inside the image tower, or by the renderer); the default demo, kept short, does not."""
    return bool(config.full or config.only_variants) and any(trained.arm.local_image_negatives
                                                             or trained.arm.rendered_negatives
               for trained in (variant_config(TrainConfig(), variant) for variant in config.variants))


@dataclass
class Provenance:
    """The one provenance probe every model is measured with: an instrument fitted on the base
    (`lace.demo.provenance_stage`), and its stage key."""

    instrument: ProvenanceInstrument
    key: str
    model: str
    progress: bool

    def figures(self, path: Path) -> dict:
        """`provenance_figures` of the checkpoint at `path`."""
        return provenance_figures(load_encoder(self.model, str(path)), self.instrument, self.progress)


def _provenance(config: DemoConfig, foundation: Foundation, coco: TensorPairs, pixel_encoder: DualEncoder,
                decoded: dict) -> Provenance:
    """The provenance probe of this demo (the instrument is fitted only when some stage needs it)."""
    instrument = ProvenanceInstrument(
        partial(fit_instrument, config.finetune.negatives.local, foundation.encoder, coco, foundation.vocabulary, config.seed),
        partial(held_out_split, foundation.world_dir, encoder=pixel_encoder, decoded=decoded), foundation.vocabulary,
        partial(fit_instrument_shade, config.finetune.negatives.local, foundation.encoder, coco, foundation.vocabulary))
    key = stage_key(foundation.base_key, config_to_dict(config.finetune.negatives.local), config.seed, "provenance")
    return Provenance(instrument, key, config.model, config.progress and config.workers <= 1)


def _provenance_stages(runner: StageRunner, foundation: Foundation, arms: ArmStages,
                       provenance: Provenance) -> list[Stage]:
    """The provenance stage of the base and of each fine-tune (after it); the instrument is made here, before the
    workers fork, when some stage is not cached yet."""
    stages = [Stage("provenance base", stage_key(foundation.base_key, provenance.key),
                    partial(provenance.figures, foundation.base_path))]
    stages += [stage for run in arms.runs for stage in arms.measure_stages(run, ("provenance",))]
    if not all(runner.done(stage.name, stage.key) for stage in stages):
        provenance.instrument.prepare()
    return stages


def _evaluate(encoder: DualEncoder, name: str, world_dir: Path, vocabulary: str, editor, seed: int, pixels: dict,
              inputs: dict) -> dict:
    """`evaluate_on_world` of model `encoder` (called `name`) with the demo's instrument and the shared inputs."""
    return evaluate_on_world(encoder, name, world_dir, vocabulary, editor, INSTRUMENT_EDITS, seed, pixels=pixels,
                             inputs=inputs)


def _evaluate_saved(model: str, out: Path, world_dir: Path, vocabulary: str, editor, seed: int, pixels: dict,
                    inputs: dict, run: Run) -> dict:
    """`evaluate_on_world` of `run`'s fine-tune of demo run `out`."""
    return _evaluate(load_encoder(model, str(run.model_file(out, ".pt"))), run.label, world_dir, vocabulary, editor,
                     seed, pixels, inputs)


def _zeroshot_saved(model: str, out: Path, config: EvalConfig, run: Run) -> dict:
    """`zeroshot_figures` of `run`'s fine-tune of demo run `out`."""
    return zeroshot_figures(load_encoder(model, str(run.model_file(out, ".pt"))), run.label, config)


LACE_KNOBS = ("edit", "counterfactual_weight", "refresh_dictionary_every", "refresh_pool_size")
"""The fine-tune's knobs only the variants with counterfactuals read (the rest of `DemoConfig.finetune` keys every
fine-tune, `local` those of LACE-local)."""


def _own_keys(config: DemoConfig, variant: str, lace_key: str) -> list:
    """What a variant's fine-tune depends on beyond the base, the data order, the general knobs and the seed."""
    keys = [lace_key if uses_counterfactuals(variant) else None]
    if uses_local(variant):
        keys.append(stage_key(config_to_dict(config.finetune.negatives.local)))
    return keys


def softmax_run_figures(config: DemoConfig) -> dict:
    """What the report of a sigmoid demo puts beside its own figures: the softmax run's evaluations and zero-shot
    figures, read from its results.json, and whether it ran on the same world."""
    path = Path(config.softmax_run) / "results.json"
    summary = read_json(path)
    if not isinstance(summary, dict) or "evaluations" not in summary:
        raise LaceInputError(f"{path}: field 'evaluations': expected the results.json of a finished demo run "
                             "(--softmax-run)")
    return {"path": str(path), "loss": summary.get("config", {}).get("loss", "clip"),
            "model": summary.get("config", {}).get("model"), "seed": summary.get("config", {}).get("seed"),
            "same_world": summary.get("world") == config_to_dict(world_config(config)),
            "evaluations": summary["evaluations"], "zeroshot": summary.get("zeroshot", {})}


def finetune_folder(out: Path, variant: str, seed: int) -> Path:
    """The run folder of one fine-tune of a demo run `out` (its config.json and metrics.jsonl)."""
    return Run(variant, seed).run_folder(out)


def _generate(world: WorldConfig, world_dir: Path, progress: bool) -> dict:
    summary = generate_world(world, world_dir, overwrite=True, progress=progress)
    return {"images": summary.images, "benchmark_items": summary.benchmark_items,
            "images_per_second": summary.images_per_second, "seconds": summary.seconds}


def _warmup_steps(config: DemoConfig) -> int:
    """Warm-up of the base and of every fine-tune: a tenth of the fine-tune's steps, at least 1, at most 50."""
    return min(50, max(1, config.finetune.steps // 10))


def _pretrain(config: DemoConfig, pairs: TensorPairs, out: Path, base_path: Path) -> dict:
    train_config = train_config_of(model=config.model, output=str(out / "runs" / "base"), overwrite=True,
                                   batch_size=config.batch_size, checkpoint_every=0, log_every=25, device="cpu",
                                   warmup_steps=_warmup_steps(config), pretrained=None, steps=config.base_steps,
                                   lr=config.base_lr, seed=config.pretraining_seed, loss=config.loss)
    result = train(train_config, dataset=pairs, progress=config.progress)
    export_run(result.run_dir, base_path, overwrite=True)
    return {"steps": result.steps, "last_metrics": result.last_metrics, "train_config": config_to_dict(train_config)}


def _dictionary(config: DemoConfig, encoder, pairs: TensorPairs, world_dir: Path, vocabulary: str, out: Path,
                figures: Path) -> dict:
    captions = [caption for captions in pairs.captions for caption in captions]
    labelled, summary = fit_dictionary(encoder, pairs.pixels, captions, vocabulary, config, out)
    summary["atom_bars"] = atom_bar_figure(labelled, encoder, world_dir, config, figures / "atom_bars.png")
    return summary


def _finetune(config: DemoConfig, run: Run, pairs: TensorPairs, out: Path, base_path: Path, labelled,
              vocabulary: str, rendered=None, local_editor=None) -> dict:
    """One fine-tune: `config.finetune` with what the demo sets and `run`'s arm's delta, exported to
    `run.model_file(out, ".pt")`; `rendered`: None, or a callable giving the ceiling arm's `RenderedNegatives`;
    `local_editor`: None, or a callable giving the local arms' shared editor (`lace.demo.local_editor_stage`)."""
    # the pairs come decoded; `data` names the world they are from (the editor's fidelity is measured on its scenes)
    train_config = variant_config(with_changes(config.finetune.train_config(
        model=config.model, output=str(run.run_folder(out)), batch_size=config.batch_size, pretrained=str(base_path),
        seed=run.seed, vocabulary=vocabulary, loss=config.loss, data=str(Path(vocabulary).parent / "karpathy_coco.json")),
        {"warmup_steps": _warmup_steps(config)}), run.arm)
    editor = build_editor(labelled, train_config.negatives.edit) if train_config.arm.uses_counterfactuals else None
    result = train(train_config, editor=editor, dataset=pairs, progress=config.progress,
                   rendered=rendered() if rendered is not None else None,
                   local_editor=local_editor() if local_editor is not None else None)
    export_run(result.run_dir, run.model_file(out, ".pt"), overwrite=True)
    return {"steps": result.steps, "last_metrics": result.last_metrics, "train_config": config_to_dict(train_config)}
