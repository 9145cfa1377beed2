"""Deciding how to all-reduce, before and during the job: the alpha-beta-gamma cost model, the
planner (grid, buckets, chunks and algorithm per bucket) and the link probe that measures the
job's own links for it. Pure Python and numpy but the probe; imports torus only."""
