"""Built-in protocols, registered by name on import."""
