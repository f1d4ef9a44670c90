"""``episodelake.torch``: the PyTorch helpers under a short name.

Importing this module does not import torch; each helper imports torch (or
tensordict) only when called.
"""

from .integrations.tensordict import batch_to_tensordict
from .integrations.torch import collate_to_torch, to_torch

__all__ = ["batch_to_tensordict", "collate_to_torch", "to_torch"]
