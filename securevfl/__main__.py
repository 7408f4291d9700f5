"""``python -m securevfl`` = the ``securevfl`` command. ``-m`` puts the working
directory first on the import path; it is dropped before anything else is
imported, and the processes the command spawns start without it
(:mod:`securevfl.runtime.safepath`)."""

from securevfl.runtime.safepath import safe_command_line

safe_command_line()

from securevfl.cli import entry  # noqa: E402  (imported once the path is safe)

entry()
