"""Inputs from an adversarial run (issue 13 B3, B7, B8): each must cost linear time and end as a
finding or one line with exit 2 - never a hang, an `error` finding or exit 3."""

from __future__ import annotations

import time

import pytest

from gpudoctor.readers import allocconf


@pytest.mark.parametrize(
    "text",
    [
        "a" * 120_000,  # took 81-220 s in suggest_correction's key=value regex
        "a" * (allocconf.MAX_CONF_CHARS - 2) + "=1",
        "max_split_size_mb:" + "9" * (allocconf.MAX_CONF_CHARS - 30) + "x",  # fullmatch backtracking
        "roundup_power2_divisions:[" + "1:2," * (allocconf.MAX_CONF_CHARS // 5) + "]",
        "max_split_size_mb:" + "0" * 6000 + "200",
    ],
    ids=["letters-120k", "key=value", "digits-then-letter", "long-list", "leading-zeros"],
)
def test_allocator_config_costs_linear_time(text):
    started = time.monotonic()
    conf = allocconf.parse_alloc_conf(text)
    allocconf.suggest_correction(text)
    assert time.monotonic() - started < 1.0
    assert all(len(m) < 3 * allocconf.MAX_CONF_CHARS for m in conf.errors + conf.warnings)


def test_a_5000_digit_split_size_is_out_of_range_not_a_crash():
    conf = allocconf.parse_alloc_conf("max_split_size_mb:" + "9" * 5000)
    assert not conf.errors and conf.warnings  # too long to check
    conf = allocconf.parse_alloc_conf("max_split_size_mb:" + "9" * 4000)
    assert any("too large" in e for e in conf.errors)
    conf = allocconf.parse_alloc_conf("max_split_size_mb:" + "0" * 4000 + "512")
    assert not conf.errors and conf.settings["max_split_size_mb"].endswith("512")


def test_an_oversized_config_is_a_warning_not_a_check():
    conf = allocconf.parse_alloc_conf("x" * 120_000)
    assert not conf.errors and "not check" in conf.warnings[0]
    assert allocconf.suggest_correction("max_split_size_mb=1;" * 10_000) is None
