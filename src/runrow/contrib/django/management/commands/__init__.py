"""The commands themselves (Django finds them here)."""
