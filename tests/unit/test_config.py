"""daemon/config.py without a daemon: parsing, and docs/config.md kept equal to KEYS."""
from __future__ import annotations

import os

import pytest

from daemon import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_docs_carry_the_keys_table():
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        assert config.markdown_table() in f.read()


def test_every_key_has_a_field_and_one_line_of_doc():
    fields = {f.name for f in config.dataclasses.fields(config.Config)} - {"path"}
    assert fields == set(config.KEY_NAMES)
    for key in config.KEYS:
        assert key.doc and "\n" not in key.doc and key.type and key.default


def test_parse_values():
    c = config.parse('backend = "host"\nmount = ""\nscrub_rate = "200M"\n'
                     'host_capacity = 1048576\n[quotas]\n0 = "16G"\n"1000" = 0\n')
    assert (c.backend, c.mount, c.scrub_rate, c.host_capacity) == \
        ("host", None, 200 << 20, 1 << 20)
    assert c.quotas == {0: 16 << 30, 1000: 0}
    assert config.parse('default_quota = "4G"').default_quota == 4 << 30
    assert config.parse('default_quota = "25%"').default_quota == 0.25
    assert config.parse('default_quota = "none"').default_quota is None


@pytest.mark.parametrize("text, message", [
    ("ecc = true", "bad value for 'ecc': True: expected one of rs, none"),
    ("quota = 1", "unknown key 'quota' (did you mean 'quotas'?)"),
    ("log-level = 'info'", "unknown key 'log-level' (did you mean 'log_level'?)"),
    ("[backend]\nx = 1", "bad value for 'backend': a table"),
    ("host_capacity = 0", "bad value for 'host_capacity': 0: must be at least 1 byte"),
    ("x = ", "invalid TOML"),
    ("default_quota = '150%'", "bad value for 'default_quota': '150%': expected a share from"),
    ("default_quota = 'lots'", "or \"none\""),
])
def test_errors(text, message):
    with pytest.raises(config.ConfigError) as err:
        config.parse(text, "f.toml")
    assert message in str(err.value) and str(err.value).startswith("f.toml: ")
    assert err.value.code == 2
