"""The deserializing factory: the front end, the workers and their parsers, dead letters, its CLI."""
