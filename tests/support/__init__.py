"""Helpers shared by the tests (tests/conftest.py holds the fixtures and hooks only).

* :mod:`tests.support.protocols`: protocol documents and files for tests;
* :mod:`tests.support.runs`: running securevfl (the launcher, the command line, one party);
* :mod:`tests.support.reference`: the split model in one process, to hold runs against.
* :mod:`tests.support.hostile`: hostile IDs, and what a spreadsheet runs as a formula.

``dist_probe/`` is a ``sitecustomize`` that tests put on a rank's path (not a module)."""
