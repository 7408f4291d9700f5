"""CrypTen inside securevfl: the parts the ``mpc`` backend runs CrypTen with.

- :mod:`.api`           CrypTen, imported once with securevfl's shim in place;
- :mod:`.patches`       what of CrypTen securevfl replaces where it has no seam;
- :mod:`.rng`           CrypTen's randomness from secret streams;
- :mod:`.communicator`  CrypTen's communicator as point-to-point frames, over
  :mod:`.frames` (gloo or sealed frames), :mod:`.objects` (control objects as JSON),
  :mod:`.collective` (groups, flat frames, reductions) and :mod:`.cuda` (CUDA shares);
- :mod:`.provider`      the parties' trusted-dealer tuple provider with its offline pool,
  over :mod:`.items` (what a plan holds) and :mod:`.bundle` (a plan's request, validated);
- :mod:`.dealer`        the dealer's side: every party's draws, rank 0's shares;
- :mod:`.runtime`       CrypTen started and stopped on a session, and the dealer's loop.

Only the ``mpc`` backend's modules import this package (a process that runs no MPC
never imports CrypTen). Nothing here imports the backend's own modules, which build on
these, except the exact truncation (:mod:`securevfl.exchange.mpc.truncation`) whose
material the dealer computes.
"""
