"""The wire: a rank's session (composed of the rendezvous, rank claims, admission
of the ranks, resume agreement, the watchdog, store notes and run summaries), the
channel, ledger, message tags and the rank layout. Nothing here knows the exchange
backends, parties, defenses, attacks or reports built on top of it
(tests/unit/test_import_graph.py holds it to that); the orchestration of a run
lives in :mod:`securevfl.app`."""
