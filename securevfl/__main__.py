"""``python -m securevfl`` = the ``securevfl`` command."""

import sys

from securevfl.cli import main

sys.exit(main())
