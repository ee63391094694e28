"""Protocols: each declared once in the registry (``registry``) and run through one call (``api.run``)."""
