"""The task registry: task kinds by name (``binary``, ``multiclass``,
``regression``; plugins add more), registered by path (:mod:`.tasks`, with torch),
so a protocol's ``task:`` is checked by name without importing any task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from securevfl.registry import Registry

if TYPE_CHECKING:
    from securevfl.parties.tasks import Task

TASKS: Registry[type[Task]] = Registry("task")
TASKS.add_path("binary", "securevfl.parties.tasks:Binary")
TASKS.add_path("multiclass", "securevfl.parties.tasks:Multiclass")
TASKS.add_path("regression", "securevfl.parties.tasks:Regression")
