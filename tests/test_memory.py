"""`keep_freed_memory`: the buffers a training step frees are not faulted in again by the next step."""

import subprocess
import sys

import pytest

TEN_STEPS = """
import resource, sys
import open_clip, torch
import lace.encoders  # registers the lace-micro configs
from lace.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
model = open_clip.create_model("lace-micro-rn-32")
optimizer = torch.optim.AdamW(model.parameters(), fused=True)
pixels, tokens = torch.randn(64, 3, 32, 32), torch.randint(1, 400, (64, 24))
def step():
    image, text, scale = model(pixels, tokens)
    (scale * image @ text.T).logsumexp(1).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # the token embedding's (49408, 64) gradient: 12.6 MB freed each step
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    """Minor page faults of ten training steps of the demo's model in a fresh process."""
    done = subprocess.run([sys.executable, "-c", TEN_STEPS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_training_steps_stop_faulting_their_buffers_in_again():
    default, kept = _page_faults("default"), _page_faults("keep")
    # seen: 12,900-51,800 faults by default (glibc hands some blocks back and maps them again), 3-230 kept
    assert kept < 1000, kept
    assert default > 4 * max(kept, 1000), (default, kept)
