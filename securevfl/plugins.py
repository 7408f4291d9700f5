"""Plugins: a user's own defenses, attacks, datasets and models, registered by name.

A plugin is a Python module that a protocol file lists under ``plugins:``; every
rank imports it, and so do ``securevfl validate`` and the local launcher, before
the protocol is checked, so the names it registers can be used in the file like
built-in ones::

    # my_plugin.py, beside the protocol file
    from securevfl.plugins import register_defense, Defense, DefenseOptions

    class TopKOptions(DefenseOptions):
        k: int = 8

    @register_defense
    class TopK(Defense[TopKOptions]):
        name = "topk_gradients"
        sides = frozenset({"passive"})
        options = TopKOptions

        def grad(self, g):
            ...

    # protocol.yaml
    plugins: [my_plugin]
    parties:
      passive:
        - name: p1
          defenses: [{name: topk_gradients, params: {k: 4}}]

A plugin runs only where its owner allows it (SECURITY.md §4b,
:mod:`securevfl.usercode`): ``securevfl party`` and ``securevfl validate``
import an installed plugin with ``--allow-plugin my_plugin``, looked up on the
Python path alone (never beside the protocol file), and a module beside the
protocol file only when the party names that file: by its path
(``--allow-plugin ./my_plugin.py``, or a package's folder) or by the SHA-256
of its source (``--allow-plugin my_plugin=sha256:<hex>``). The local launcher
(``securevfl run``, ``compare``, ``predict``, :mod:`securevfl.api`) allows the
modules its own file names, those beside it by their path.
Registering a name twice is refused unless ``force=True``; a plugin that raises
while it is imported stops the command with exit code 2, naming it.

What a plugin implements, and its contract:

* **A defense**: a subclass of :class:`Defense` (``securevfl/defenses/base.py``
  documents every hook) with a unique ``name``, the ``sides`` it runs on, the
  backend ``requires`` it needs (e.g. ``active_sees_embeddings``: refused at
  load under a backend that hides h'_i) and an ``options`` model (pydantic,
  validated once at load from ``params``). A passive-side defense sees its
  party's own h (``embed``, ``embed_local``), its features and h
  (``local_loss``) and the gradient the exchange revealed to it (``grad``); an
  active-side one the labels (``labels``), z, the logits and, only under a
  backend that shows them to A, the embeddings (``top_loss``,
  ``observe_eval``). What it returns from ``embed`` is what its party
  releases: the exchange carries it, and under ``plain`` the active party sees
  it. Noise that protects something draws on ``self.ctx.noise_stream(...)``
  (a :class:`~securevfl.csprng.SecretStream` private to the party), never on
  torch's or numpy's generators; a DP defense declares what it releases in
  ``mechanisms`` (:class:`Mechanism` of :class:`Release` parts, with an
  :class:`EmbeddingBoundary` or :class:`LabelBoundary`) so the accountant composes
  it and the audit tests it as it runs (docs/extending.md, "Declaring a DP mechanism").
* **An attack**: a subclass of :class:`Attack` with a ``name``, its
  ``adversary`` (``active`` or ``passive``) and an ``options`` model. After
  training the harness gives ``run`` the adversary's :class:`View`: what that
  party's rank received (``view.received``, by message tag), its own data and
  models (``view.own``) and the prior knowledge the attack declares in
  ``knowledge`` (``view.prior``), nothing else. ``score`` grades the guess
  against the :class:`World` (every party's view), which ``run`` never sees.
* **A dataset**: ``builder(spec: DatasetSpec, seed: int) -> Table`` (IDs,
  named feature columns, labels), registered with :func:`register_dataset`. It
  is built only where a built-in dataset is materialized into per-party files
  (the launcher, or a party's short-lived child); parties select their columns
  by name.
* **A task**: a subclass of :class:`Task` (``securevfl/parties/tasks.py``
  documents its contract) registered with :func:`register_task` and named as
  ``task: NAME``: the loss, the test metrics and the prediction columns of the
  active party's labels, which it sees in the active party's rank alone.
* **A model**: a factory ``factory(in_features, out, **params) ->
  torch.nn.Module`` mapping a float32 batch of ``in_features`` columns to
  ``out`` columns (:mod:`securevfl.models`), registered with
  :func:`register_model` and named as ``model: {kind: NAME, params: {...},
  out: N}``. A factory need not be registered at all: ``model: {factory:
  "package.module:callable"}`` names it by import path, imported in its owner's
  rank alone; the callable is a function or class defined in that module itself
  (``mylab:os.system`` is refused). It builds its module on the CPU, under the rank's initialisation
  randomness (its own secret randomness by default); the module's output is
  checked on a probe batch at set-up (shape, float32, finite). A factory may
  raise :class:`~securevfl.errors.ConfigError` for a bad option: its message
  reaches the user as it is (and the other parties: name no data in it).
  A bottom factory that declares a keyword parameter ``layout`` also gets its
  party's :class:`FeatureLayout`: each input column's source column and kind
  (:class:`InputColumn`), and per categorical column its one-hot
  :class:`CategoricalBlock` (cardinality, slice). It is built from the party's
  fitted preprocessing in its owner's rank alone, the same at training and at
  prediction, and is never sent: keep its names out of a ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from securevfl.attacks.base import ATTACKS, Attack, AttackOptions, View, World
from securevfl.attacks.views import RowTable, per_row
from securevfl.config import DatasetSpec
from securevfl.data.catalog import DATASETS
from securevfl.data.datasets import DatasetBuilder, Table
from securevfl.data.layout import CategoricalBlock, FeatureLayout, InputColumn
from securevfl.defenses.base import DEFENSES, Defense, DefenseContext, DefenseOptions
from securevfl.models import MODELS, ModelFactory
from securevfl.parties.task_kinds import TASKS
from securevfl.parties.tasks import Task
from securevfl.privacy.accountant import (
    EpsDeltaRelease,
    GaussianRelease,
    LaplaceRelease,
    Mechanism,
    NonPrivateRelease,
    Plan,
    RandomizedResponseRelease,
    Release,
)
from securevfl.privacy.boundary import EmbeddingBoundary, LabelBoundary
from securevfl.privacy.correlated import UnboundedRelease

__all__ = [
    "Attack",
    "AttackOptions",
    "CategoricalBlock",
    "DatasetSpec",
    "Defense",
    "DefenseContext",
    "DefenseOptions",
    "EmbeddingBoundary",
    "EpsDeltaRelease",
    "FeatureLayout",
    "GaussianRelease",
    "InputColumn",
    "LabelBoundary",
    "LaplaceRelease",
    "Mechanism",
    "NonPrivateRelease",
    "Plan",
    "RandomizedResponseRelease",
    "Release",
    "RowTable",
    "Table",
    "Task",
    "UnboundedRelease",
    "View",
    "World",
    "per_row",
    "register_attack",
    "register_dataset",
    "register_defense",
    "register_model",
    "register_task",
]

D = TypeVar("D", bound=type[Defense[Any]])
A = TypeVar("A", bound=type[Attack[Any]])
K = TypeVar("K", bound=type[Task])


def _named(cls: type, base: type, kind: str) -> str:
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise TypeError(f"a {kind} is a subclass of securevfl.plugins.{base.__name__}, not {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{kind} class {cls.__qualname__} needs its own 'name' (a class attribute)")
    return name


def register_defense(cls: D | None = None, *, force: bool = False) -> Any:
    """Register a :class:`Defense` subclass under its ``name``: as a decorator,
    ``@register_defense`` or ``@register_defense(force=True)`` (replace a
    registered defense of that name), or called, ``register_defense(MyDefense)``."""

    def add(c: D) -> D:
        DEFENSES.add(_named(c, Defense, "defense"), c, force=force)
        return c

    return add if cls is None else add(cls)


def register_attack(cls: A | None = None, *, force: bool = False) -> Any:
    """Register an :class:`Attack` subclass under its ``name`` (as
    :func:`register_defense`)."""

    def add(c: A) -> A:
        ATTACKS.add(_named(c, Attack, "attack"), c, force=force)
        return c

    return add if cls is None else add(cls)


def register_dataset(name: str, *, force: bool = False) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Decorator: register ``builder(spec, seed) -> Table`` as dataset ``name``
    (``dataset: {name: NAME}`` in a protocol file)."""
    if name == "csv":
        raise ValueError("dataset 'csv' is the parties' own files; pick another name")
    return DATASETS.register(name, force=force)


def register_model(name: str, *, force: bool = False) -> Callable[[ModelFactory], ModelFactory]:
    """Decorator: register ``factory(in_features, out, **params) -> nn.Module`` as
    model ``name`` (``model: {kind: NAME, params: {...}, out: N}``)."""
    return MODELS.register(name, force=force)


def register_task(cls: K | None = None, *, force: bool = False) -> Any:
    """Register a :class:`Task` subclass under its ``name`` (as
    :func:`register_defense`); a protocol names it as ``task: NAME``."""

    def add(c: K) -> K:
        name = _named(c, Task, "task")
        if not isinstance(c.__dict__.get("has_classes", getattr(c, "has_classes", None)), bool):
            raise TypeError(f"task class {c.__qualname__} needs 'has_classes' (True or False)")
        TASKS.add(name, c, force=force)
        return c

    return add if cls is None else add(cls)
