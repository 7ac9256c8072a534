"""Use the database DATABASE_URL names as it is (runrow's schema already migrated there),
with Django's own tables migrated once, instead of creating a test database."""

import pytest
from django.core.management import call_command


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker):
    with django_db_blocker.unblock():
        call_command("migrate", verbosity=0)
