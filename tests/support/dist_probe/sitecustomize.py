"""Test probe, for tests only: counts what a rank asks of torch.distributed.

A test puts this directory on ``PYTHONPATH`` and names a folder in
``SECUREVFL_DIST_PROBE``; every Python process started then (the launcher's
spawned ranks) wraps torch.distributed's functions before any securevfl or
CrypTen code runs. A collective (all_reduce, broadcast, barrier, new_group, ...)
is written to ``<folder>/<pid>.collectives`` the moment it is called, with the
caller's innermost frames; point-to-point calls are counted per gloo tag and
written to ``<folder>/<pid>.p2p`` (JSON) at exit. Without the variable this
module does nothing.
"""

import os

_DIR = os.environ.get("SECUREVFL_DIST_PROBE")

if _DIR:
    import atexit
    import collections
    import functools
    import json
    import traceback

    import torch.distributed as _dist

    _COLLECTIVES = (
        "all_reduce",
        "reduce",
        "broadcast",
        "gather",
        "all_gather",
        "all_gather_into_tensor",
        "scatter",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "new_group",
        "broadcast_object_list",
        "all_gather_object",
        "gather_object",
        "scatter_object_list",
        "send_object_list",
        "recv_object_list",
        "batch_isend_irecv",
    )
    _P2P = ("send", "recv", "isend", "irecv")
    _counts: collections.Counter = collections.Counter()
    _pid = os.getpid()

    def _collective(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kw):
            where = "".join(traceback.format_stack(limit=6)[:-1])
            with open(os.path.join(_DIR, f"{_pid}.collectives"), "a") as f:
                f.write(f"{name}\n{where}\n")
            return fn(*args, **kw)

        return wrapper

    def _p2p(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kw):
            _counts[f"{name}:{kw.get('tag', 0)}"] += 1
            return fn(*args, **kw)

        return wrapper

    for _name in _COLLECTIVES:
        if hasattr(_dist, _name):
            setattr(_dist, _name, _collective(_name, getattr(_dist, _name)))
    for _name in _P2P:
        setattr(_dist, _name, _p2p(_name, getattr(_dist, _name)))

    @atexit.register
    def _dump():
        with open(os.path.join(_DIR, f"{_pid}.p2p"), "w") as f:
            json.dump(dict(_counts), f)
