"""Nothing from a user's file is unpickled: every `torch.load` is `weights_only=True`, no `pickle` or
`np.load(allow_pickle=True)` in the library, and a checkpoint whose pickle would run code is refused
with an error naming it, and runs nothing."""

import ast
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.train.checkpoints import load_checkpoint, resolve_checkpoint
from lace.train.wise_ft import read_state_dict
from tests.robustness.faults import ROOT

UNPICKLING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def unsafe_loads(source: str, where: str) -> list[str]:
    """Lines of `source` that could unpickle a user's file: `torch.load` without `weights_only=True`,
    `np.load(..., allow_pickle=True)`, `pandas.read_pickle`, `pickle.load(s)`, or another unpickling
    module imported (`import pickle` itself is checked by its uses: only `pickle.UnpicklingError`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{where}:{node.lineno}: imports {n}" for n in names
                      if n.split(".")[0] in UNPICKLING_MODULES and not (isinstance(node, ast.Import) and n == "pickle")]
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "pickle" and node.attr != "UnpicklingError":
            found.append(f"{where}:{node.lineno}: pickle.{node.attr}")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        call = ast.unparse(node.func)
        if node.func.attr == "load" and call.endswith("torch.load"):
            value = keywords.get("weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                found.append(f"{where}:{node.lineno}: torch.load without weights_only=True")
        if node.func.attr == "load" and call.split(".")[0] in {"np", "numpy"}:
            value = keywords.get("allow_pickle")
            if value is not None and not (isinstance(value, ast.Constant) and value.value is False):
                found.append(f"{where}:{node.lineno}: np.load with allow_pickle")
        if node.func.attr == "read_pickle":
            found.append(f"{where}:{node.lineno}: {call}")
    return found


def test_the_audit_finds_each_unsafe_load():
    bad = ("import torch, numpy as np, pickle\nimport dill\nfrom cloudpickle import loads\n"
           "torch.load(p)\ntorch.load(p, weights_only=False)\nnp.load(p, allow_pickle=True)\n"
           "import pandas as pd\npd.read_pickle(p)\npickle.loads(b)\n")
    assert len(unsafe_loads(bad, "bad.py")) == 7
    ok = ("import torch, pickle\ntorch.load(p, map_location='cpu', weights_only=True)\nnp.load(p)\n"
          "try:\n    pass\nexcept pickle.UnpicklingError:\n    pass\n")
    assert unsafe_loads(ok, "ok.py") == []


def test_library_loads_nothing_with_pickle():
    paths = sorted((ROOT / "src" / "lace").rglob("*.py"))
    assert len(paths) > 50
    found = [line for path in paths for line in unsafe_loads(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert found == []


class CreatesMarker:
    """Unpickling this runs `Path(marker).touch()`: what a malicious checkpoint would do, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def malicious_state_dict_file(path: Path, marker: Path) -> Path:
    torch.save({"step": 2, "weight": torch.zeros(2), "payload": CreatesMarker(marker)}, path)
    return path


def test_the_payload_is_real(tmp_path):
    marker = tmp_path / "ran"
    torch.load(malicious_state_dict_file(tmp_path / "evil.pt", marker), weights_only=False)  # trusted load, as a check
    assert marker.exists(), "the payload would not run: the tests below would prove nothing"


def test_malicious_trainer_state_is_refused_and_runs_nothing(tmp_path):
    """A run folder whose checkpoint (with matching hashes, as a downloaded one has) carries the payload."""
    marker = tmp_path / "ran"
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "step_0000002.safetensors"))
    malicious_state_dict_file(folder / "step_0000002.state.pt", marker)
    files = {kind: {"name": f"step_0000002{suffix}", "sha256": hashlib.sha256((folder / f"step_0000002{suffix}")
                                                                               .read_bytes()).hexdigest()}
             for kind, suffix in (("weights", ".safetensors"), ("state", ".state.pt"))}
    (folder / "step_0000002.json").write_text(json.dumps({"step": 2, "files": files}))
    (folder / "latest").write_text("step_0000002\n")
    with pytest.raises(LaceInputError, match=r"step_0000002.state.pt: refused"):
        load_checkpoint(resolve_checkpoint(tmp_path / "run", "latest"), tmp_path / "run")
    assert not marker.exists()


@pytest.mark.parametrize("loader", ["open_clip --pretrained", "wise-ft state dict", "lace-towers checkpoint"])
def test_malicious_model_weights_are_refused_and_run_nothing(loader, tmp_path):
    marker = tmp_path / "ran"
    evil = malicious_state_dict_file(tmp_path / "model.pt", marker)
    with pytest.raises(LaceInputError, match="model.pt"):
        if loader == "open_clip --pretrained":
            load_encoder("lace-micro-32", str(evil))
        elif loader == "wise-ft state dict":
            read_state_dict(evil)
        else:
            from lace.encoders.towers.checkpoint import read_checkpoint

            read_checkpoint(evil)
    assert not marker.exists()

