"""Datasets, vertical partition into per-party files, and PSI entity alignment."""
