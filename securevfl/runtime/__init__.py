"""Processes and wire: launcher, session (rendezvous, watchdog), channel, ledger."""
