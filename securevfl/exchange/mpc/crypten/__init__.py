"""CrypTen inside securevfl: the parts the ``mpc`` backend runs CrypTen with.

CrypTen is imported once, with securevfl's shim in place (:mod:`.api`); what of it
securevfl replaces for lack of a seam is in :mod:`.patches`; its randomness comes
from secret streams (:mod:`.rng`); its communicator is securevfl's point-to-point
frames (:mod:`.communicator`, :mod:`.frames`); its trusted-dealer tuples come from securevfl's provider and
dealer with an offline phase (:mod:`.pool`, :mod:`.dealer`); :mod:`.runtime` starts
and stops CrypTen on a session and runs the dealer's loop.

Only the ``mpc`` backend's modules import this package (a process that runs no MPC
never imports CrypTen); nothing here imports the backend's own modules, which build
on these.
"""
