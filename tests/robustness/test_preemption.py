"""Cluster faults of `lace train`: a preemption notice (SIGTERM, SIGUSR1) at a seeded step, in one process and
in two processes; a worker SIGKILLed under `torchrun --max-restarts 1 --resume auto`; a worker that hangs. Each
resumed run ends on the uninterrupted run's weights, losses and sample count, bit for bit.

The run is the LACE run of `test_kill_resume` (counterfactual edits, rule-made captions, a dictionary
refresh every 2 steps, gradient accumulation), 4 steps of 2 micro-batches: a run stopped at step 1 must resume
with the refresh pool it had saved, one stopped at step 2 or 3 with the refreshed dictionary (the seeded stops
cover both).

Where the launcher is what is tested (it passes a SIGTERM on to its workers; it restarts a job whose worker
died), the two processes are a `torch.distributed.run` job. Elsewhere they are forked from the tests' fork
server with the environment torchrun gives its workers (what lace reads), which spares each run two fresh
interpreters' imports.
"""

import json
import random
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lace.cli import main
from lace.train.checkpoints import complete_checkpoints, latest_checkpoint
from lace.train.interrupt import PREEMPTED_EXIT
from lace.train.lost_rank import LOST_PROCESS_EXIT
from tests.distributed_support import forkserver, free_port
from tests.robustness.fault_worker import run_as_rank
from tests.robustness.faults import ROOT, KillPoint, lace_run_folder, run_killed, subprocess_env
from tests.test_train import WORLD_VOCABULARY

SEED = 27
STEPS, ACCUMULATION = 4, 2
WORKER = str(ROOT / "tests" / "robustness" / "fault_worker.py")


@pytest.fixture(scope="module")
def lace_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """24 images with captions, a fitted dictionary, and the flags of a LACE run writing no periodic checkpoint."""
    folder = lace_run_folder(tmp_path_factory.mktemp("preemption"))
    flags = ["train", "--model", "lace-micro-32", "--data", str(folder / "pairs.csv"), "--steps", str(STEPS),
             "--batch-size", "8", "--grad-accumulation", str(ACCUMULATION), "--lr", "2e-3", "--warmup-steps", "1",
             "--log-every", "1", "--checkpoint-every", "0", "--device", "cpu", "--seed", "3", "--no-progress",
             "--counterfactual-captions", "--counterfactual-images", "--dictionary", str(folder / "dictionary"),
             "--vocabulary", WORLD_VOCABULARY, "--caption-negatives", "--refresh-dictionary-every", "2",
             "--refresh-pool-size", "40", "--dist-timeout", "60"]
    return folder, flags


@pytest.fixture(scope="module")
def one_process_reference(lace_run) -> Path:
    """The uninterrupted run, in this process."""
    folder, flags = lace_run
    reference = folder / "whole-one"
    assert main([*flags, "--out", str(reference)]) == 0
    return reference


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(run: Path, reference: Path) -> None:
    """Final weights, every logged loss and the sample count equal the reference run's bit for bit."""
    weights = load_file(str(latest_checkpoint(run).with_suffix(".safetensors")))
    expected = load_file(str(latest_checkpoint(reference).with_suffix(".safetensors")))
    assert weights.keys() == expected.keys()
    different = [k for k in weights if not torch.equal(weights[k], expected[k])]
    assert not different, f"resumed weights differ from the uninterrupted run: {different}"
    ours, theirs = metrics(run), metrics(reference)
    assert [m["step"] for m in ours] == list(range(1, STEPS + 1))
    assert [m["loss"] for m in ours] == [m["loss"] for m in theirs]
    assert ours[-1]["samples_seen"] == theirs[-1]["samples_seen"] == STEPS * ACCUMULATION * 8


def printed_resume(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    return shlex.split(lines[lines.index("resume with:") + 1])


def seeded_call(rng: random.Random, first_step: int = 1, last_step: int = STEPS - 1) -> tuple[int, int]:
    """A micro-batch of steps `first_step`..`last_step` (by default any before the last step, not the run's
    first micro-batch), and the step it belongs to (where the run must stop)."""
    call = rng.randint(max(2, (first_step - 1) * ACCUMULATION + 1), last_step * ACCUMULATION)
    return call, (call + ACCUMULATION - 1) // ACCUMULATION


# ---- one process ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_preemption_signal_saves_the_step_and_the_resumed_run_is_exact(lace_run, one_process_reference, tmp_path,
                                                                       capfd, signum):
    _, flags = lace_run
    call, step = seeded_call(random.Random(SEED + signum))
    run = tmp_path / "run"
    capfd.readouterr()
    code = run_killed([*flags, "--out", str(run)], KillPoint("lace.train.loop", "Trainer._micro_step", call), signum)
    stderr = capfd.readouterr().err
    assert code == PREEMPTED_EXIT, stderr
    assert f"preempted ({signal.Signals(signum).name}): finishing this step" in stderr
    assert f"lace train: preempted (exit status 75: resumable); saved checkpoint step_{step:07d}" in stderr
    assert [m.stem for m in complete_checkpoints(run)] == [f"step_{step:07d}"]  # the stop wrote it
    command = printed_resume(stderr)
    assert command[0] == "lace" and command[-2:] == ["--resume", "latest"]
    assert main(command[1:]) == 0
    assert_same_run(run, one_process_reference)


@pytest.mark.slow
def test_resume_auto_starts_afresh_then_resumes(lace_run, one_process_reference, tmp_path):
    """`--resume auto`: no checkpoint yet, a fresh start (also over a run killed before its first one);
    with one, the run carries on from it."""
    _, flags = lace_run
    run = tmp_path / "auto"
    run.mkdir()
    (run / "config.json").write_text("{}")  # left by a run killed before its first checkpoint
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    call, step = seeded_call(random.Random(SEED))
    code = run_killed([*flags, "--out", str(run), "--resume", "auto"],
                      KillPoint("lace.train.loop", "Trainer._micro_step", call), signal.SIGTERM)
    assert code == PREEMPTED_EXIT
    assert latest_checkpoint(run).stem == f"step_{step:07d}"
    assert main([*flags, "--out", str(run), "--resume", "auto"]) == 0
    assert_same_run(run, one_process_reference)


# ---- two processes ----------------------------------------------------------------------------------------


def torchrun(argv: list[str], records: Path, fault: str = "none", restarts: int = 0,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node 2` of `lace <argv>` through `fault_worker.py`."""
    records.mkdir(parents=True, exist_ok=True)
    # the c10d rendezvous (--standalone): a restarted attempt gets its own rendezvous round, where the static
    # one (--master_port) would hand it the first attempt's stale addresses
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--max-restarts", str(restarts), "--monitor-interval", "0.5", WORKER, str(records), fault, *argv]
    return subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)


def start_two_processes(argv: list[str], records: Path, fault: str = "none") -> list:
    """`lace <argv>` through `fault_worker.run_as_rank` in two processes forked from the tests' fork server, as
    ranks 0 and 1 of a job; each writes its stdout and stderr to `records/rank<r>.out` and `.err`."""
    records.mkdir(parents=True, exist_ok=True)
    context, port = forkserver(), free_port()
    processes = [context.Process(target=run_as_rank, args=(rank, 2, port, str(records), fault, argv,
                                                           str(records / f"rank{rank}")))
                 for rank in (0, 1)]
    for process in processes:
        process.start()
    return processes


def two_processes(argv: list[str], records: Path, fault: str = "none", timeout: float = 300) -> tuple[list[int], str]:
    """`start_two_processes`, waited for: the exit codes of ranks 0 and 1, and rank 0's stderr."""
    processes = start_two_processes(argv, records, fault)
    try:
        for process in processes:
            process.join(timeout)
            assert process.exitcode is not None, f"lace {argv[0]} still running after {timeout} s"
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return [process.exitcode for process in processes], (records / "rank0.err").read_text()


def records_of(records: Path) -> list[dict]:
    return [json.loads((records / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def two_process_reference(lace_run) -> Path:
    folder, flags = lace_run
    reference = folder / "whole-two"
    codes, stderr = two_processes([*flags, "--out", str(reference)], folder / "records-whole")
    assert codes == [0, 0], stderr[-3000:]
    return reference


@pytest.mark.slow
@pytest.mark.parametrize("action", ["parent-SIGTERM", "SIGUSR1"])
def test_two_processes_stop_at_one_step_on_a_preemption_signal_and_resume_exactly(lace_run, two_process_reference,
                                                                                 tmp_path, action):
    """SIGTERM to torchrun's launcher (it passes it on to both workers), or SIGUSR1 to one process only: both
    stop at the same step, rank 0 writes the one checkpoint, both exit with status 75; the printed torchrun
    command resumes the run exactly."""
    _, flags = lace_run
    # the launcher passes the signal on while the workers train: drawn two steps before the end, not one
    call, step = seeded_call(random.Random(SEED + len(action)),
                             last_step=STEPS - 2 if action == "parent-SIGTERM" else STEPS - 1)
    rank = 1 if action == "SIGUSR1" else 0
    run, fault = tmp_path / "run", f"{rank}:{call}:{action}"
    if action == "parent-SIGTERM":
        stderr = torchrun([*flags, "--out", str(run)], tmp_path / "records", fault).stderr
    else:
        _, stderr = two_processes([*flags, "--out", str(run)], tmp_path / "records", fault)
    stopped = records_of(tmp_path / "records")
    assert [r["code"] for r in stopped] == [PREEMPTED_EXIT, PREEMPTED_EXIT], stderr[-3000:]
    assert stopped[0]["step"] == stopped[1]["step"], "the processes stopped at different steps"
    if action == "SIGUSR1":  # one process was signalled; the other learnt of it at the step's end
        assert stopped[0]["step"] == step
    assert [m.stem for m in complete_checkpoints(run)] == [f"step_{stopped[0]['step']:07d}"]
    command = printed_resume(stderr)
    assert command[:5] == ["torchrun", "--nproc_per_node", "2", "-m", "lace"]
    assert command[-2:] == ["--resume", "latest"]
    codes, resumed = two_processes(command[5:], tmp_path / "records-resumed")
    assert codes == [0, 0], resumed[-3000:]
    assert_same_run(run, two_process_reference)


@pytest.mark.slow
def test_a_worker_killed_under_max_restarts_and_resume_auto_finishes_exactly(lace_run, two_process_reference,
                                                                          tmp_path):
    """torchrun restarts the job whose worker was SIGKILLed after the first periodic checkpoint; `--resume auto`
    carries on from it."""
    _, flags = lace_run
    call, _ = seeded_call(random.Random(SEED + 9), first_step=3)  # after the checkpoint of step 2
    # a short collective timeout: the surviving worker ends soon after its peer's death (the launcher restarts
    # the job once both are gone)
    periodic = [*flags[: flags.index("--checkpoint-every")], "--checkpoint-every", "2",
                *flags[flags.index("--checkpoint-every") + 2: flags.index("--dist-timeout")], "--dist-timeout", "8"]
    run = tmp_path / "run"
    done = torchrun([*periodic, "--out", str(run), "--resume", "auto"], tmp_path / "records",
                    f"1:{call}:SIGKILL", restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["attempt"] for r in records_of(tmp_path / "records")] == [1, 1], "the job was not restarted"
    assert "; resumed from step 2" in done.stdout + done.stderr, "the restarted job did not resume from step 2"
    assert_same_run(run, two_process_reference)


@pytest.mark.slow
def test_a_hung_worker_ends_the_other_within_the_timeout_naming_it(lace_run, tmp_path):
    _, flags = lace_run
    timeout = 4
    run, records = tmp_path / "run", tmp_path / "records"
    argv = [*flags[: flags.index("--dist-timeout")], "--dist-timeout", str(timeout), "--out", str(run)]
    workers = start_two_processes(argv, records, "1:5:hang")
    try:
        workers[0].join(240)  # bounded: the timeout plus start-up on a busy machine
        assert workers[0].exitcode is not None, "rank 0 did not end"
        assert workers[1].is_alive(), "the hung worker was expected to still hang"
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
    stderr = (records / "rank0.err").read_text()
    assert workers[0].exitcode == LOST_PROCESS_EXIT, stderr[-3000:]
    assert "lace train: error: rank 1 of 2 died or stopped answering at step 3" in stderr, stderr[-3000:]
    assert f"collectives wait {timeout} s, --dist-timeout" in stderr
    assert latest_checkpoint(run) is None  # nothing half-written is left as latest (no checkpoint was due)


def test_a_repeated_signal_is_the_same_request_and_a_later_ctrl_c_stops_at_once(monkeypatch):
    """torchrun passes the Ctrl-C its workers already had on again at once: that second SIGINT, and a SIGTERM
    after any request, change nothing; a second Ctrl-C after REPEAT_SECONDS stops at once."""
    from lace.train import interrupt

    clock = [100.0]
    monkeypatch.setattr(interrupt.time, "monotonic", lambda: clock[0])
    request = interrupt.StopRequest()
    request._handle(signal.SIGINT, None)
    clock[0] += 0.05
    request._handle(signal.SIGINT, None)  # the launcher's copy
    request._handle(signal.SIGTERM, None)
    assert request.requested == interrupt.CTRL_C
    clock[0] += interrupt.REPEAT_SECONDS + 0.1
    with pytest.raises(KeyboardInterrupt):
        request._handle(signal.SIGINT, None)
    preempted = interrupt.StopRequest()
    preempted._handle(signal.SIGUSR1, None)
    clock[0] += 10
    preempted._handle(signal.SIGTERM, None)  # a scheduler's repeat: never stops at once
    assert preempted.requested == interrupt.PREEMPTED
