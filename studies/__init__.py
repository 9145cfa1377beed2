"""Studies and benchmarks: they measure the product (tftorus, official_resnet, run_scripts/train.py)
and import it; the product never imports them. Run each from the repository root, e.g.
`.venv/bin/python -m studies.benchmark_allreduce --np 4 8`."""
