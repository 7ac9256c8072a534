import pytest


@pytest.fixture
def anyio_backend() -> str:
    # runrow (psycopg) runs on asyncio; without this, anyio also tries trio if installed.
    return "asyncio"
