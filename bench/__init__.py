"""Benchmarks of jfa_ops against its peers: see bench/README.md (run: python -m bench --help)."""
