"""Shared pytest options and fixtures."""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--regen-cases",
        action="store_true",
        default=False,
        help="rewrite tests/cases/*/stderr.txt and exit_code from what msgen prints now",
    )


@pytest.fixture
def regen_cases(request) -> bool:
    return request.config.getoption("--regen-cases")
