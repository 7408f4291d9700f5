"""A user's module that fails while it is imported (for the tests of that failure)."""

raise ImportError("cannot load the weights file at /secret/path")
