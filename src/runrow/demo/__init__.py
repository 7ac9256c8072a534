"""The example that ``runrow demo`` runs: a chat API, its fake-model agent and a web page.

Needs the ``demo`` extra (``pip install "runrow[demo]"``). ``create_app`` is the ASGI
app, ``DemoAgent`` the agent; ``runrow.demo.server.serve`` runs everything together.
"""

from __future__ import annotations

from .agent import DemoAgent, answer_for, approval_answer_for, steered_note_for
from .app import create_app, demo_user

__all__ = ["DemoAgent", "answer_for", "approval_answer_for", "create_app", "demo_user", "steered_note_for"]
