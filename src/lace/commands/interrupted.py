"""What `lace` prints when Ctrl-C or a preemption notice stops a command: what was kept and the command that
carries on."""

from __future__ import annotations

import os
import shlex

# Commands whose rerun carries on from what an interrupted run kept, and the flag that asks for it.
RESUME_FLAGS = {"train": ("--resume", "latest"), "embed": None, "dict": None, "study": None}
DROPPED_FLAGS = {"--overwrite": 0, "--resume": 1}  # flag -> values it takes


def resume_command(command: str, argv: list[str]) -> str | None:
    """The command line that resumes an interrupted `argv` (None when `command` cannot resume).

    `--overwrite` is dropped (it would clear what was kept); `train` gets `--resume latest`.
    """
    if command not in RESUME_FLAGS:
        return None
    kept, skip = [], 0
    for word in argv:
        if skip:
            skip -= 1
            continue
        name = word.split("=", 1)[0]
        if name in DROPPED_FLAGS:
            skip = DROPPED_FLAGS[name] if "=" not in word else 0
            continue
        kept.append(word)
    extra = RESUME_FLAGS[command] or ()
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    launcher = ["lace"] if processes <= 1 else ["torchrun", "--nproc_per_node", str(processes), "-m", "lace"]
    return shlex.join([*launcher, *kept, *extra])


def interrupted_message(command: str, argv: list[str], interrupt: KeyboardInterrupt) -> str:
    """Lines for stderr after Ctrl-C stopped `lace <argv>`."""
    checkpoint = getattr(interrupt, "checkpoint", None)
    if checkpoint is not None:
        kept = f"saved checkpoint {checkpoint.stem} in {checkpoint.parent}"
    elif command == "train":
        kept = "stopped at once; the latest complete checkpoint is kept"
    elif command == "embed":
        kept = "the rows embedded so far are kept (in the hidden work folder beside the output)"
    else:
        kept = "no half-written output is left"
    how = resume_command(command, argv)
    resume = f"\nresume with:\n  {how}" if how else "\nrun the command again to start over"
    reason = getattr(interrupt, "reason", "interrupted")
    if reason == "preempted":
        reason = f"preempted (exit status {interrupt.exit_code}: resumable)"
    return f"lace {command}: {reason}; {kept}{resume}"
