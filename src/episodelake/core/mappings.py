"""Option objects built from plain mappings: one rule and one message for a key the object does not have."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from .errors import ArgumentError

T = TypeVar("T")


def from_mapping(cls: type[T], value: Mapping[str, Any], what: str) -> T:
    """``cls(**value)`` for a dataclass ``cls``; an unknown key raises :class:`ArgumentError` naming ``what``."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ArgumentError(f"{what}: unknown key(s) {unknown}; known: {known}")
    return cls(**value)
