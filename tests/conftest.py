"""Shared fixtures: the real engines are loaded once per test run."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def engines():
    from pipelines.agent import load_engines
    from pipelines.config import AgentConfig

    return load_engines(AgentConfig())


@pytest.fixture
def agent(engines):
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig

    return Agent(AgentConfig(), engines)
