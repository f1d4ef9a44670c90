"""Credential option names are recognised whatever their case, so their values are never shown.

``location.redact`` promises: a value is a credential when its option name
contains ``key``, ``secret``, ``token``, ``password``, ``credential``, ``sas``
or ``auth``, "whatever its case". Real option spellings are mixed-case
(botocore and deltalake take ``AWS_SECRET_ACCESS_KEY``, adlfs ``account_key``
or ``SAS_TOKEN``); the reference below is a hand-written table of such names,
and every case variant of a credential word must be hidden the same way.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import episodelake as el
from episodelake.storage.location import REDACTED, StorageTimeouts, redact, resolve

# option name -> is its value a credential (by the documented rule, written out by hand)
NAMES = {
    "key": True,
    "secret": True,
    "token": True,
    "AWS_ACCESS_KEY_ID": True,
    "AWS_SECRET_ACCESS_KEY": True,
    "AWS_SESSION_TOKEN": True,
    "Aws_Secret_Access_Key": True,
    "account_key": True,
    "SAS_TOKEN": True,
    "Password": True,
    "CLIENT_SECRET": True,
    "Authorization": True,
    "GOOGLE_APPLICATION_CREDENTIALS": True,
    "endpoint_url": False,
    "AWS_REGION": False,
    "region_name": False,
    "anon": False,
    "use_ssl": False,
    "profile": False,
}
WORDS = ("key", "secret", "token", "password", "credential", "sas", "auth")


def test_every_credential_spelling_is_hidden_and_nothing_else():
    options = {name: f"value-of-{name}" for name in NAMES}
    options["client_kwargs"] = {name: f"nested-{name}" for name in NAMES}
    shown = redact(options)
    for name, secret in NAMES.items():
        assert (shown[name] == REDACTED) is secret, name
        assert (shown["client_kwargs"][name] == REDACTED) is secret, name
    text = repr(resolve("s3://bucket/data", options))
    for name, secret in NAMES.items():
        assert (f"value-of-{name}" in text) is not secret, name
        assert (f"nested-{name}" in text) is not secret, name


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a busy machine is no failure
@given(st.sampled_from(WORDS), st.lists(st.booleans(), min_size=12, max_size=12), st.text("_-x1", max_size=3))
def test_a_credential_word_in_any_case_is_hidden(word, upper, suffix):
    name = "".join(c.upper() if up else c for c, up in zip(word, upper, strict=False)) + suffix
    assert redact({name: "s3cr3t", "region": "eu"}) == {name: REDACTED, "region": "eu"}


def test_timeouts_are_a_policy_a_dict_of_its_fields_or_refused():
    """``storage_options["timeouts"]``: None, a StorageTimeouts or a dict of its fields; anything else is refused."""
    assert StorageTimeouts.parse(None) == StorageTimeouts()
    assert StorageTimeouts.parse({"max_retries": 4}) == StorageTimeouts(max_retries=4)
    for bad in (30, "30s", [4], 2.5):
        with pytest.raises(el.ArgumentError, match="timeouts must be"):
            StorageTimeouts.parse(bad)
