"""The 2D torus itself: the grid, the three collectives every algorithm is written against
(communicator), the algorithms over them, fusion into buckets, wire compression. Imports nothing."""
