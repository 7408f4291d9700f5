"""Reusable frame buffers for one rank's sealed links (SECURITY.md §4a).

A sealed frame needs a uint8 buffer of its own on both ends: the sender seals
into one and hands it to the transport, the receiver has the transport fill one
and opens it into the caller's tensor. A fresh buffer per frame costs more than
the cipher: a buffer of more than glibc's mmap threshold (128 KiB at first) is
new anonymous memory, and every 4 KiB page of it faults, and is zeroed by the
kernel, on its first write, which is inside the seal or the receive. A
:class:`FramePool` keeps the buffers a rank's links are done with, by size, and
hands them out again, so that a training step's frames reuse the last step's
pages.

A pooled buffer only ever holds ciphertext (a sealed frame before it is sent, or
as it came off the wire before it is opened), so reusing it shows nothing that
an observer of the link has not seen. A buffer goes back with :meth:`give` only
once the transport is done with it (its send has completed, or its frame has
been opened); until then :meth:`take` never hands it out again, so a frame is
never overwritten while it is in flight. A buffer never given back (a transport
error, a frame that failed to open) is simply collected.
"""

from __future__ import annotations

import threading
import weakref

import torch

DEFAULT_MAX_FREE_BYTES = 32 << 20


class FramePool:
    """Free uint8 buffers by size, at most ``max_free_bytes`` of them kept.

    ``allocated`` counts the buffers made fresh, ``reused`` the ones handed out
    again (tests read them). Safe to share between threads (a rank moves frames
    from its main thread, but nothing here needs to rely on that)."""

    def __init__(self, max_free_bytes: int = DEFAULT_MAX_FREE_BYTES):
        self.max_free_bytes = max_free_bytes
        self.free_bytes = 0
        self.allocated = 0
        self.reused = 0
        self._free: dict[int, list[torch.Tensor]] = {}
        # the buffers handed out and not yet given back, by id (weakly: a buffer
        # never given back is collected and drops out)
        self._out: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` elements that no one else holds from this pool
        (its contents are whatever it held last: fill it completely)."""
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                buf = free.pop()
                self.free_bytes -= nbytes
                self.reused += 1
            else:
                buf = torch.empty(nbytes, dtype=torch.uint8)
                self.allocated += 1
            self._out[id(buf)] = buf
            return buf

    def give(self, buf: torch.Tensor) -> None:
        """Return a buffer from :meth:`take` once nothing reads or writes it any more
        (its send completed, its frame opened). Giving back anything else, or a
        buffer twice, is a bug and raises ValueError."""
        with self._lock:
            if self._out.get(id(buf)) is not buf:
                raise ValueError(
                    "a frame buffer was given back that is not out of this pool (given back twice?)"
                )
            del self._out[id(buf)]
            n = buf.numel()
            if self.free_bytes + n <= self.max_free_bytes:
                self._free.setdefault(n, []).append(buf)
                self.free_bytes += n

    @property
    def outstanding(self) -> int:
        """Buffers handed out and not given back (and still alive)."""
        return len(self._out)
