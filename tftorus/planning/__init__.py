"""How to all-reduce on this job's links: the cost model, the planner (grid, buckets, chunks,
algorithm per bucket) and the link probe that measures them. Imports torus only."""
