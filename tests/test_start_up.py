"""What a process pays to start: the encoder front door imports a model family's adapter only when a model of
that family is asked for, and the trainer's modules import nothing they need only later."""

import os
import subprocess
import sys
from pathlib import Path

from lace.encoders.registry import _FACTORIES, BUILT_IN_NAMES

SOURCE = Path(__file__).resolve().parents[1] / "src"


def test_the_encoder_front_door_and_provenance_import_no_adapter_and_no_scipy_stats():
    # a fresh interpreter: this one has imported everything already
    code = ("import sys, lace.encoders, lace.provenance\n"
            "print(sorted(m for m in ('open_clip', 'transformers', 'torchvision', 'scipy.stats', "
            "'lace.encoders.open_clip_encoder', 'lace.encoders.hf_encoder', 'lace.encoders.towers') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(SOURCE), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_built_in_name_is_registered_by_its_module_on_first_use():
    for name, module in BUILT_IN_NAMES.items():
        __import__(module)
        assert name in _FACTORIES, f"{module} does not register {name!r}"
