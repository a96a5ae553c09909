"""Start-up time of the `lace` command line: `lace --help` and `lace train --help`, each a fresh process.

Floor: `python -c "import torch"`, what any command that runs a model pays anyway (a `--help` that costs less
than it imports no torch). Peer: `python -m open_clip_train.main --help`, the help of the training command
lace's flags borrow from, when open_clip_train is installed (it imports torch and open_clip before parsing);
`vs_peer_ratio` is `lace train --help` over it, null (and the reason printed) when it cannot run here. Each time is the median wall time of --repeats
runs, alternated so that a busy machine slows all alike; the load average is printed with the figures.
`peak_gb` is the largest resident set of the lace processes. Target: `lace --help` <= 1.0 s.

Usage: python benchmarks/cli_start.py [--repeats 5]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"


def wall_seconds(command: list[str]) -> float:
    """Wall time of one run of `command` (its output discarded); a failing command is an error."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(SOURCE)})
    return time.perf_counter() - start


def why_it_cannot_run(command: list[str]) -> str | None:
    """None when `command` runs here, else why not (for the peer, which may be absent or miss a dependency)."""
    if importlib.util.find_spec("open_clip_train") is None:
        return "open_clip_train is not installed"
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        return f"its --help fails here ({last})"
    return None


def median_times(commands: dict[str, list[str]], repeats: int) -> dict[str, float]:
    """Median wall time of each command over `repeats` rounds (one run of each per round)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            times[name].append(wall_seconds(command))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (the median is reported)")
    args = parser.parse_args()
    python = sys.executable
    lace = median_times({"help": [python, "-m", "lace", "--help"],
                         "train_help": [python, "-m", "lace", "train", "--help"]}, args.repeats)
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB, lace's runs only so far
    others = {"import_torch": [python, "-c", "import torch"]}
    peer_command = [python, "-m", "open_clip_train.main", "--help"]
    peer_note = why_it_cannot_run(peer_command)
    if peer_note is None:
        others["open_clip_train_help"] = peer_command
    floor = median_times(others, args.repeats)
    rows = [("lace --help", lace["help"]), ("lace train --help", lace["train_help"]),
            ('python -c "import torch" (floor)', floor["import_torch"])]
    if "open_clip_train_help" in floor:
        rows.append(("python -m open_clip_train.main --help (peer)", floor["open_clip_train_help"]))
    else:
        print(f"peer python -m open_clip_train.main --help not timed: {peer_note}")
    print(f"median of {args.repeats} runs each; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'command':<48}{'seconds':>9}")
    for name, seconds in rows:
        print(f"{name:<48}{seconds:>9.2f}")
    print(f"target: lace --help <= 1.0 s: {'met' if lace['help'] <= 1.0 else 'missed'}")
    peer = floor.get("open_clip_train_help")
    print(json.dumps({
        "benchmark": "cli_start", "help_s": round(lace["help"], 3), "train_help_s": round(lace["train_help"], 3),
        "import_torch_s": round(floor["import_torch"], 3),
        "open_clip_train_help_s": None if peer is None else round(peer, 3),
        "vs_peer_ratio": None if peer is None else round(lace["train_help"] / peer, 3),
        "vs_floor_ratio": round(lace["help"] / floor["import_torch"], 3), "peak_gb": round(peak_gb, 3),
        "load_average": round(os.getloadavg()[0], 2), "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
