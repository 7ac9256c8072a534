"""The SQL gateway: the only code that loads statements from ``sql/`` and binds them.

Each module is the part of the gateway one service or API uses. Its functions take a
connection (and the schema), bind named parameters, and return typed records, never
positional rows. Statements run through :func:`._exec.execute`, which keeps JIT off.
"""
