"""Time to first page of `lace explore`: from starting the command to the page served over HTTP.

Starts `python -m lace explore --demo DIR` (the no-argument path: the demo's cached world, base and
dictionary, made with `lace demo --quick` sizes in an empty DIR) as a subprocess, polls the page, and
reports the wall time to the first 200 along with the command's own "ready in" figure (after its
imports) and the machine's load average. Run it twice on a fresh DIR for the cold and the cached figure.
No peer: the TensorBoard projector needs a checkpoint export first and is not installed here.

Usage: python benchmarks/explore_first_page.py --demo runs/demo [--port 8799] [explore flags...]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

POLL_SECONDS = 0.1
TIMEOUT_SECONDS = 900


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", default="runs/demo", help="demo folder (cold when empty or missing)")
    parser.add_argument("--port", type=int, default=8799)
    args, rest = parser.parse_known_args(argv)
    cached = os.path.isdir(os.path.join(args.demo, "stages"))
    load_before = os.getloadavg()[0]
    command = [sys.executable, "-m", "lace", "explore", "--demo", args.demo, "--port", str(args.port),
               "--no-progress", *rest]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seconds = _wait_for_page(f"http://127.0.0.1:{args.port}/", process, start)
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    ready = re.search(r"ready in ([0-9.]+)s", output)
    result = {"seconds_to_first_page": round(seconds, 2), "seconds_ready_after_imports": float(ready.group(1))
              if ready else None, "demo_cache_present": cached, "load_average_1min": round(load_before, 2),
              "cpus": os.cpu_count()}
    print(output.strip())
    print(json.dumps(result))
    return 0


def _wait_for_page(url: str, process: subprocess.Popen, start: float) -> float:
    while time.perf_counter() - start < TIMEOUT_SECONDS:
        if process.poll() is not None:
            raise SystemExit(f"lace explore exited with code {process.returncode} before serving the page")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return time.perf_counter() - start
        except OSError:
            time.sleep(POLL_SECONDS)
    raise SystemExit(f"no page after {TIMEOUT_SECONDS}s")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
