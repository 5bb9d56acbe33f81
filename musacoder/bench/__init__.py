"""Benchmark harness: evaluate a model on KernelBench-format tasks the way the MusaCoder paper does."""

from musacoder.bench.clients import Client, Generation, Request, make_client
from musacoder.bench.report import compare
from musacoder.bench.runner import BenchConfig, run_bench

__all__ = ["BenchConfig", "Client", "Generation", "Request", "compare", "make_client", "run_bench"]
