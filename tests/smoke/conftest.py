"""The shared smoke runs, as session fixtures here so that every module's tests read the same one (a fixture
imported into two test modules would run once for each)."""

from __future__ import annotations

import pytest

from tests.smoke.test_smoke_run import HealthyRun, JudgedRun


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory) -> HealthyRun:
    return HealthyRun(tmp_path_factory.mktemp("healthy-run"))


@pytest.fixture(scope="session")
def judged_run(healthy_run, tmp_path_factory) -> JudgedRun:
    return JudgedRun(healthy_run, tmp_path_factory.mktemp("judged-run"))
