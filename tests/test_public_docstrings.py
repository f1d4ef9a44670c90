"""Docstrings are the API reference (issue 45, item 3): every public name has its own.

The names in ``episodelake.__all__`` are what the reference lists; each must
carry a docstring of its own (not one inherited from a base class), so the
generated page never shows a bare signature.
"""

from __future__ import annotations

import inspect

import pytest

import episodelake as el


@pytest.mark.parametrize("name", el.__all__)
def test_every_public_name_has_a_docstring(name: str):
    obj = getattr(el, name)
    own = obj.__doc__ if inspect.isclass(obj) or inspect.isroutine(obj) else inspect.getdoc(obj)
    assert own and own.strip(), f"episodelake.{name} has no docstring of its own"
    if inspect.isclass(obj):  # a dataclass without one gets its signature as __doc__
        assert not own.startswith(f"{obj.__name__}("), f"episodelake.{name}'s docstring is its generated signature"


def test_all_lists_only_what_the_package_has():
    assert len(set(el.__all__)) == len(el.__all__)
    assert all(hasattr(el, name) for name in el.__all__)
