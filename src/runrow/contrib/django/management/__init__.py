"""runrow's management commands: ``runrow_migrate`` and ``runrow_worker``."""
