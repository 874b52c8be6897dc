"""Step: the pure training step, the loop helper and checkpoints."""

from sbfunc.step import checkpoint

__all__ = ["checkpoint"]
