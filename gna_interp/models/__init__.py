"""Loading models and the architecture table."""

from .handle import GnaModel
from .loading import load

__all__ = ["GnaModel", "load"]
