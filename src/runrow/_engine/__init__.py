"""The worker side: the Dispatcher and the services it wires together (see docs/architecture.md)."""
