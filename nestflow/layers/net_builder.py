"""NetBuilder (seed 003): layer-style building of a Net, then backward, optimizer and run.

A frontend class (it builds the net's ops with nf.layers), so it lives above the executor that
runs the net.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from nestflow import layers
from nestflow.core.scope import Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import AttrError, NestflowError
from nestflow.executor.executor import checked_feed
from nestflow.executor.net import Net
from nestflow.framework.program import VarDesc


class NetBuilder:
    """Seed 003's NetBuilder: layer-style building of a Net, then backward, optimizer, run.

        builder = nf.NetBuilder(nf.Net.create())
        image = builder.data("image", [-1, 784])
        hidden = builder.add_op("fc", input=image, size=100, activation="sigmoid")
        ...
        builder.backward_from(avg_loss)
        builder.add_optimization(1e-4, "adam")
        builder.run(scope, feed={"image": xs, "label": ys})

    `add_op(type, ...)` calls the nf.layers function of that name (`activation=` is its
    `act=`) inside the net and returns its output variable(s). Backward and optimizer ops are
    added on the first `run(need_backward=True)`; forward-only runs stop after the last op
    added through the builder.

    >>> builder = nf.NetBuilder(nf.Net.create())
    >>> x = builder.data("x", [-1, 2])
    >>> y = builder.data("y", [-1, 1])
    >>> pred = builder.add_op("fc", input=x, size=1)
    >>> loss = builder.add_op("mean", builder.add_op("square_error_cost", input=pred, label=y))
    >>> builder.backward_from(loss)
    >>> builder.add_optimization(0.1, "sgd")
    >>> scope = nf.Scope()
    >>> xs = np.array([[1.0, 0.0], [0.0, 1.0]], "float32")
    >>> ys = np.array([[1.0], [-1.0]], "float32")
    >>> for _ in range(100):
    ...     builder.run(scope, feed={"x": xs, "y": ys})
    >>> builder.run(scope, need_backward=False, feed={"x": xs, "y": ys})  # forward only
    >>> float(scope.find_var(loss.name).get(nf.Tensor).numpy()) < 1e-3
    True
    """

    def __init__(self, net: Net | None = None):
        self.net = net if net is not None else Net.create()
        self.last_forward_op = 0
        self.need_rebuild = True
        self.loss: VarDesc | None = None
        self.optimization: dict[str, Any] | None = None

    def data(self, name: str, shape: Sequence[int], dtype: Any = "float32") -> VarDesc:
        """A variable the caller puts in the scope (or feeds to `run`)."""
        return self.net.add_var(name, shape, dtype, stop_gradient=True)

    def add_op(self, type: str, *args: Any, **kwargs: Any) -> Any:
        """Append the layer `type` (an nf.layers function) with these arguments; returns its
        output variable. Variable names in the arguments are resolved to the net's VarDescs."""
        if not self.need_rebuild:
            raise NestflowError(
                "the net already has backward/optimizer ops: add every forward op first"
            )
        layer = getattr(layers, type, None)
        if layer is None or not callable(layer):
            raise NestflowError(f"NetBuilder.add_op: nf.layers has no layer '{type}'")
        if "activation" in kwargs:
            kwargs["act"] = kwargs.pop("activation")
        args = tuple(self._resolve(a) for a in args)
        kwargs = {k: v if k in ("act", "name") else self._resolve(v) for k, v in kwargs.items()}
        self._check_variables(type, layer, args, kwargs)
        with self.net.building():
            out = layer(*args, **kwargs)
        self.last_forward_op = len(self.net)
        return out

    def backward_from(self, loss: VarDesc | str) -> None:
        self.loss = self.net._var(loss)

    def add_optimization(self, learning_rate: float, type: str = "sgd", **options: Any) -> None:
        self.optimization = {"type": type, "learning_rate": learning_rate, **options}

    def run(
        self,
        scope: Scope,
        context: Any = None,
        need_backward: bool = True,
        feed: Mapping[str, Any] | None = None,
    ) -> None:
        """One pass over the net in `scope`: forward, backward and optimizer ops, or with
        need_backward=False the forward ops only. `feed` values are put in the scope first."""
        # Every feed is checked before any is stored: a bad one leaves the scope as it was.
        arrays = [checked_feed(self.net.block, name, value) for name, value in (feed or {}).items()]
        for name, array in arrays:
            scope.var(name).get_mutable(Tensor)._array = array
        if not need_backward:
            self.net.run(scope, context, 0, self.last_forward_op)
            return
        if self.need_rebuild:
            if self.loss is None:
                raise NestflowError("NetBuilder.run needs backward_from(loss) first")
            self.net.add_backward_ops(self.loss)
            if self.optimization is not None:
                self.net.add_optimizer_ops(self.optimization)
            self.need_rebuild = False
        self.net.run(scope, context)

    @staticmethod
    def _check_variables(type: str, layer: Any, args: tuple, kwargs: dict) -> None:
        """AttrError for arguments the layer does not take; NestflowError for a name left
        where the layer takes a variable (one the net does not declare)."""
        try:
            signature = inspect.signature(layer)
        except (TypeError, ValueError):  # a callable Python cannot describe: nothing to check
            return
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise AttrError(f"NetBuilder.add_op('{type}'): {exc}") from None
        for name, value in bound.arguments.items():
            annotation = str(signature.parameters[name].annotation)
            if isinstance(value, str) and "VarDesc" in annotation and "str" not in annotation:
                raise NestflowError(
                    f"NetBuilder.add_op('{type}'): {name}={value!r} is not a variable of the "
                    f"net; declare it first (builder.data({value!r}, shape)) or pass a variable"
                )

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, str) and self.net.block.find_var(value) is not None:
            return self.net.block.find_var(value)
        return value


__all__ = ["NetBuilder"]
