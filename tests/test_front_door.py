"""`import lace`: a cheap import, every exported name resolves, and the README's training-loop example runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import yaml

import lace
from lace.concepts.labelled import LabelledDictionary, save_labelled_dictionary
from lace.concepts.labelling import label_atoms
from lace.dictionary import ConceptDictionary
from tests.toy_concepts import TOY_VOCABULARY, toy_directions, toy_embeddings

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Use LACE in your own training loop"


def test_import_lace_leaves_torch_unimported():
    script = "import sys, lace; print(sorted(m for m in ('torch', 'open_clip', 'numpy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert result.stdout.strip() == "[]"


def test_every_exported_name_resolves():
    for name in lace.__all__:
        assert getattr(lace, name) is not None, name
    assert set(lace.__all__) == {"__version__", *lace._EXPORTS}
    assert set(lace.__all__) <= set(dir(lace))
    assert lace.build_editor is __import__("lace.edits.build", fromlist=["build_editor"]).build_editor
    try:
        lace.not_a_name  # noqa: B018
    except AttributeError as error:
        assert "not_a_name" in str(error)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def readme_example() -> str:
    """The python block of the README's front-door section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def write_dictionary(folder: Path, dim: int) -> None:
    """A vocabulary-mode dictionary over the toy vocabulary's directions in `dim` dimensions, and the vocabulary:
    what `lace dict fit --out dict` and a vocabulary file give a user."""
    directions = toy_directions(dim=dim)
    images = toy_embeddings(directions, 200, 2.0, seed=1)
    texts = toy_embeddings(directions, 200, -2.0, seed=2)
    dictionary = ConceptDictionary(mode="vocabulary", directions=directions, sparsity=4).fit(images, texts)
    labelling = label_atoms(dictionary, directions, images, texts)
    save_labelled_dictionary(LabelledDictionary(dictionary, directions, labelling), folder / "dict")
    (folder / "vocabulary.yaml").write_text(yaml.safe_dump(TOY_VOCABULARY))


def test_readme_training_step_runs(tmp_path, monkeypatch):
    write_dictionary(tmp_path, dim=64)  # lace-micro-32 embeds in 64 dimensions
    generator = torch.Generator().manual_seed(0)
    captions = ["a red circle left of a blue square", "a small green star", "a yellow heart right of a red star",
                "a large blue circle"]
    loader = [(torch.randn(4, 3, 32, 32, generator=generator), captions) for _ in range(2)]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"loader": loader, "__name__": "readme_example"}
    exec(compile(readme_example(), "README.md", "exec"), namespace)  # noqa: S102  the README's own code

    loss, model, negatives = namespace["loss"], namespace["model"], namespace["negatives"]
    assert torch.isfinite(loss)
    gradients = [p.grad for p in model.visual.parameters() if p.grad is not None]
    assert gradients and any(g.abs().sum() > 0 for g in gradients), "no gradient reached the image tower"
    assert model.text_projection.grad is not None and model.text_projection.grad.abs().sum() > 0
    assert negatives.image_negatives.shape[:2] == negatives.image_valid.shape
    assert negatives.image_valid.any(), "no edited image"
    assert negatives.caption_negatives.shape[1] == 3  # 2 edited captions and 1 rule-made caption per row
    assert negatives.caption_valid[:, :2].any() and negatives.caption_valid[:, 2].all()
