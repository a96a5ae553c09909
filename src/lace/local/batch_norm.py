"""BatchNorm over a batch that holds real inputs and edited copies of them: statistics from the real ones only.

LACE-local runs the layers above L once on the positives' maps and on their M edited copies together
(one call is cheaper than two). BatchNorm in training mode would then normalise every map with the
mean and variance of the whole B x (1 + M) batch, so the edited maps would shift the positives'
normalisation and enter the running statistics that evaluation uses. Inside
`reference_batch_norm(module, n)` every training-mode BatchNorm of `module` takes the batch statistics
of the first n rows (the positives) and normalises all rows with them:

- the positives come out exactly as a training pass over them alone would make them, with the same
  gradient (through their batch statistics too);
- an edited map is normalised as its own unedited map is in the same step, so it differs from its
  positive only by the edit (a zero edit gives back the positive). Eval-mode BatchNorm for the edited
  maps would instead normalise them with running statistics that lag the batch's, a difference
  between negatives and positives that has nothing to do with the edit and that the tower could learn
  to read;
- running statistics are updated once, from the positives alone, as a plain step updates them;
- the edited maps take the positives' statistics as constants (as eval mode takes the running ones):
  their loss reaches every weight through their own activations, never the positives' statistics, and
  both parts run as PyTorch's fused BatchNorm kernels.

BatchNorm layers in eval mode are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm


def reference_normalise(norm: _BatchNorm, x: Tensor, n_reference: int) -> Tensor:
    """(N, C, ...) -> the same, normalised with the batch statistics of the first `n_reference` rows.

    Those rows go through `norm`'s own training-mode pass (their output, their gradient and the running
    statistics are exactly a plain step's); the other rows are normalised with the statistics that pass
    found, taken as constants, as eval mode takes the running ones.
    """
    reference, rest = x.split([n_reference, x.shape[0] - n_reference])
    momentum = 0.0
    if norm.track_running_stats:
        norm.num_batches_tracked.add_(1)
        momentum = 1.0 / float(norm.num_batches_tracked) if norm.momentum is None else norm.momentum
    normalised, mean, inverse_std = torch.native_batch_norm(reference, norm.weight, norm.bias, norm.running_mean,
                                                            norm.running_var, True, momentum, norm.eps)
    var = inverse_std.detach().pow(-2) - norm.eps  # the biased batch variance the pass normalised with
    others = F.batch_norm(rest, mean.detach(), var, norm.weight, norm.bias, False, 0.0, norm.eps)
    return torch.cat([normalised, others])


@contextmanager
def reference_batch_norm(module: torch.nn.Module, n_reference: int) -> Iterator[None]:
    """Within the block, every training-mode BatchNorm of `module` runs `reference_normalise` with the first
    `n_reference` rows of its input as the reference."""
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.training]
    for norm in norms:
        norm.forward = lambda x, norm=norm: reference_normalise(norm, x, n_reference)
    try:
        yield
    finally:
        for norm in norms:
            del norm.forward
