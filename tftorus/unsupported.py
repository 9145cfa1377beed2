"""Horovod names that tftorus' facades refuse with a reason, instead of handing out Horovod's own
(which would reduce over a flat ring, or over a world the torus groups no longer match)."""

REFUSED = {
    "elastic": (
        "Horovod's elastic training re-forms the world while workers come and go, but tftorus "
        "builds its row and column process sets once, at tftorus.init(), and a changed world "
        "would reduce over stale groups. Train on a fixed world size (a run resumes from its "
        "checkpoints on another size at a phase boundary), or use Horovod's own elastic API "
        "with hvd.DistributedOptimizer (a flat ring)"),
}


class UnsupportedError(AttributeError):
    """A Horovod feature tftorus does not offer; the message says why and what to use."""


def refuse(module: str, name: str):
    """For a facade's module __getattr__: UnsupportedError for refused names, else the usual
    AttributeError."""
    if name in REFUSED:
        raise UnsupportedError(f"{module}.{name} is not supported: {REFUSED[name]}")
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
