"""probe: what a frozen self-supervised ViT checkpoint learned about patches.

The Python API is one call over the protocol registry, the same the ``probe`` CLI makes:

    import probe_toolkit as probe
    run = probe.run("knn", "cache/dino-1a2b3c4d/teacher.zarr", train="imagenet-train", val="imagenet-val")
    probe.run("knn", store, train=..., val=..., block=8)   # block 8 (0-based) of the network, where the store holds it
    probe.sweep("knn", store, blocks=[3, 7, 11], train=..., val=...)  # one run and record per block
    probe.list_protocols()  # every registered protocol, with its settings and references
"""

from ._version import __version__

__all__ = ["__version__", "list_protocols", "run", "sweep"]


def run(name, source=None, **keywords):
    """Run one protocol (``probe_toolkit.protocols.api.run``); returns its ``Run``, records included."""
    from .protocols.api import run as run_protocol

    return run_protocol(name, source, **keywords)


def sweep(name, source=None, *, blocks, **keywords):
    """One run of a protocol per block (``probe_toolkit.protocols.api.sweep``): a list of ``Run``, each record naming its block."""
    from .protocols.api import sweep as sweep_protocol

    return sweep_protocol(name, source, blocks=blocks, **keywords)


def list_protocols():
    """The registered protocols (``probe_toolkit.protocols.registry``)."""
    from .protocols.registry import protocols as registered

    return registered()
