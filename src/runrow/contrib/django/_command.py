"""A ``runrow`` CLI command run as a Django management command, on Django's settings.

The options are the CLI's own (the same argparse actions, so help and defaults match),
except the database, which comes from ``settings.DATABASES`` (``--database ALIAS``),
and Django's ``--verbosity``, which stands in for ``--verbose``. The work is the CLI's
code path (:func:`runrow.cli.run_command`), not a copy of it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

from django.core.management.base import BaseCommand

from ...cli import build_parser, run_command
from . import conninfo, schema

_DJANGO_OWNS = frozenset({"help", "database_url", "verbose"})
_RENAMED = {"--version": "--worker-version"}  # options whose names Django's commands take


def _cli_subparser(command: str) -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    raise LookupError(command)  # pragma: no cover - the CLI always has its commands


class RunrowCommand(BaseCommand):
    """Runs ``runrow <cli_command>`` with the options of ``runrow <cli_command> --help``."""

    cli_command = ""

    def add_arguments(self, parser: Any) -> None:
        """The CLI command's options, and ``--database`` (an alias of ``DATABASES``)."""
        self._copied = []
        for action in _cli_subparser(self.cli_command)._actions:
            if action.dest not in _DJANGO_OWNS:
                if "--version" in action.option_strings:
                    # Django's own --version prints Django's: runrow's is --worker-version here.
                    action = copy.copy(action)
                    action.option_strings = [_RENAMED.get(o, o) for o in action.option_strings]
                parser._add_action(action)
                self._copied.append(action.dest)
        parser.add_argument(
            "--database", default="default", help="the DATABASES alias to use (default: %(default)s)"
        )
        parser.set_defaults(schema=schema())

    def handle(self, *args: Any, **options: Any) -> None:
        """Builds the CLI's arguments from the options and Django's database, and runs it."""
        ns = argparse.Namespace(
            command=self.cli_command,
            database_url=conninfo(options["database"]),
            verbose=options["verbosity"] > 1,
            **{dest: options[dest] for dest in self._copied},
        )
        sys.stdout.flush()
        code = run_command(ns)
        if code:
            sys.exit(code)
