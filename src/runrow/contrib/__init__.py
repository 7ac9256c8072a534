"""Integrations with other frameworks, each an optional extra (``runrow.contrib.django``)."""
