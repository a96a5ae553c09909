"""Benchmarks, registered by name: each module reads one original release format.

    from lace.eval.benchmarks import get_benchmark
    benchmark = get_benchmark("sugarcrepe")
    figures = benchmark.evaluate(encoder, benchmark.load("data/sugarcrepe"))
"""

from lace.eval.benchmarks import (  # noqa: F401  (registers)
    aro,
    retrieval,
    sugarcrepe,
    valse,
    winoground,
    world,
    zeroshot,
)
from lace.eval.benchmarks.base import BENCHMARKS, Benchmark, get_benchmark, register_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "get_benchmark", "register_benchmark"]
