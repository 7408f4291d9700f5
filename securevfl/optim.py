"""securevfl's optimizers: SGD with momentum and Adam, torch.optim's update rules
and state-dict layout in a shell without torch.optim's start-up cost.

Why not ``torch.optim.SGD`` / ``Adam`` themselves: every ``torch.optim.Optimizer``
runs its constructor, ``zero_grad`` and ``state_dict`` through
``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` (with torch
2.13: 1.1-1.2 CPU s per process on the 2-core test box, about as much as importing
torch itself; ``import torch.optim`` alone is free, ``import torch`` already holds
it, and the cost lands on the first ``Adam(...)``). A local run starts one process
per party, and every training rank, every ``securevfl party`` rank, every attack
and DRAVL's inner loop would pay it once per process, for a compiler securevfl
never uses; a fork server that imported ``torch._dynamo`` would spare only the
ranks it forks.

So this module keeps only the shell (parameter groups, per-parameter state,
``zero_grad``, ``state_dict``, ``load_state_dict``) and hands each step to torch's
functional update rules, ``torch.optim.sgd.sgd`` and ``torch.optim.adam.adam``,
with the arguments ``torch.optim.SGD.step`` and ``Adam.step`` pass them: the same
code computes the update, so a step gives the same numbers bit for bit (unit tests
hold them against ``torch.optim``). The functional rules reach ``torch._dynamo``
only while compiling. The state dict has torch's layout (``state`` by parameter
index, ``param_groups`` with the hyper-parameters and the indices), so a
checkpoint written with ``torch.optim`` loads here and the other way round.

Only what securevfl uses is offered: SGD with momentum, dampening, Nesterov and
L2 weight decay; Adam with L2 weight decay and AMSGrad.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

ParamsLike = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


def _scalar_dtype() -> torch.dtype:
    """The dtype of Adam's step counter, as torch.optim chooses it (on the CPU)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class Optimizer:
    """Parameter groups, per-parameter state, ``zero_grad``, ``step``,
    ``state_dict`` and ``load_state_dict``; subclasses give the defaults and the
    update of one parameter group (:meth:`_step_group`)."""

    def __init__(self, params: ParamsLike, defaults: dict[str, Any]):
        items = list(params)
        if not items:
            raise ValueError("the optimizer got an empty parameter list")
        groups = items if isinstance(items[0], dict) else [{"params": items}]
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[torch.Tensor, dict[str, Any]] = {}
        seen: set[int] = set()
        for g in groups:
            if not isinstance(g, dict):
                raise TypeError("parameter groups must all be dicts, or none of them")
            group = {**self.defaults, **g, "params": list(g["params"])}
            for p in group["params"]:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"the optimizer can only optimize tensors, got {type(p).__name__}")
                if id(p) in seen:
                    raise ValueError("a parameter appears in more than one parameter group")
                seen.add(id(p))
            self.param_groups.append(group)

    # -- the rule ----------------------------------------------------------------------
    def _step_group(self, params: list[torch.Tensor], group: Mapping[str, Any]) -> None:
        """Update ``params`` (those of ``group`` that have a gradient) in place."""
        raise NotImplementedError

    # -- torch.optim's interface -------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.requires_grad_(False)
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad is not None and p.grad.is_sparse for p in params):
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if params:
                self._step_group(params, group)

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: ``state`` by parameter index (over the groups in
        order), ``param_groups`` with the hyper-parameters and those indices. The
        tensors are the optimizer's own (not copies), as in torch."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        params = {id(p): p for g in self.param_groups for p in g["params"]}
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in params}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore hyper-parameters and state from :meth:`state_dict` (or from a
        torch.optim optimizer of the same kind over the same parameters). The
        state is copied and cast to each parameter's dtype and device (``step``
        stays as saved); a mismatch in groups, sizes or shapes raises ValueError
        naming it, and leaves the optimizer as it was."""
        if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError("an optimizer state dict needs 'state' and 'param_groups'")
        saved_groups = list(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the saved optimizer has {len(saved_groups)} parameter groups, "
                f"this one {len(self.param_groups)}"
            )
        by_index: dict[int, torch.Tensor] = {}
        for n, (saved, group) in enumerate(zip(saved_groups, self.param_groups, strict=True)):
            ids = list(saved.get("params", []))
            if len(ids) != len(group["params"]):
                raise ValueError(
                    f"parameter group {n}: the saved optimizer has {len(ids)} parameters, this one "
                    f"{len(group['params'])}"
                )
            by_index.update(zip(ids, group["params"], strict=True))
        new_state: dict[torch.Tensor, dict[str, Any]] = {}
        for key, saved_state in state_dict["state"].items():
            p = by_index.get(int(key))
            if p is None:
                raise ValueError(f"the saved optimizer has state for parameter {key}, which no group lists")
            entry: dict[str, Any] = {}
            for name, value in saved_state.items():
                if isinstance(value, torch.Tensor):
                    if name != "step" and value.shape != p.shape:
                        raise ValueError(
                            f"optimizer state '{name}' of parameter {key} has shape {tuple(value.shape)}, "
                            f"the parameter {tuple(p.shape)}"
                        )
                    if name == "step":
                        value = value.detach().clone()
                    else:
                        dtype = p.dtype if p.is_floating_point() else value.dtype
                        value = value.detach().to(device=p.device, dtype=dtype, copy=True)
                entry[name] = value
            new_state[p] = entry
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = new_state


class SGD(Optimizer):
    """Stochastic gradient descent (torch.optim.SGD's rule): L2 weight decay added to
    the gradient, then momentum ``buf = momentum * buf + (1 - dampening) * grad``
    (the first buffer is the gradient itself), optionally Nesterov."""

    def __init__(
        self,
        params: ParamsLike,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(
                f"SGD needs lr, momentum and weight_decay >= 0 (got {lr}, {momentum}, {weight_decay})"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs a momentum and zero dampening")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": False,
            "foreach": None,
            "differentiable": False,
            "fused": None,
        }
        super().__init__(params, defaults)

    def _step_group(self, params: list[torch.Tensor], group: Mapping[str, Any]) -> None:
        momentum = group["momentum"]
        # state only with momentum: the buffers (None before the first step), as torch.optim.SGD
        bufs = [self.state.get(p, {}).get("momentum_buffer") for p in params] if momentum != 0 else []
        sgd(
            params,
            [p.grad for p in params if p.grad is not None],
            bufs,
            has_sparse_grad=False,
            foreach=group["foreach"],
            fused=group["fused"],
            weight_decay=group["weight_decay"],
            momentum=momentum,
            lr=group["lr"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            maximize=group["maximize"],
        )
        if momentum != 0:
            for p, buf in zip(params, bufs, strict=True):
                self.state.setdefault(p, {})["momentum_buffer"] = buf


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015, torch.optim.Adam's rule): L2 weight decay added to the
    gradient, first and second moments with bias correction, optionally AMSGrad's
    running maximum of the second moment."""

    def __init__(
        self,
        params: ParamsLike,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
            raise ValueError(f"Adam needs lr, eps and weight_decay >= 0 (got {lr}, {eps}, {weight_decay})")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Adam needs betas in [0, 1) (got {betas})")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
            "decoupled_weight_decay": False,
        }
        super().__init__(params, defaults)

    def _state(self, p: torch.Tensor, group: Mapping[str, Any]) -> dict[str, Any]:
        """``p``'s state, made as torch.optim.Adam makes it on the first step."""
        state = self.state.get(p)
        if not state:  # none yet, or an empty entry loaded from a state dict
            state = self.state[p] = {
                "step": torch.tensor(0.0, dtype=_scalar_dtype()),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _step_group(self, params: list[torch.Tensor], group: Mapping[str, Any]) -> None:
        states = [self._state(p, group) for p in params]
        beta1, beta2 = group["betas"]
        adam(
            params,
            [p.grad for p in params if p.grad is not None],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else [],
            [s["step"] for s in states],
            foreach=group["foreach"],
            capturable=group["capturable"],
            differentiable=group["differentiable"],
            fused=group["fused"],
            has_complex=any(torch.is_complex(p) for p in params),
            decoupled_weight_decay=group["decoupled_weight_decay"],
            amsgrad=group["amsgrad"],
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )
