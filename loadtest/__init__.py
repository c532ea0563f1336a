"""Benchmarks and load tests, each a `python -m loadtest.<name>` command that prints its
figures (the README's performance table says which command gives which figure)."""
