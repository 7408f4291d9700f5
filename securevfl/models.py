"""Bottom, interactive and top models.

A bottom model comes from a *model factory*, a callable
``factory(in_features, out, **params)`` that returns a ``torch.nn.Module``
mapping a batch of a party's features (float32, one row per record) to ``out``
columns: the embedding width, the one contract between a bottom model and the
exchange. The built-in ``mlp`` and ``cnn`` are entries of :data:`MODELS`;
plugins register more (:mod:`securevfl.plugins`); a protocol names a registered
one by ``kind`` or any factory by import path (``factory``), which is imported
under the process's :class:`~securevfl.usercode.CodePolicy`, in its owner's rank
alone. The top model is the built-in :class:`Top` or a factory called as
``factory(in_features, outputs, **params)``.

A bottom factory that declares a keyword parameter ``layout``
(:data:`LAYOUT_PARAM`) is also given its party's
:class:`~securevfl.data.layout.FeatureLayout` (what each input column is, and
the one-hot block of each categorical column); one without it is called as
above. The layout names the party's own columns: it is built and passed in its
owner's rank alone, where the factory runs.

Initial weights: ``init: seeded`` builds a model under
:func:`securevfl.seeding.seeded` with a label naming it, so every rank (and a
centralized reference in the tests) builds bit-identical weights; ``private``,
the default for bottom models, builds it under
:func:`securevfl.private_init.private_rng`, from its owner's secret randomness.
The top model and the interactive blocks are built seeded.

A party checks its models at set-up (:func:`check_output`): the output on a
probe batch must have the declared width, dtype float32 and finite values. Any
failure of a model's code (a factory that fails to import, raises, returns no
module, or a module of the wrong width) is a
:class:`~securevfl.errors.UserCodeError` naming the party and the model: exit
code 2, no traceback.
"""

from __future__ import annotations

import contextlib
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from securevfl import optim
from securevfl.bottoms import CNNBottom as CNNBottom
from securevfl.bottoms import mlp
from securevfl.config import InteractiveSpec, ModelSpec, TopSpec, TrainingSpec
from securevfl.csprng import SecretStream
from securevfl.errors import SecureVFLError, UserCodeError
from securevfl.model_kinds import MODELS as MODELS
from securevfl.model_kinds import ModelFactory
from securevfl.model_limits import BYTES_PER_PARAMETER, gib, over_limit, physical_memory
from securevfl.private_init import private_rng
from securevfl.seeding import seeded
from securevfl.usercall import is_user_code, user_call
from securevfl.usercode import LAYOUT_PARAM, CodePolicy, accepts_layout, explain

if TYPE_CHECKING:
    from securevfl.data.layout import FeatureLayout

PROBE_ROWS = 8  # rows of the probe batch a party checks its bottom model on at set-up


def build_interactive(in_features: int, out: int, *, seed: int, party: str) -> nn.Linear:
    """One party's block W_i of the interactive layer (no bias: the bias b is the
    active party's own parameter)."""
    with seeded(seed, "interactive", party):
        return nn.Linear(in_features, out, bias=False)


def build_bias(out: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(out))


class Top(nn.Module):
    """g(z): ReLU on the interactive output, optional hidden layers, logits."""

    def __init__(self, spec: TopSpec, in_features: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.ReLU(), mlp([in_features, *spec.hidden, classes]))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def _factory(
    factory: str | None, kind: str | None, code: CodePolicy, *, what: str, path: str
) -> tuple[ModelFactory, str]:
    """The factory a model entry names, and how messages call it: a reference
    imported under ``code``, or a registered ``kind``."""
    if factory is not None:
        what = f"{what} factory '{factory}'"
        fn = code.load(factory, what=what, path=f"{path}.factory")
        if not callable(fn):
            raise UserCodeError(f"{what} is not callable (a {type(fn).__name__})", path=f"{path}.factory")
        return fn, what
    assert kind is not None
    return MODELS.get(kind, path=f"{path}.kind"), f"{what} model '{kind}'"


def _construct(
    fn: ModelFactory,
    in_features: int,
    out: int,
    params: dict[str, Any],
    rng: contextlib.AbstractContextManager[Any],
    *,
    what: str,
    path: str,
    trainable: bool = True,
    layout: FeatureLayout | None = None,
) -> nn.Module:
    """Call a model factory under ``rng`` and check it returned a module on the
    CPU, with a parameter to train when ``trainable`` (a bottom model: the only
    thing its party trains; a top model may have none, the interactive layer below
    it trains). ``layout``: the party's input layout, passed as ``layout=`` to a
    factory that declares that parameter (:func:`accepts_layout`). A factory may
    raise securevfl's own errors (a :class:`ConfigError` for a bad option): they
    pass as they are; anything else it raises is a :class:`UserCodeError`, its
    text kept for the owner."""
    kwargs = dict(params)
    if layout is not None and accepts_layout(fn):
        if LAYOUT_PARAM in params:
            raise UserCodeError(
                f"{what} takes '{LAYOUT_PARAM}' (the party's input layout, which securevfl passes), so "
                f"params must not set '{LAYOUT_PARAM}'",
                path=f"{path}.params.{LAYOUT_PARAM}",
            )
        kwargs[LAYOUT_PARAM] = layout
    # a factory of the user's runs under the rank's marker (securevfl.usercall)
    where = user_call(what) if is_user_code(fn) else contextlib.nullcontext()
    try:
        with rng, where:
            module = fn(in_features, out, **kwargs)
    except SecureVFLError:
        raise
    except Exception as exc:
        raise UserCodeError(
            f"{what} raised {type(exc).__name__} when called with in_features={in_features}, out={out} "
            f"and params {sorted(params)}",
            path=path,
            detail=explain(exc),
        ) from None
    if not isinstance(module, nn.Module):
        raise UserCodeError(f"{what} returned a {type(module).__name__}, not a torch.nn.Module", path=path)
    for name, t in chain(module.named_parameters(), module.named_buffers()):
        if t.device.type != "cpu":
            raise UserCodeError(
                f"{what} built '{name}' on {t.device}: build the module on the CPU (the rank moves it to "
                "training.device)",
                path=path,
            )
    check_built_size(module, what=what, path=path)
    if trainable and not any(p.requires_grad for p in module.parameters()):
        raise UserCodeError(
            f"{what} returned a module with no trainable parameter (it has none, or every one has "
            "requires_grad=False): a party trains its model, so at least one parameter must require grad",
            path=path,
        )
    return module


def check_built_size(module: nn.Module, *, what: str, path: str, memory: int | None = None) -> int:
    """The trainable parameters of a model as its rank built it, refused beyond the
    per-party limits that :mod:`securevfl.sizing` applies at load to the models it
    can count from their shapes (:mod:`securevfl.model_limits`; ``memory``: default
    this machine's). A factory's model is counted here alone, in its owner's rank,
    the only process that runs its code."""
    n = sum(p.numel() for p in module.parameters() if p.requires_grad)
    limit = over_limit(n, physical_memory() if memory is None else memory)
    if limit is not None:
        raise UserCodeError(
            f"{what} built a module of {n:,} trainable parameters (about {gib(n * BYTES_PER_PARAMETER)} "
            f"with gradients and optimizer state); {limit}: make it smaller",
            path=path,
        )
    return n


def bottom_label(spec: ModelSpec, party: str) -> str:
    """How messages name a party's bottom model: by its factory or its kind."""
    if spec.factory is not None:
        return f"bottom model of party '{party}': factory '{spec.factory}'"
    return f"bottom model of party '{party}': model '{spec.kind}'"


def build_bottom(
    spec: ModelSpec,
    in_features: int,
    *,
    seed: int,
    party: str,
    code: CodePolicy | None = None,
    stream: SecretStream | None = None,
    path: str = "model",
    layout: FeatureLayout | None = None,
) -> nn.Module:
    """A party's bottom model f_i on ``in_features`` columns, on the CPU.
    ``code``: the user code this process may import (a factory is refused
    without it); ``stream``: the secret randomness of ``init: private``
    (default: a fresh key); ``path``: the YAML path of the model entry;
    ``layout``: the party's input layout, for a factory that declares it (built
    in this rank from its own preprocessing, never sent)."""
    params = spec.builtin_params()
    params = dict(spec.params) if params is None else params
    fn, what = _factory(
        spec.factory, spec.kind, code or CodePolicy(), what=f"bottom model of party '{party}':", path=path
    )
    rng = (
        seeded(seed, "bottom", party)
        if spec.init == "seeded"
        else private_rng(stream if stream is not None else SecretStream.fresh())
    )
    if layout is not None and layout.width != in_features:
        raise ValueError(f"a layout of {layout.width} columns for a model of {in_features} inputs")
    return _construct(fn, in_features, spec.out, params, rng, what=what, path=path, layout=layout)


def build_top(
    spec: TopSpec,
    in_features: int,
    classes: int,
    *,
    seed: int,
    code: CodePolicy | None = None,
    party: str = "active",
) -> nn.Module:
    """The top model g from ``in_features`` (the interactive layer's width) to
    ``classes`` outputs, built under the shared seed: the built-in :class:`Top`,
    or ``spec.factory`` imported under ``code`` and called as
    ``factory(in_features, classes, **params)``."""
    if spec.factory is None:
        with seeded(seed, "top"):
            return Top(spec, in_features, classes)
    fn, what = _factory(
        spec.factory, None, code or CodePolicy(), what=f"top model of party '{party}':", path="top"
    )
    rng, params = seeded(seed, "top"), dict(spec.params)
    return _construct(fn, in_features, classes, params, rng, what=what, path="top", trainable=False)


def check_output(module: nn.Module, x: torch.Tensor, width: int, *, what: str, path: str) -> None:
    """Refuse a model whose output on the probe batch ``x`` (on the model's
    device) is not a float32 tensor of ``len(x)`` rows and ``width`` columns with
    finite values. It runs in evaluation mode without gradients (a batch-norm
    layer's running statistics are not touched), and the module's mode is put
    back. The message names shapes and dtypes, never a value: a failing rank
    relays it to its peers."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            y = module(x)
    except SecureVFLError:
        raise
    except Exception as exc:
        raise UserCodeError(
            f"{what}: its module raised {type(exc).__name__} on a probe batch of shape {tuple(x.shape)}",
            path=path,
            detail=explain(exc),
        ) from None
    finally:
        module.train(was)
    if not isinstance(y, torch.Tensor):
        raise UserCodeError(f"{what}: its module returned a {type(y).__name__}, not a tensor", path=path)
    want = (x.shape[0], width)
    if tuple(y.shape) != want:
        raise UserCodeError(
            f"{what}: its module maps a probe batch of shape {tuple(x.shape)} to shape {tuple(y.shape)}; "
            f"the exchange needs {want} (the declared width is {width})",
            path=path,
        )
    if y.dtype != torch.float32:
        raise UserCodeError(
            f"{what}: its module outputs {y.dtype}; the exchange needs torch.float32", path=path
        )
    if not bool(torch.isfinite(y).all()):
        raise UserCodeError(f"{what}: its module outputs non-finite values on a probe batch", path=path)


def interactive_optimizer(params, spec: InteractiveSpec) -> optim.Optimizer:
    """SGD with momentum for the passive blocks W_i (see InteractiveSpec)."""
    return optim.SGD(list(params), lr=spec.lr, momentum=spec.momentum)


def make_optimizer(params, training: TrainingSpec) -> optim.Optimizer:
    params = list(params)
    if training.optimizer == "adam":
        return optim.Adam(params, lr=training.lr)
    return optim.SGD(params, lr=training.lr, momentum=training.momentum)
