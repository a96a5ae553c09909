"""Independent cached stages side by side, each in a worker process with one CPU thread.

On a CPU a small model trains faster as two one-thread processes than as one two-thread
process (each thread keeps its own cache and nobody waits at a parallel region's barrier), so
stages that do not depend on each other (the fine-tunes of several variants, their evaluations)
run as separate processes. Each stage runs as it would alone with one thread: it is forked from
the parent after everything it reads is in memory, seeds itself as before and writes its
`stages/<name>.json` as `StageRunner.run` always does; the parent reads the result back from that
file. Workers always use one thread: GNU OpenMP, which PyTorch's CPU kernels use, hangs a forked
child that starts a parallel region of several threads after its parent has used one.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from lace.experiment.stages import StageRunner
from lace.progress import bar as progress_bar

WORKER_THREADS = 1
"""CPU threads of each worker process."""


@dataclass(frozen=True)
class Preparation:
    """Work done once in this process, just before the first stage that needs it runs: what it makes in memory (read
    and decoded inputs, say) the stages' worker processes inherit. Its times are noted under `name`."""

    name: str
    work: Callable[[], None]


@dataclass(frozen=True)
class Stage:
    """One cached stage: `StageRunner.run(name, key, work)` once every stage named in `after` is done (and its
    `preparation`, when it has one and is not cached)."""

    name: str
    key: str
    work: Callable[[], dict]
    after: tuple[str, ...] = ()
    preparation: Preparation | None = None


class StageFailed(RuntimeError):
    """A stage ended in a worker process without a result (killed, or an error that could not be sent back)."""


def run_stages(runner: StageRunner, stages: Sequence[Stage], workers: int, progress: bool = True) -> dict[str, dict]:
    """Every stage's result by name; stages start in the given order as soon as their `after` stages are done.

    `workers` <= 1 runs them one after the other in this process, with its threads (exactly as a
    loop of `runner.run` calls). Otherwise up to `workers` forked processes of `WORKER_THREADS`
    thread(s) each run them; a stage that fails stops the others and its error is raised here, with
    the worker's traceback as a note. Stages cached under their key are reused without a process.
    Every stage in `after` must come earlier in `stages`. A stage's `preparation` runs in this process before the
    first such stage starts (beside the running workers), once; a run where every stage needing it is cached skips it.
    """
    names = [stage.name for stage in stages]
    for position, stage in enumerate(stages):
        unknown = [name for name in stage.after if name not in names[:position]]
        if unknown:
            raise ValueError(f"stage {stage.name!r}: stages it comes after must be listed before it: {unknown}")
    prepared: set[str] = set()
    if workers <= 1:
        results = {}
        for stage in stages:
            _prepare(runner, stage, prepared)
            results[stage.name] = runner.run(stage.name, stage.key, stage.work)
        runner.in_order(_with_preparations(stages))
        return results
    results: dict[str, dict] = {}
    pending = list(stages)
    running: dict[Connection, tuple[Stage, multiprocessing.process.BaseProcess]] = {}
    context = multiprocessing.get_context("fork")
    with progress_bar(total=len(stages), desc="stages", unit="stage", enabled=progress) as bar:
        try:
            while pending or running:
                for stage in [stage for stage in pending if all(name in results for name in stage.after)]:
                    if len(running) >= workers:
                        break
                    pending.remove(stage)
                    cached = runner.cached(stage.name, stage.key)
                    if cached is not None:
                        results[stage.name] = cached
                        bar.update()
                        continue
                    _prepare(runner, stage, prepared)
                    receiver, process = _start(context, runner, stage)
                    running[receiver] = (stage, process)
                if not running:
                    continue
                for receiver in wait(list(running)):
                    stage, process = running.pop(receiver)
                    results[stage.name] = _finish(runner, stage, process, receiver)
                    bar.update()
        finally:
            for _, process in running.values():
                process.terminate()
            for _, process in running.values():
                process.join()
    runner.in_order(_with_preparations(stages))
    return {name: results[name] for name in names}


def _prepare(runner: StageRunner, stage: Stage, prepared: set[str]) -> None:
    """Run `stage`'s preparation here, timed, unless it ran already or `stage` is cached."""
    preparation = stage.preparation
    if preparation is None or preparation.name in prepared or runner.done(stage.name, stage.key):
        return
    runner.timed(preparation.name, preparation.work)
    prepared.add(preparation.name)


def _with_preparations(stages: Sequence[Stage]) -> list[str]:
    """The stages' names, each preparation's just before the first stage that has it (the order times are listed in,
    whichever ran first)."""
    names: list[str] = []
    for stage in stages:
        if stage.preparation is not None and stage.preparation.name not in names:
            names.append(stage.preparation.name)
        names.append(stage.name)
    return names


def _start(context, runner: StageRunner, stage: Stage) -> tuple[Connection, multiprocessing.process.BaseProcess]:
    """Fork a worker that runs `stage`; the connection answers None when it is done, or its error."""
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_worker, args=(runner, stage, sender), name=f"lace stage {stage.name}")
    process.start()
    sender.close()  # the worker holds the only sending end: its exit ends the connection
    return receiver, process


def _worker(runner: StageRunner, stage: Stage, sender: Connection) -> None:
    """Run `stage` with one thread; send None when done, else its traceback's text and then the error."""
    import torch  # here, not at the top: configs import the protocol, and `--help` imports no torch

    torch.set_num_threads(WORKER_THREADS)
    try:
        runner.run(stage.name, stage.key, stage.work)
    except BaseException as error:  # noqa: BLE001 - every failure goes back to the parent, which raises it
        sender.send(traceback.format_exc())
        try:
            sender.send(error)
        except Exception:  # noqa: BLE001 - an error that does not pickle goes back as its text
            sender.send(StageFailed(f"stage {stage.name!r}: {type(error).__name__}: {error}"))
        return
    sender.send(None)


def _finish(runner: StageRunner, stage: Stage, process, receiver: Connection) -> dict:
    """The result `stage`'s worker wrote, or its error raised here."""
    try:
        trace = receiver.recv()
    except EOFError:  # the worker ended without a word
        trace = None
        error = StageFailed(f"stage {stage.name!r}: its worker process ended without a result")
    else:
        error = None if trace is None else _received_error(stage, receiver)
    process.join()
    if error is not None:
        if trace:
            error.add_note(f"in the worker process of stage {stage.name!r}:\n{trace}")
        raise error
    if process.exitcode != 0:
        raise StageFailed(f"stage {stage.name!r}: its worker process exited with code {process.exitcode}")
    result = runner.cached(stage.name, stage.key, reused=False)
    if result is None:
        raise StageFailed(f"stage {stage.name!r}: its worker process wrote no result for key {stage.key}")
    return result


def _received_error(stage: Stage, receiver: Connection) -> BaseException:
    """The error a failed worker sent after its traceback; a `StageFailed` when it cannot be rebuilt here."""
    try:
        return receiver.recv()
    except Exception as error:  # noqa: BLE001 - e.g. an exception class whose arguments do not round-trip
        return StageFailed(f"stage {stage.name!r} failed; its error could not be read back ({error})")
