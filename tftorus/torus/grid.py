"""The 2D-torus geometry: which ranks form each row and each column.

N workers sit in a grid of Y rows by X columns (the paper's "vertical x horizontal").
Rank r sits at row r // X and column r % X, so a row is X consecutive ranks: on a cluster a
row is the GPUs of one or a few nodes, and the row phases (reduce-scatter, all-gather) stay on
the fast intra-node links as far as possible.
"""
import dataclasses
import logging
import re
from typing import Sequence, Tuple, Union

logger = logging.getLogger(__name__)

# Table 4 of the paper: world size -> (vertical Y, horizontal X).
PAPER_GRIDS = {
    1024: (32, 32),
    2048: (32, 64),
    2176: (34, 64),
    3456: (48, 72),
    4096: (64, 64),
}


class GridError(ValueError):
    """A grid that does not fit the world; raised before any collective runs."""


@dataclasses.dataclass(frozen=True)
class TorusGrid:
    """A world of `size` ranks as `y` rows of `x` ranks each."""

    size: int
    x: int  # row length (horizontal): members of one reduce-scatter / all-gather

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < 1:
            raise GridError(f"world size must be a positive integer, got {self.size!r}")
        if not isinstance(self.x, int) or self.x < 1 or self.size % self.x:
            raise GridError(
                f"a row of {self.x!r} ranks does not divide the world of {self.size} ranks; "
                f"pick a row length from {divisors(self.size)} "
                f"(or leave the grid out and let tftorus plan one)")

    @property
    def y(self) -> int:
        """Column length (vertical): members of one column all-reduce."""
        return self.size // self.x

    def row_of(self, rank: int) -> int:
        return rank // self.x

    def col_of(self, rank: int) -> int:
        return rank % self.x

    def row(self, index: int) -> Tuple[int, ...]:
        """Ranks of row `index`, in column order."""
        return tuple(range(index * self.x, (index + 1) * self.x))

    def col(self, index: int) -> Tuple[int, ...]:
        """Ranks of column `index`, in row order."""
        return tuple(range(index, self.size, self.x))

    def rows(self) -> Tuple[Tuple[int, ...], ...]:
        return tuple(self.row(i) for i in range(self.y))

    def cols(self) -> Tuple[Tuple[int, ...], ...]:
        return tuple(self.col(j) for j in range(self.x))

    def row_group(self, rank: int) -> Tuple[int, ...]:
        return self.row(self.row_of(rank))

    def col_group(self, rank: int) -> Tuple[int, ...]:
        return self.col(self.col_of(rank))

    @property
    def sequential_steps(self) -> int:
        """Point-to-point steps one torus all-reduce takes: 2(X-1) + 2(Y-1) (a ring: 2(N-1))."""
        return 2 * (self.x - 1) + 2 * (self.y - 1)

    def __str__(self):
        return f"{self.y}x{self.x}"


def divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


def grid_shape(spec: str) -> Tuple[int, int]:
    """'YxX' -> (Y, X), before the world size is known (flag checks); GridError if malformed."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", spec)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise GridError(
            f"grid {spec!r} is not of the form 'YxX' (rows x row length, both >= 1, e.g. '2x4'), "
            f"'paper', or 'auto'")
    return int(match.group(1)), int(match.group(2))


def parse_grid(spec: str, size: int) -> TorusGrid:
    """'YxX' (vertical x horizontal, as in the paper's Table 4) -> TorusGrid for `size` ranks."""
    y, x = grid_shape(spec)
    if y * x != size:
        raise GridError(
            f"grid {spec} has {y * x} ranks but the world has {size}; "
            f"use a grid whose product is {size}, e.g. {plan_grid(size)}")
    return TorusGrid(size=size, x=x)


def plan_grid(size: int, local_size: int = 1) -> TorusGrid:
    """Pick a grid for `size` ranks when the user gives none.

    The torus takes 2(X-1) + 2(Y-1) sequential steps, fewest when X and Y are close, and its
    column phase moves 1/X of the buffer, so between equally square grids the wider one (X >= Y)
    wins. On several nodes, rows are kept whole nodes (X a multiple of `local_size`) when such a
    grid exists, so the row phases run on intra-node links. A prime world degrades to one row
    (a ring) with a warning. (A planner by predicted time on a given cluster is
    plan_grid_by_cost beside the cost model; the runtime does not use it.)
    """
    if size < 1:
        raise GridError(f"world size must be positive, got {size}")
    candidates = [x for x in divisors(size) if x * x >= size]  # X >= Y
    multi_node = 1 < local_size < size
    whole_nodes = [x for x in candidates if multi_node and x % local_size == 0]
    x = min(whole_nodes or candidates, key=lambda x: (x - size // x, x))
    if size > 3 and len(divisors(size)) == 2:
        logger.warning(
            "world size %d is prime: the torus degrades to a single row of %d ranks (a ring); "
            "a world size with factors (e.g. %d or %d) gives a real 2D grid",
            size, size, size - 1, size + 1)
    return TorusGrid(size=size, x=x)


GridSpec = Union[None, str, int, Sequence[int], TorusGrid]


def resolve_grid(spec: GridSpec, size: int, local_size: int = 1) -> TorusGrid:
    """Turn what a user may pass as `grid=` into a TorusGrid for a world of `size` ranks.

    None or 'auto': plan_grid; 'paper': Table 4 of the paper (error for other sizes);
    'YxX' or (Y, X): that shape; an int: the row length X; a TorusGrid: checked against `size`.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
        return plan_grid(size, local_size)
    if isinstance(spec, TorusGrid):
        if spec.size != size:
            raise GridError(f"grid {spec} is for {spec.size} ranks but the world has {size}")
        return spec
    if isinstance(spec, str) and spec.strip().lower() == "paper":
        if size not in PAPER_GRIDS:
            raise GridError(
                f"the paper gives grids only for {sorted(PAPER_GRIDS)} ranks, not {size}; "
                f"use grid='auto' or an explicit 'YxX'")
        return TorusGrid(size=size, x=PAPER_GRIDS[size][1])
    if isinstance(spec, str):
        return parse_grid(spec, size)
    if isinstance(spec, bool):
        raise GridError(f"grid must be 'auto', 'paper', 'YxX', (Y, X) or a row length, not {spec!r}")
    if isinstance(spec, int):
        return TorusGrid(size=size, x=spec)
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return parse_grid(f"{spec[0]}x{spec[1]}", size)
    raise GridError(f"grid must be 'auto', 'paper', 'YxX', (Y, X) or a row length, not {spec!r}")


def hierarchical_grid(size: int, local_size: int) -> TorusGrid:
    """The grid hierarchical all-reduce uses: a row per node (X = ranks per node)."""
    if local_size < 1 or size % local_size:
        raise GridError(
            f"hierarchical all-reduce needs the same number of ranks on every node; "
            f"{size} ranks do not split into nodes of {local_size}")
    return TorusGrid(size=size, x=local_size)

