"""probe: what a frozen self-supervised ViT-S/16 checkpoint learned about patches."""

__version__ = "0.1.0"
