"""ckks backend: being written."""
