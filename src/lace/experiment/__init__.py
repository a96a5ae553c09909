"""The experiment layer: what `lace` commands, the demo and the study share to run the method.

- `stages`: cached, resumable stages (`StageRunner`, `stage_key`);
- `protocol`: every ground's arms x seeds x (train, measure) as cached stages, each run (arm, seed) named one way;
- `dictionary`: `fit_labelled_dictionary(embeddings, DictionaryConfig)`, calibration and bindings;
- `variants`: the one table of named training variants, each a `TrainConfig` delta.
"""
