"""Command-line flags (absl) and the paper's experiment table, for run_scripts/train.py."""
