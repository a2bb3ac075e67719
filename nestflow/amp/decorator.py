"""nf.amp.decorate: automatic mixed precision as a program transformation (Fluid 1.8's
contrib.mixed_precision.decorate).

`minimize(loss)` of the decorated optimizer
1. rewrites the forward ops of the loss's program by the op lists (fp16_lists): a cast to the
   low dtype (float16 or bfloat16) before each float32 input of a white op, and of a gray op
   fed a low value, a cast to float32 before each low input of any other op. Parameters stay
   float32 (the master weights): a white op reads `<param>.cast_<dtype>`, made each step;
2. scales the loss by the loss scale and appends its backward ops (the casts' gradients bring
   the parameters' gradients back to float32);
3. divides the gradients by the scale and checks them for inf and NaN
   (check_finite_and_unscale); with dynamic loss scaling moves the scale (update_loss_scaling);
4. appends the optimizer's update ops, guarded: a step whose gradients hold an inf or NaN
   leaves every parameter and optimizer state bit-identical. The guard copies each variable
   the updates write before them (assign) and picks the copy back after them when the step
   is bad (select_input on the found-inf flag): one copy of the parameters and optimizer state
   per step.

The scale (`loss_scaling_<n>`, float32 [1]) and the good/bad step counters (int32 [1]) are
persistable variables initialised by the startup program, so they live in the scope, are saved
with the parameters and resume with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nestflow.amp.fp16_lists import AutoMixedPrecisionLists
from nestflow.core.dtype import LOW_PRECISION, dtype_name
from nestflow.errors import AttrError
from nestflow.framework import unique_name
from nestflow.framework.program import (
    Block,
    OpDesc,
    Program,
    VarDesc,
    default_startup_program,
)
from nestflow.optimizer.optimizer import Optimizer

# Ops whose low-precision kernels take only these slots low (the affine parameters and the
# statistics stay float32, as in Fluid's fp16 batch_norm and layer_norm kernels).
_LOW_SLOTS = {"batch_norm": ({"X"}, {"Y"}), "layer_norm": ({"X"}, {"Y"})}


def _float_var(block: Block, name: str, dtypes: Iterable[str]) -> VarDesc | None:
    var = block.find_var(name) if name else None
    if var is None or var.type != "lod_tensor" or var.dtype not in dtypes:
        return None
    return var


def _cast_inputs(block: Block, index: int, op: OpDesc, slots, want: str, casts: dict) -> int:
    """Cast every input of `op` (in `slots`, or all) that is a float of the other precision to
    `want`, reusing casts made before; returns the number of ops inserted."""
    inserted = 0
    have = ("float32",) if want in LOW_PRECISION else LOW_PRECISION
    for slot, names in op.inputs.items():
        if slots is not None and slot not in slots:
            continue
        for i, name in enumerate(names):
            var = _float_var(block, name, have)
            if var is None:
                continue
            key = (name, want)
            if key not in casts:
                suffix = "fp32" if want == "float32" else want
                out = block.create_var(
                    unique_name.generate(f"{name}.cast_{suffix}"), var.shape, want
                )
                out.stop_gradient = var.stop_gradient
                block.insert_op(
                    index + inserted,
                    "cast",
                    {"X": [name]},
                    {"Out": [out.name]},
                    {"in_dtype": var.dtype, "out_dtype": want},
                )
                inserted += 1
                casts[key] = out.name
            names[i] = casts[key]
    return inserted


def _kind(op: OpDesc, block: Block, lists: AutoMixedPrecisionLists) -> str:
    if op.sub_blocks() or op.type in lists.unsupported_list or op.type == "cast":
        return "keep" if op.type == "cast" else "black"
    if any(n in lists.black_varnames for n in op.input_names() + op.output_names()):
        return "black"
    if op.type in lists.white_list:
        return "white"
    if op.type in lists.gray_list:
        low = any(_float_var(block, n, LOW_PRECISION) for n in op.input_names())
        return "white" if low else "black"
    return "black"


def rewrite_program(
    program: Program, amp_lists: AutoMixedPrecisionLists, dtype: str = "float16"
) -> None:
    """Rewrite the global block of `program` for mixed precision by `amp_lists` (see the
    module): casts inserted, the outputs of the ops that run low declared `dtype`.

    >>> main, startup = nf.Program(), nf.Program()
    >>> with nf.program_guard(main, startup):
    ...     y = nf.layers.fc(nf.data("x", [-1, 4]), 3)
    >>> nf.amp.rewrite_program(main, nf.amp.AutoMixedPrecisionLists(), "bfloat16")
    >>> [op.type for op in main.global_block().ops], y.dtype
    (['cast', 'cast', 'mul', 'cast', 'elementwise_add'], 'bfloat16')
    """
    block = program.global_block()
    casts: dict[tuple[str, str], str] = {}
    index = 0
    while index < len(block.ops):
        op = block.ops[index]
        kind = _kind(op, block, amp_lists)
        if kind == "keep":
            index += 1
            continue
        in_slots, out_slots = _LOW_SLOTS.get(op.type, (None, None))
        if kind == "white":
            index += _cast_inputs(block, index, op, in_slots, dtype, casts)
            for slot, names in op.outputs.items():
                if out_slots is not None and slot not in out_slots:
                    continue
                for name in names:
                    var = _float_var(block, name, ("float32",))
                    if var is not None and not var.persistable:
                        var.dtype = dtype
        else:
            index += _cast_inputs(block, index, op, None, "float32", casts)
        index += 1
    program._bump()


class OptimizerWithMixedPrecision:
    """An optimizer whose `minimize` trains in mixed precision (see the module); made by
    `nf.amp.decorate`. Every other attribute is the wrapped optimizer's."""

    def __init__(
        self,
        optimizer: Optimizer,
        amp_lists: AutoMixedPrecisionLists,
        init_loss_scaling: float,
        use_dynamic_loss_scaling: bool,
        incr_every_n_steps: int,
        decr_every_n_nan_or_inf: int,
        incr_ratio: float,
        decr_ratio: float,
        dtype: str,
    ):
        self.inner_optimizer = optimizer
        self._amp_lists = amp_lists
        self._init_loss_scaling = float(init_loss_scaling)
        self._use_dynamic_loss_scaling = use_dynamic_loss_scaling
        self._incr_every_n_steps = incr_every_n_steps
        self._decr_every_n_nan_or_inf = decr_every_n_nan_or_inf
        self._incr_ratio = float(incr_ratio)
        self._decr_ratio = float(decr_ratio)
        self._dtype = dtype
        self._loss_scaling: VarDesc | None = None
        self._num_good_steps: VarDesc | None = None
        self._num_bad_steps: VarDesc | None = None
        self._scaled_loss: VarDesc | None = None
        self.amp_state_vars: list[VarDesc] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner_optimizer"], name)

    @property
    def name(self) -> str:
        return self.inner_optimizer.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner_optimizer.name = value  # nf.Model names the optimizer's state

    @property
    def dtype(self) -> str:
        """The low dtype the white ops run in ("float16" or "bfloat16")."""
        return self._dtype

    def get_loss_scaling(self) -> VarDesc:
        """The loss-scale variable (float32 [1], persistable): fetch it, or read it from the
        scope, to see the scale the last step used. None before minimize."""
        return self._loss_scaling

    def get_scaled_loss(self) -> VarDesc:
        """The loss times the loss scale, the variable the backward ops differentiate."""
        return self._scaled_loss

    def _state(self, block: Block, startup: Block, what: str, dtype: str, value: float):
        name = unique_name.generate(what)
        var = block.create_var(name, [1], dtype, persistable=True, stop_gradient=True)
        out = startup.create_var(name, [1], dtype, persistable=True)
        startup.append_op(
            "fill_constant",
            {},
            {"Out": [out]},
            {"shape": [1], "dtype": dtype, "value": float(value)},
        )
        self.amp_state_vars.append(var)
        return var

    def backward(
        self,
        loss: VarDesc,
        startup_program: Program | None = None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        no_grad_set: Iterable[VarDesc | str] | None = None,
    ) -> list[tuple[VarDesc, VarDesc]]:
        """Rewrite the program, scale the loss and append the backward ops; returns the
        (parameter, scaled float32 gradient) pairs."""
        program = loss.block.program
        block = program.global_block()
        startup = (startup_program or default_startup_program()).global_block()
        rewrite_program(program, self._amp_lists, self._dtype)
        if loss.dtype != "float32":  # a loss made by a low op: scale it in float32
            cast = block.create_var(unique_name.generate(f"{loss.name}.cast_fp32"), loss.shape)
            block.append_op("cast", {"X": [loss]}, {"Out": [cast]}, {"out_dtype": "float32"})
            loss = cast
        self._loss_scaling = self._state(
            block, startup, "loss_scaling", "float32", self._init_loss_scaling
        )
        if self._use_dynamic_loss_scaling:
            self._num_good_steps = self._state(block, startup, "num_good_steps", "int32", 0)
            self._num_bad_steps = self._state(block, startup, "num_bad_steps", "int32", 0)
        scaled = block.create_var(unique_name.generate(f"{loss.name}.scaled"), loss.shape)
        block.append_op(
            "elementwise_mul",
            {"X": [loss], "Y": [self._loss_scaling]},
            {"Out": [scaled]},
            {"axis": -1},
        )
        self._scaled_loss = scaled
        return self.inner_optimizer.backward(scaled, startup_program, parameter_list, no_grad_set)

    def apply_gradients(self, params_grads) -> list[OpDesc]:
        """Unscale and check the gradients, move the loss scale, then the wrapped optimizer's
        updates, undone on a step with an inf or NaN gradient."""
        params_grads = [(p, g) for p, g in params_grads if g is not None]
        if not params_grads:
            return []
        block = params_grads[0][0].block.program.global_block()
        grads = [g.name for _, g in params_grads]
        unscaled = [
            block.create_var(unique_name.generate(f"{g.name}.unscaled"), g.shape, g.dtype).name
            for _, g in params_grads
        ]
        found = block.create_var(unique_name.generate("find_infinite_scale"), [1], "bool")
        block.append_op(
            "check_finite_and_unscale",
            {"X": grads, "Scale": [self._loss_scaling.name]},
            {"Out": unscaled, "FoundInfinite": [found.name]},
        )
        if self._use_dynamic_loss_scaling:
            state = [self._loss_scaling.name, self._num_good_steps.name, self._num_bad_steps.name]
            block.append_op(
                "update_loss_scaling",
                {
                    "X": unscaled,
                    "FoundInfinite": [found.name],
                    "PrevLossScaling": [state[0]],
                    "InGoodSteps": [state[1]],
                    "InBadSteps": [state[2]],
                },
                {
                    "Out": unscaled,
                    "LossScaling": [state[0]],
                    "OutGoodSteps": [state[1]],
                    "OutBadSteps": [state[2]],
                },
                {
                    "incr_every_n_steps": self._incr_every_n_steps,
                    "decr_every_n_nan_or_inf": self._decr_every_n_nan_or_inf,
                    "incr_ratio": self._incr_ratio,
                    "decr_ratio": self._decr_ratio,
                },
            )
        start = len(block.ops)
        pairs = [(p, block.var(name)) for (p, _), name in zip(params_grads, unscaled)]
        ops = self.inner_optimizer.apply_gradients(pairs)
        _guard_updates(block, start, found)
        return ops

    def minimize(
        self,
        loss: VarDesc,
        startup_program: Program | None = None,
        parameter_list: Sequence[VarDesc | str] | None = None,
        no_grad_set: Iterable[VarDesc | str] | None = None,
    ):
        """`backward` then `apply_gradients`; returns (update ops, [(param, grad)]) as the
        wrapped optimizer's minimize does (the scaled gradients)."""
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        return self.apply_gradients(params_grads), params_grads


def _guard_updates(block: Block, start: int, found: VarDesc) -> None:
    """Make the ops from `start` on (the updates) leave the persistable variables they write
    as they were when `found` holds True."""
    written: list[str] = []
    for op in block.ops[start:]:
        for name in op.output_names():
            var = block.find_var(name) if name else None
            if var is not None and var.persistable and name not in written:
                written.append(name)
    if not written:
        return
    backups = {}
    for i, name in enumerate(written):
        var = block.var(name)
        backup = block.create_var(unique_name.generate(f"{name}.before_step"), var.shape, var.dtype)
        block.insert_op(start + i, "assign", {"X": [name]}, {"Out": [backup.name]})
        backups[name] = backup.name
    mask = block.create_var(unique_name.generate(f"{found.name}.index"), [1], "int32")
    block.append_op("cast", {"X": [found.name]}, {"Out": [mask.name]}, {"out_dtype": "int32"})
    for name in written:
        block.append_op(
            "select_input", {"X": [name, backups[name]], "Mask": [mask.name]}, {"Out": [name]}
        )


def decorate(
    optimizer: Optimizer,
    amp_lists: AutoMixedPrecisionLists | None = None,
    init_loss_scaling: float = 2.0**15,
    incr_every_n_steps: int = 1000,
    decr_every_n_nan_or_inf: int = 2,
    incr_ratio: float = 2.0,
    decr_ratio: float = 0.5,
    use_dynamic_loss_scaling: bool = True,
    dtype: str = "float16",
) -> OptimizerWithMixedPrecision:
    """`optimizer` training in mixed precision: its `minimize(loss)` rewrites the program by
    `amp_lists` (default AutoMixedPrecisionLists()) so the white ops run in `dtype`
    ("float16" or "bfloat16") on float32 master weights, scales the loss by a loss scale
    starting at `init_loss_scaling`, and skips (parameters and optimizer state unchanged) a
    step whose gradients hold an inf or NaN. With `use_dynamic_loss_scaling` the scale is
    multiplied by `decr_ratio` after `decr_every_n_nan_or_inf` bad steps and by `incr_ratio`
    after `incr_every_n_steps` clean steps. Works with nf.Model (prepare it with the decorated
    optimizer). On the CPU float16 and bfloat16 are slower than float32 (docs/amp.md).

    >>> main, startup = nf.Program(), nf.Program()
    >>> with nf.program_guard(main, startup):
    ...     x = nf.data("x", [-1, 4])
    ...     loss = nf.layers.mean(nf.layers.fc(x, 1))
    ...     opt = nf.amp.decorate(nf.optimizer.SGD(0.1), init_loss_scaling=1024.0)
    ...     _ = opt.minimize(loss)
    >>> exe, scope = nf.Executor(), nf.Scope()
    >>> _ = exe.run(startup, scope=scope)
    >>> (scale,) = exe.run(main, feed={"x": np.ones((2, 4), "float32")},
    ...                    fetch_list=[opt.get_loss_scaling()], scope=scope)
    >>> scale.tolist()
    [1024.0]
    """
    dtype = dtype_name(dtype)
    if dtype not in LOW_PRECISION:
        raise AttrError(f"nf.amp.decorate: dtype must be one of {LOW_PRECISION}, got {dtype!r}")
    if not isinstance(getattr(optimizer, "inner_optimizer", optimizer), Optimizer):
        raise AttrError(
            f"nf.amp.decorate: optimizer must be an nf.optimizer optimizer, got "
            f"{type(optimizer).__name__}"
        )
    if not init_loss_scaling > 0:
        raise AttrError(f"nf.amp.decorate: init_loss_scaling must be > 0, got {init_loss_scaling}")
    if incr_every_n_steps < 1 or decr_every_n_nan_or_inf < 1:
        raise AttrError(
            "nf.amp.decorate: incr_every_n_steps and decr_every_n_nan_or_inf must be >= 1, got "
            f"{incr_every_n_steps} and {decr_every_n_nan_or_inf}"
        )
    if not (incr_ratio > 1.0 and 0.0 < decr_ratio < 1.0):
        raise AttrError(
            "nf.amp.decorate: incr_ratio must be > 1 and decr_ratio in (0, 1), got "
            f"{incr_ratio} and {decr_ratio}"
        )
    return OptimizerWithMixedPrecision(
        optimizer,
        amp_lists if amp_lists is not None else AutoMixedPrecisionLists(),
        init_loss_scaling,
        use_dynamic_loss_scaling,
        incr_every_n_steps,
        decr_every_n_nan_or_inf,
        incr_ratio,
        decr_ratio,
        dtype,
    )
