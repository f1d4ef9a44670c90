"""``episodelake.utils``: episodata's ``utils`` helpers, so ``from episodata.utils import ...`` ports by its name.

``schema_from_gym_spaces(observation_space, action_space)`` builds a schema
from Gymnasium spaces; ``batch_to_tensordict(batch, device=None)`` converts
a sampled batch into a ``TensorDict`` (TorchRL's layout: ``observation`` and
``("next", "observation")`` share one tensor when ``device`` is given here;
see :mod:`episodelake.integrations.tensordict`). Importing this module
imports neither torch, tensordict nor gymnasium: each helper imports what it
needs when called.
"""

from __future__ import annotations

from typing import Any

from .core.errors import ArgumentError
from .core.schema import schema_from_gym_spaces
from .integrations.tensordict import batch_to_tensordict as _batch_to_tensordict

__all__ = ["batch_to_tensordict", "schema_from_gym_spaces"]


def batch_to_tensordict(
    batch: Any, device: Any = None, include_all_observations: bool = False, alignment: str | None = None
) -> Any:
    """A ``TensorDict`` of a segment or transition batch, on ``device`` (see the module docstring).

    episodata's ``include_all_observations=True`` and ``alignment=`` (every
    entry stretched to ``L + 1`` rows with placeholder zeros) have no
    counterpart in TorchRL's layout and are refused with an
    :class:`~episodelake.errors.ArgumentError` saying what to read instead.
    """
    if include_all_observations:
        raise ArgumentError(
            "batch_to_tensordict: include_all_observations=True is not taken; td['observation'] and "
            "td['next', 'observation'] are the L + 1 observations as two views of one tensor "
            "(batch.all_obs holds them as one array)"
        )
    if alignment is not None:
        raise ArgumentError(
            f"batch_to_tensordict: alignment={alignment!r} is not taken: no placeholder rows are made; "
            "read td['observation'] (where each action was taken) and td['next', 'observation'] (what it produced)"
        )
    return _batch_to_tensordict(batch, device)
