"""Built-in protocols (installed as ``fednet.protocols``; declared as entry points in pyproject.toml)."""
