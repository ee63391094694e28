"""The toolkit's version, stamped on every store, record and report (pyproject.toml reads it; CHANGELOG.md's first
release heading names it)."""

__version__ = "0.2.0.dev0"
