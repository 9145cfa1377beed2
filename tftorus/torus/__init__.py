"""The 2D torus itself, framework-free of any engine: the grid (which ranks form each row and
column), the three collectives every algorithm is written against (communicator), the
algorithms over them (torus, ring, hierarchical), tensor fusion into buckets, and wire
compression. Bottom room: imports no other part of tftorus."""
