"""Benchmarks (`python bench/run_bench.py`); a package so the floor workflow module is importable."""
