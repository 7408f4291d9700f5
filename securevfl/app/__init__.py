"""The top layer: everything that owns a run.

* :mod:`~securevfl.app.loader`: a protocol file, checked against the schema and
  the registries, its components' options validated once and attached
  (:mod:`securevfl.components`);
* :mod:`~securevfl.app.rank_layout`: its rank layout, with the exchange backend's helpers;
* :mod:`~securevfl.app.launcher`: every rank as a local OS process, then the attacks;
* :mod:`~securevfl.app.rank`: one rank's life, the same pipeline for every phase and under
  ``securevfl party``: set-up (session, ledger, channel, exchange), then a phase:
  :mod:`~securevfl.app.training` (train, resume) or :mod:`~securevfl.app.predict` (predict);
* :mod:`~securevfl.app.party`: one rank in this process, with its folder and data (``securevfl party``);
* :mod:`~securevfl.app.harness`: the protocol's attacks on the ranks' saved views;
* :mod:`~securevfl.app.outdir`: output folders that never lose an earlier result.

Only :mod:`securevfl.api` and :mod:`securevfl.cli` (and tests, benchmarks) import from here;
scripts use :mod:`securevfl.api`.
"""
