"""imagebuilder: PyTorch GPU images from a compatibility matrix."""

__version__ = "0.1.0"
