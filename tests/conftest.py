"""Shared pytest configuration. Fixture modules that start real servers live in tests/fixtures/."""

pytest_plugins: list[str] = ["tests.fixtures.redis", "tests.fixtures.mooncake", "tests.fixtures.ray"]
