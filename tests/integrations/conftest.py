import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "distributed: spawns a 2-process gloo group on CPU (diffusers context parallelism)"
    )
