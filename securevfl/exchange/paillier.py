"""paillier backend: being written."""
