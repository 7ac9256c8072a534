"""The chaos and soak runner: runrow's guarantees under load while things break (issue 8)."""
