"""The toolkit's version, stamped on every store, record and report."""

__version__ = "0.1.0"
