"""Progress bars: one helper for every tqdm bar in lace, and the dependencies' own bars kept in step with it.

A bar redraws itself with carriage returns, which fill a log file with one long line: bars are drawn only
when asked for and their stream (stderr) is a terminal, or in a Jupyter notebook (a widget). Long runs print
plain lines of their own as well (`lace.train.metrics_writer`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as _chosen

NOTEBOOK = _chosen.__module__ == "tqdm.notebook"  # tqdm's own test: a Jupyter kernel with widgets


def shows_bars(enabled: bool = True) -> bool:
    """Whether a bar would be drawn: asked for (`enabled`), and stderr, where tqdm draws, is a terminal (or a
    notebook shows it as a widget)."""
    if not enabled:
        return False
    stream = sys.stderr
    return NOTEBOOK or (stream is not None and hasattr(stream, "isatty") and stream.isatty())


def bar(iterable: Iterable | None = None, *, enabled: bool = True, **options) -> tqdm:
    """`tqdm(iterable, **options)`, drawn only when `shows_bars(enabled)`; a bar not drawn still iterates
    and counts."""
    return tqdm(iterable, disable=not shows_bars(enabled), **options)


@contextmanager
def dependency_bars(shown: bool) -> Iterator[None]:
    """Within the block, the progress bars of Hugging Face's libraries (huggingface_hub's downloads,
    transformers' "Loading weights") are off unless `shown`; their previous setting comes back after."""
    if shown:
        yield
        return
    try:
        from huggingface_hub import utils as hub
    except ImportError:  # pragma: no cover - open_clip brings it
        yield
        return
    hub_was_off = hub.are_progress_bars_disabled()
    # transformers reads huggingface_hub's setting when it is first imported, then keeps a switch of its own
    before = sys.modules.get("transformers.utils.logging")
    transformers_was_on = before.is_progress_bar_enabled() if before is not None else not hub_was_off
    hub.disable_progress_bars()
    if before is not None:
        before.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging = sys.modules.get("transformers.utils.logging")
        if transformers_logging is not None and transformers_was_on:
            transformers_logging.enable_progress_bar()  # turns huggingface_hub's on too: set just below
        (hub.disable_progress_bars if hub_was_off else hub.enable_progress_bars)()
