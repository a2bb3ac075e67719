"""RecurrentNet: a step net run over one scope per time step (seed 003, "Compatibility with RNN").

    net = nf.Net.create(desc)          # desc.model_type == NetDesc.RECURRENT
    net.run(scope)

The NetDesc's `step_ops` (declared by its `vars`) form a PlainNet, the step net. A run over a
scope holding the inlinks (`[batch, time, ...]` tensors) makes one kid scope of it per time step
and, as the seed's example does:
- copies each inlink's time slice `X[:, t]` into step scope t under the inlink's name;
- gives step scope 0 each `pre_states[i]` from the outer `boot_states[i]`, and step scope t+1 the
  value `states[i]` had in step scope t (the seed's `Copy(rnn_states[i], rnn_states[i+1],
  pre_state_vars)`);
- runs the step net in step scope t; every variable it writes stays in that step scope;
- copies the outlinks out: each `outlinks[i]` of all steps, stacked to `[batch, time, ...]`, is
  stored in the outer scope under the same name.
The step count is the time dim of `step_count_from` (default: the first inlink). The step
scopes are kept (`net.step_scopes`) until the next run in that scope or `drop_step_scopes()`.
RecurrentNet runs forward only: a trainable RNN is built with nf.rnn (the recurrent op).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nestflow.core.place import is_array
from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import ControlFlowError, NestflowError, UninitializedError
from nestflow.executor.net import Net, PlainNet
from nestflow.framework import framework_pb2 as pb


def _value(scope: Scope, name: str, local: bool = False) -> Any:
    var = scope.find_local_var(name) if local else scope.find_var(name)
    if var is None or var._value is None:
        return None
    held = var._value
    return held._array if isinstance(held, Tensor) else held


def _put(scope: Scope, name: str, value: Any) -> None:
    var = scope.var(name)
    if is_array(value):
        tensor = var._value if isinstance(var._value, Tensor) else var.get_mutable(Tensor)
        tensor._array = value
    else:
        var.set_value(value)


class RecurrentNet(Net):
    """Seed 003's RecurrentNet: a step net over step scopes, state copied step to step.

    Made from a NetDesc of model_type RECURRENT, or directly with the link lists
    (`RecurrentNet(inlinks=["x"], outlinks=["h"], states=["h"], pre_states=["h_pre"],
    boot_states=["h0"])`) and then `add_op(...)` for each step op.

    >>> net = nf.RecurrentNet(inlinks=["x"], outlinks=["h"], states=["h"],
    ...                       pre_states=["h_pre"], boot_states=["h0"])
    >>> net.add_var("x", [-1, 1]).name, net.add_var("h_pre", [-1, 1]).name
    ('x', 'h_pre')
    >>> net.add_op("elementwise_add", inputs={"X": ["h_pre"], "Y": ["x"]}, outputs={"Out": ["h"]})
    0
    >>> scope = nf.Scope()
    >>> scope.var("x").get_mutable(nf.Tensor).set(np.array([[[1.0], [2.0], [3.0]]], "float32"))
    >>> scope.var("h0").get_mutable(nf.Tensor).set(np.zeros((1, 1), "float32"))
    >>> net.run(scope)  # h_t = h_{t-1} + x_t, one step scope per step
    >>> len(net.step_scopes), scope.find_var("h").get(nf.Tensor).numpy().ravel().tolist()
    (3, [1.0, 3.0, 6.0])
    """

    def __init__(
        self,
        desc: pb.NetDesc | None = None,
        *,
        inlinks: Sequence[str] = (),
        outlinks: Sequence[str] = (),
        states: Sequence[str] = (),
        pre_states: Sequence[str] = (),
        boot_states: Sequence[str] = (),
        step_count_from: str = "",
    ):
        if desc is not None:
            if desc.model_type != pb.NetDesc.RECURRENT:
                raise NestflowError("RecurrentNet needs a NetDesc of model_type RECURRENT")
            if desc.ops and desc.step_ops:
                raise NestflowError(
                    "a RECURRENT NetDesc holds its step net in step_ops; its ops must be empty"
                )
            step_ops = desc.step_ops or desc.ops
            self.step_net = PlainNet(
                pb.NetDesc(model_type=pb.NetDesc.PLAIN, ops=step_ops, vars=desc.vars)
            )
            inlinks, outlinks = desc.inlinks, desc.outlinks
            states, pre_states, boot_states = desc.states, desc.pre_states, desc.boot_states
            step_count_from = desc.step_count_from
        else:
            self.step_net = PlainNet()
        self.inlinks = list(inlinks)
        self.outlinks = list(outlinks)
        self.states = list(states)
        self.pre_states = list(pre_states)
        self.boot_states = list(boot_states)
        self.step_count_from = step_count_from
        if not len(self.states) == len(self.pre_states) == len(self.boot_states):
            raise NestflowError(
                f"RecurrentNet: states {self.states}, pre_states {self.pre_states} and "
                f"boot_states {self.boot_states} must pair up one to one"
            )
        self.step_scopes: list[Scope] = []
        self._owner: Scope | None = None

    # ---- building: the step net ----
    def add_op(self, op, inputs=None, outputs=None, attrs=None) -> int:
        """Append an op to the step net (see PlainNet.add_op); returns its index."""
        return self.step_net.add_op(op, inputs, outputs, attrs)

    def add_var(self, name: str, shape: Sequence[int], dtype: Any = "float32", **flags: Any):
        """Declare a variable of the step net (a per-step shape for inlinks)."""
        return self.step_net.add_var(name, shape, dtype, **flags)

    def add_backward_ops(self, loss) -> list:
        raise NestflowError(
            "RecurrentNet runs forward only; build a trainable RNN with nf.rnn() (its "
            "recurrent op has a gradient)"
        )

    def add_optimizer_ops(self, attrs: Mapping[str, Any]) -> None:
        raise NestflowError("RecurrentNet runs forward only; it has no optimizer ops")

    def __len__(self) -> int:
        return len(self.step_net)

    # ---- running ----
    def _step_count(self, scope: Scope) -> int:
        source = self.step_count_from or (self.inlinks[0] if self.inlinks else "")
        if not source:
            raise ControlFlowError("RecurrentNet: no inlink to count the time steps from")
        value = _value(scope, source)
        if value is None:
            raise UninitializedError(f"RecurrentNet: inlink '{source}' is not in the scope")
        if np.ndim(value) < 2:
            raise ControlFlowError(
                f"RecurrentNet: '{source}' has shape {list(np.shape(value))}; the step count "
                f"comes from dim 1 of a [batch, time, ...] tensor"
            )
        return int(np.shape(value)[1])

    def drop_step_scopes(self) -> None:
        """Destroy the step scopes of the last run (and everything in them)."""
        owner, self._owner = self._owner, None
        if owner is not None and owner.alive:
            for kid in self.step_scopes:
                if kid.alive:
                    owner.delete_scope(kid)
        self.step_scopes = []

    def _make_step_scope(self, scope: Scope, t: int, inlinks: list[Any]) -> Scope:
        step = scope.new_scope()
        # Every variable the step net writes is made local first, so its writes stay in the
        # step scope instead of reaching a same-named variable up the parent chain.
        for op in self.step_net.ops:
            for name in op.output_names():
                if name:
                    step.var(name)
        for name, value in zip(self.inlinks, inlinks):
            _put(step, name, value[:, t])
        if t == 0:
            for pre, boot in zip(self.pre_states, self.boot_states):
                value = _value(scope, boot)
                if value is None:
                    raise UninitializedError(
                        f"RecurrentNet: boot state '{boot}' (initial '{pre}') is not in the scope"
                    )
                _put(step, pre, value)
        else:
            previous = self.step_scopes[t - 1]
            for state, pre in zip(self.states, self.pre_states):
                value = _value(previous, state, local=True)
                if value is None:
                    raise ControlFlowError(
                        f"RecurrentNet: the step net did not compute state '{state}' at step "
                        f"{t - 1}"
                    )
                _put(step, pre, value)
        return step

    def run(self, scope: Scope, context: Any = None, begin: int = -1, end: int = -1) -> None:
        """Run the step net (ops [begin, end), all when negative) once per time step, each in
        its own kid scope of `scope`; then store the stacked outlinks in `scope`."""
        steps = self._step_count(scope)
        inlinks = []
        for name in self.inlinks:
            value = _value(scope, name)
            if value is None:
                raise UninitializedError(f"RecurrentNet: inlink '{name}' is not in the scope")
            if np.ndim(value) < 2 or np.shape(value)[1] != steps:
                raise ControlFlowError(
                    f"RecurrentNet: inlink '{name}' has shape {list(np.shape(value))}, but the "
                    f"net runs {steps} steps: inlinks are [batch, time={steps}, ...]"
                )
            inlinks.append(value)
        self.drop_step_scopes()
        self._owner = scope
        for t in range(steps):
            step = self._make_step_scope(scope, t, inlinks)
            self.step_scopes.append(step)
            self.step_net.run(step, context, begin, end)
        for name in self.outlinks:
            parts = []
            for t, step in enumerate(self.step_scopes):
                value = _value(step, name, local=True)
                if value is None:
                    raise ControlFlowError(
                        f"RecurrentNet: outlink '{name}' was not computed at step {t}"
                    )
                parts.append(value)
            if parts:
                _put(scope, name, np.stack(parts, axis=1))

    def infer_shape(self, scope: Scope) -> dict[str, tuple[int, ...]]:
        """Shapes of the step net's variables at one time step, given the inlinks and boot
        states in `scope` (a throwaway step scope is used)."""
        self._step_count(scope)
        trial = scope.new_scope()
        try:
            for name in self.inlinks:
                value = _value(scope, name)
                if value is None:
                    raise UninitializedError(f"RecurrentNet: inlink '{name}' is not in the scope")
                _put(trial, name, value[:, 0])
            for pre, boot in zip(self.pre_states, self.boot_states):
                value = _value(scope, boot)
                if value is not None:
                    _put(trial, pre, value)
            return self.step_net.infer_shape(trial)
        finally:
            scope.delete_scope(trial)

    # ---- description ----
    def to_desc(self) -> pb.NetDesc:
        step = self.step_net.to_desc()
        return pb.NetDesc(
            model_type=pb.NetDesc.RECURRENT,
            step_ops=step.ops,
            vars=step.vars,
            inlinks=self.inlinks,
            outlinks=self.outlinks,
            states=self.states,
            pre_states=self.pre_states,
            boot_states=self.boot_states,
            step_count_from=self.step_count_from,
        )

    def __repr__(self) -> str:
        return (
            f"RecurrentNet(step_ops={len(self)}, inlinks={self.inlinks}, "
            f"outlinks={self.outlinks}, states={self.states})"
        )


__all__ = ["RecurrentNet"]
