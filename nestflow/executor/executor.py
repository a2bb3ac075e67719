"""Executor: runs a Program's global block in a scope (seed 002's execution model).

Persistable variables (parameters, optimizer state) live in the scope passed in. Temporaries
live in the run's env; sub-blocks run in kid scopes of a local scope that is made for the run
and dropped when it completes ("destroy when minibatch completes").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from nestflow.core.device_context import DeviceContext, device_context
from nestflow.core.memory import keep_freed_memory
from nestflow.core.place import Place, default_place, is_array, place_of
from nestflow.core.scope import _NOTHING_HELD, Scope
from nestflow.core.tensor import Tensor
from nestflow.errors import (
    FeedError,
    FetchError,
    NanInfError,
    NestflowError,
    TypeMismatchError,
    UninitializedError,
    suggest_names,
)
from nestflow.executor import plan as plan_module
from nestflow.executor.cuda_graph import ExecutionStrategy, GraphRunner
from nestflow.executor.plan import BlockPlan, Frame
from nestflow.flags import FLAGS
from nestflow.framework.nesting import hold_stack_room, nesting_depth, release_stack_room
from nestflow.framework.program import Block, Program, VarDesc, default_main_program
from nestflow.ops.random_state import program_generator

_global_scope = Scope()


def global_scope() -> Scope:
    """The scope Executor.run uses when none is given.

    >>> w = nf.var(0.5, param=True, name="w")
    >>> exe = nf.Executor()
    >>> _ = exe.run(nf.default_startup_program())  # persistables land in the global scope
    >>> nf.global_scope().find_var("w").get(nf.Tensor).numpy()
    array([0.5], dtype=float32)
    """
    return _global_scope


class _ProgramPlan:
    """A BlockPlan of a program's global block plus what a run needs to bind it to a scope."""

    def __init__(self, program: Program, device: DeviceContext):
        self.version = program.version
        self.device = device
        block = program.global_block()
        self.block_plan = BlockPlan(block, device)
        plan = self.block_plan
        self.persistable_reads = []
        self.required_feeds = []
        for name in plan.external_inputs:
            desc = block.find_var(name)
            if desc is not None and desc.persistable:
                self.persistable_reads.append((plan.slot_of[name], name))
            else:
                self.required_feeds.append(name)
        self.persistable_writes = [
            (plan.slot_of[name], name)
            for name in plan.written
            if (desc := block.find_var(name)) is not None and desc.persistable
        ]
        self.sub_plans: dict[int, BlockPlan] = {}
        # feed name -> (slot, dtype, shape) of the last array check_feed passed for it
        self.accepted_feeds: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        self.needs_local_scope = any(op.sub_blocks() for op in plan.ops) or any(
            op.type in ("print",) for op in plan.ops
        )
        self.nesting = nesting_depth(program)


class Executor:
    """Runs programs on a Place. Plans are prepared once per program version and place, and
    reused by every executor of that place.

    On a device place (CUDAPlace, StandInPlace) feeds are moved to the device once per run,
    persistables are moved there when first read and stay there between runs, and fetches
    come back as NumPy arrays (`return_numpy=False`: nf.Tensors on the device).

    >>> x = nf.data("x", shape=[-1, 2], dtype="float32")
    >>> ones = nf.ParamAttr(initializer=nf.initializer.Constant(1.0))
    >>> y = nf.layers.fc(x, size=1, param_attr=ones)
    >>> exe = nf.Executor(nf.CPUPlace())
    >>> _ = exe.run(nf.default_startup_program())
    >>> exe.run(feed={"x": np.array([[1.0, 2.0]], "float32")}, fetch_list=[y])
    [array([[3.]], dtype=float32)]
    """

    def __init__(
        self,
        place: Place | None = None,
        check_nan_inf: bool | None = None,
        execution_strategy: ExecutionStrategy | None = None,
        cuda_graph: bool = False,
    ):
        if place is not None and not isinstance(place, Place):
            raise TypeMismatchError(
                f"Executor(place): place must be a Place such as nf.CPUPlace(), got "
                f"{type(place).__name__} {place!r}"
            )
        if execution_strategy is not None and not isinstance(execution_strategy, ExecutionStrategy):
            raise TypeMismatchError(
                "Executor(execution_strategy=): expects nf.ExecutionStrategy, got "
                f"{type(execution_strategy).__name__}"
            )
        self.place = place if place is not None else default_place()
        self.device = device_context(self.place)
        self._on_device = self.place.is_device
        self._check_nan_inf = check_nan_inf
        # CUDA-graph replay (nestflow.executor.cuda_graph): on CUDAPlace only
        wanted = cuda_graph or (execution_strategy is not None and execution_strategy.cuda_graph)
        self._graphs = GraphRunner(self.device) if wanted and self.device.captures_graphs else None
        keep_freed_memory()

    def why_not_captured(self, program: Program | None = None) -> str | None:
        """Why `program` runs uncaptured with cuda_graph on (None: it is captured, or has not
        run twice yet); "cuda_graph is off" where it is off or the place is not CUDA."""
        if self._graphs is None:
            return "cuda_graph is off (or the place captures no graphs: not CUDAPlace)"
        return self._graphs.why_not_captured(program or default_main_program())

    @property
    def check_nan_inf(self) -> bool:
        """Whether runs check every op's outputs for NaN/Inf: as given to the constructor,
        else (None) nf's `check_nan_inf` flag at each run (nf.set_flags)."""
        checking = self._check_nan_inf
        return FLAGS["check_nan_inf"] if checking is None else checking

    @check_nan_inf.setter
    def check_nan_inf(self, value: bool | None) -> None:
        self._check_nan_inf = value

    def _plan(self_or_program, program: Program | None = None) -> _ProgramPlan:
        """The prepared plan of `program` for this executor's place (called on the class,
        `Executor._plan(program)`: for CPUPlace)."""
        if program is None:
            program, device = self_or_program, device_context()
        else:
            device = self_or_program.device
        # The plan lives on the program (it depends on nothing else), so it goes when the
        # program goes; a cache keyed by the program would keep it alive through the plan.
        plan = program.__dict__.get("_prepared_plan")
        if plan is None or plan.version != program.version or plan.device is not device:
            plan = program.__dict__["_prepared_plan"] = _ProgramPlan(program, device)
        return plan

    def run(
        self,
        program: Program | None = None,
        feed: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        fetch_list: Sequence[VarDesc | str] | None = None,
        scope: Scope | None = None,
        return_numpy: bool = True,
        check_nan_inf: bool | None = None,
    ) -> list[Any]:
        """Run `program` once; returns the values of `fetch_list` (NumPy arrays) in order.

        `feed` maps variable names (or VarDescs) to values, or is a list of (name, value)
        pairs. A value of another dtype than its variable's is cast when the cast keeps every
        value (float rounding and NaN are kept; integer overflow, a float made inf, or another
        kind of number are not). Raises FeedError for missing/unknown/misshaped/lossy feeds,
        NanInfError for a NaN/Inf feed when check_nan_inf is on, and ExecutionError (naming
        op, inputs' shapes and the source line) when an op fails; on any error the scope's
        persistable variables are left unchanged.
        """
        program = program if program is not None else default_main_program()
        if not isinstance(program, Program):
            raise TypeMismatchError(
                f"Executor.run expects a nestflow Program, got {type(program).__name__}"
            )
        scope = scope if scope is not None else _global_scope
        if not isinstance(scope, Scope):
            raise TypeMismatchError(f"Executor.run expects a Scope, got {type(scope).__name__}")
        if type(feed) is not dict:
            feed = feed_mapping(feed)
        fetch_names = [f if type(f) is str else _fetch_name(f) for f in (fetch_list or ())]
        prepared = self._plan(program)
        plan = prepared.block_plan
        block = program.global_block()

        checking = self._check_nan_inf if check_nan_inf is None else check_nan_inf
        if checking is None:
            checking = FLAGS["check_nan_inf"]
        if self._graphs is not None and not checking and plan_module.profiler is None:
            with self.device.activate():
                replayed = self._graphs.run(
                    self, prepared, block, feed or {}, fetch_names, scope, return_numpy
                )
            if replayed is not None:
                return self._returned(replayed, return_numpy)
        # Each level of nested sub-blocks recurses: room for the program's deepest chain.
        deep = hold_stack_room(prepared.nesting, "the program")
        local = scope.new_scope() if prepared.needs_local_scope else scope
        try:
            frame = Frame(plan, local, self, None, None, checking)  # sub-blocks inherit it
            env = frame.env
            fed_only = self._bind_feeds(prepared, block, env, feed) if feed else None
            if checking and feed:
                _check_feeds_finite(feed, plan, env, fed_only)
            if feed and self._on_device:
                self._move_feeds(plan, env, feed)
            if prepared.persistable_reads:
                self._bind_persistables(prepared, scope, env, feed)
            for name in prepared.required_feeds:
                if env[plan.slot_of[name]] is None:
                    value = _scope_value(scope, name)
                    if value is None:
                        raise FeedError(_missing_feed_message(plan, name))
                    if not self.device.owns(value):
                        value = self._moved(scope, name, value)
                    env[plan.slot_of[name]] = value
            keep = frozenset(fetch_names)
            if self._on_device:  # the host needs no device made current
                with self.device.activate():
                    try:
                        _run_frame(frame, program, keep)
                    except BaseException:
                        self.device.discard_checks()
                        raise
                    self.device.raise_failed_checks()
            elif program.random_seed:
                _run_frame(frame, program, keep)
            else:  # the common case, called directly: this is the per-run cost (W5)
                frame.run(keep=keep)
            # fetched temporaries nothing else holds go to the caller as they are (no copy)
            fresh = _fresh_fetches(frame, block, fetch_names) if return_numpy and keep else ()
            results = [self._fetch(frame, local, name, fed_only) for name in fetch_names]
            for slot, name in prepared.persistable_writes:
                value = env[slot]
                if value is not None:
                    _store(scope, name, value)
        finally:
            if deep:
                release_stack_room()
            if local is not scope:
                scope.delete_scope(local)
        return self._returned(results, return_numpy, fresh)

    def _returned(self, results: list, return_numpy: bool, fresh=()) -> list:
        if return_numpy:
            # A fetch may be a parameter's own array (or a view of one): the caller gets a
            # copy, so writing into it cannot change the scope behind the executor's back.
            if not fresh:
                return [r.copy() if type(r) is np.ndarray else _to_numpy(r) for r in results]
            return [
                (r if i in fresh else r.copy()) if type(r) is np.ndarray else _to_numpy(r)
                for i, r in enumerate(results)
            ]
        if self.place.is_device:
            if self._graphs is not None:  # a replay writes persistables' arrays in place
                results = [r.copy() if self.device.owns(r) else r for r in results]
            return [Tensor._holding(r, self.place) if self.device.owns(r) else r for r in results]
        return results

    def _move_feeds(self, plan: BlockPlan, env: list, feed: Mapping[Any, Any]) -> None:
        """The fed arrays bound in `env`, moved to this executor's device (once per run)."""
        to_device = self.device.to_device
        for name in feed:
            slot = plan.slot_of.get(_fetch_name(name))
            if slot is not None and env[slot] is not None:
                env[slot] = to_device(env[slot])

    def _moved(self, scope: Scope, name: str, value: Any) -> Any:
        """A persistable (or scope-held) array of another place, copied to this executor's
        place and kept there in the scope, so it stays on the device between runs."""
        if not is_array(value):
            return value  # not an array (a list of step scopes, a SelectedRows...)
        source = place_of(value)
        moved = self.device.to_device(source.to_host(value) if source.is_device else value)
        _store(_owning_scope(scope, name), name, moved)
        return moved

    def _bind_feeds(
        self, prepared: _ProgramPlan, block: Block, env: list, feed: Mapping[str, Any]
    ) -> dict[str, np.ndarray] | None:
        """Checks and binds `feed`; returns the fed values no op reads (they can be fetched)."""
        fed_only = None
        accepted = prepared.accepted_feeds
        slot_of = prepared.block_plan.slot_of
        for name, value in feed.items():
            # A training loop feeds arrays of one dtype and shape run after run: one that is
            # the same as the last one check_feed passed needs no checking again.
            known = accepted.get(name) if type(name) is str else None
            if (
                known is not None
                and type(value) is np.ndarray
                and value.dtype is known[1]
                and value.shape == known[2]
            ):
                if known[0] is None:  # fed but read by no op: kept for a fetch
                    fed_only = fed_only or {}
                    fed_only[name] = value
                else:
                    env[known[0]] = value
                continue
            name, array = checked_feed(block, name, value)
            if type(array) is not np.ndarray and not self.place.is_device:
                raise FeedError(
                    f"feed '{name}' is an array on {place_of(array)!r}, but this executor runs "
                    f"on {self.place!r}: copy it to the host first (CuPy: x.get()) or run the "
                    "program on its place"
                )
            slot = slot_of.get(name)
            if slot is None:
                fed_only = fed_only or {}
                fed_only[name] = array
            else:
                env[slot] = array
            accepted[name] = (slot, array.dtype, array.shape)
        return fed_only

    def _bind_persistables(self, prepared: _ProgramPlan, scope: Scope, env: list, feed):
        owns = self.device.owns
        for slot, name in prepared.persistable_reads:
            if env[slot] is not None:
                continue
            value = _scope_value(scope, name)
            if value is None:
                raise UninitializedError(
                    f"persistable variable '{name}' is not initialised in the scope: "
                    f"run the startup program first (needed by "
                    f"{_first_reader(prepared.block_plan, name)})"
                )
            if not owns(value):
                value = self._moved(scope, name, value)
            env[slot] = value

    def _fetch(self, frame: Frame, local: Scope, name: str, fed_only: dict | None) -> Any:
        value = frame.value(name)
        if value is None and fed_only:
            value = fed_only.get(name)
        if value is None:
            value = _scope_value(local, name)
        if value is None:
            value = _search_kid_scopes(local, name)
        if value is None:
            raise FetchError(f"fetch target '{name}' was not computed by the program")
        return value

    def run_sub_block(
        self,
        block: Block,
        scope: Scope,
        values: Mapping[str, Any],
        parent: Frame,
        outer: dict | None = None,
    ) -> Frame:
        """Run a sub-block in `scope`: `values` are bound by name, other inputs come from the
        scope chain, then the enclosing frames.

        `outer`: a dict a control-flow op keeps while it runs one block in many kid scopes of
        one scope (its step scopes). A value not held by `scope` itself is looked up once
        beyond it and remembered there: nothing outside the op changes while it runs."""
        plan = _sub_plan(parent, block)
        frame = Frame(plan, scope, self, parent)
        env = frame.env
        slot_of = plan.slot_of
        for name, value in values.items():
            slot = slot_of.get(name)
            if slot is not None:
                env[slot] = value
        held = None
        if outer is not None and scope is not None:
            # The remembered values hold for one parent scope and one enclosing frame.
            known = outer.get(None)
            if known is None or known[0] is not scope.parent or known[1] is not parent:
                outer.clear()
                outer[None] = (scope.parent, parent)
            held = scope._held_only()
        if held is not None:
            # A step scope holding only its kept values: read them in place (what _lookup
            # gives, without a call per held name); what it lacks is remembered beyond it.
            index_of, held_values = held
            for name in plan.external_inputs:
                slot = slot_of[name]
                if env[slot] is None:
                    index = index_of.get(name)
                    value = None if index is None else held_values[index]
                    if value is None:
                        value = _beyond_step(frame, parent, name, outer)
                    env[slot] = value
        else:
            for name in plan.external_inputs:
                slot = slot_of[name]
                if env[slot] is None:
                    if scope is None:
                        env[slot] = parent.lookup(name)
                    else:
                        env[slot] = _lookup(frame, parent, name, outer)
        frame.run()
        return frame

    def step_runner(self, block: Block, parent: Frame, bound: Sequence[str]) -> StepRunner:
        """A StepRunner: `block` run once per step of a loop op, with the names `bound` given
        values at every step (what run_sub_block does, the per-name work done once)."""
        return StepRunner(self, block, parent, bound)

    def eval(self, program: Program, targets, feed=None, scope=None) -> list[Any]:
        """Seed 002's Eval: prune `program` to what `targets` need, run that, return targets."""
        from nestflow.executor.prune import prune_cached

        if not isinstance(program, Program):
            raise TypeMismatchError(
                f"Executor.eval expects a nestflow Program, got {type(program).__name__}"
            )
        small = prune_cached(program, targets)
        # The same feed as a run of `program` is accepted: feeds of its variables that the
        # pruned program no longer needs are checked, then left out.
        kept = small.global_block()
        block = program.global_block()
        arrays = (checked_feed(block, name, value) for name, value in feed_mapping(feed).items())
        feed = {name: a for name, a in arrays if kept.find_var(name) is not None}
        return self.run(small, feed=feed, fetch_list=targets, scope=scope)


class StepRunner:
    """Runs one sub-block step after step for a loop op (recurrent, recurrent_grad), each step
    in its own step scope, all of them kids of one scope, with the same names bound each time.

    What `run_sub_block(block, scope, values, parent, outer)` does, with the per-name work done
    once: the bound names' slots, and each other input's source. An input a step scope holds
    (a kept forward value) is read from it by index: step scopes kept by one loop share one
    name -> index map. Anything else lies beyond the step scopes and is looked up once per
    runner (nothing outside the loop op changes while it runs), into an env template that
    each step copies."""

    __slots__ = (
        "executor",
        "plan",
        "parent",
        "bound",
        "free",
        "remembered",
        "_map",
        "_reads",
        "_template",
        "_function",
        "_frame",
        "_transposed",
    )

    def __init__(self, executor: Executor, block: Block, parent: Frame, bound: Sequence[str]):
        plan = _sub_plan(parent, block)
        self.executor, self.plan, self.parent = executor, plan, parent
        slot_of = plan.slot_of
        self.bound = [(i, slot_of[n]) for i, n in enumerate(bound) if n in slot_of]
        bound_names = set(bound)
        self.free = [(slot_of[n], n) for n in plan.external_inputs if n not in bound_names]
        self.remembered: dict = {}
        self._map: dict | None = None
        self._reads: list = []
        self._template: list = [None] * len(plan.names)
        # A block of kernels alone runs as its compiled function over each step's env, with
        # one frame for all steps (to name a failing op); else each step gets a Frame.
        direct = plan.frame_free and not parent.check_nan_inf and plan_module.profiler is None
        self._function = plan.compiled(None) if direct else None
        self._frame = Frame(plan, parent.scope, executor, parent) if direct else None
        # name -> (value found beyond the steps, the same values laid out transposed)
        self._transposed: dict[str, tuple[Any, Any]] | None = (
            {} if _right_operands_of_products(plan) & set(plan.external_inputs) else None
        )

    def run(self, scope: Scope, values: Sequence[Any]) -> Frame:
        """Run the block in `scope` (a step scope) with `values` (none of them None) for the
        bound names, in order; returns the finished frame."""
        held = scope._held_only() if self.free else _NOTHING_HELD
        if held is None:  # the scope has Variables: the general lookup, name by name
            frame = Frame(self.plan, scope, self.executor, self.parent)
            env = frame.env
            for i, slot in self.bound:
                env[slot] = values[i]
            remembered, laying_out = self.remembered, self._transposed is not None
            for slot, name in self.free:
                if env[slot] is None:
                    value = _lookup(frame, self.parent, name, remembered)
                    # only a value from beyond the steps is the same at every step
                    if laying_out and remembered.get(name, remembered) is value:
                        value = self._laid_out(name, value)
                    env[slot] = value
        else:
            env = self._env(scope, held, values)
            frame = Frame(self.plan, scope, self.executor, self.parent, env)
        frame.run()
        return frame

    def step(self, scope: Scope, values: Sequence[Any]) -> list:
        """As `run`, returning the finished env: without a Frame per step where the block is
        kernels alone and the step scope holds values only."""
        held = scope._held_only() if self.free else _NOTHING_HELD
        if self._function is None or held is None:
            return self.run(scope, values).env
        env = self._env(scope, held, values)
        self.call(env)
        return env

    def call(self, env: list) -> None:
        """Run the block's compiled function over a step's `env` (where it has one); an op
        failing in it is raised as the error naming that op, its block and the user's line."""
        try:
            self._function(env, self._frame)
        except Exception as exc:
            self._frame.raise_located(exc, env)

    def direct(self, parent_scope: Scope) -> list | None:
        """For steps in fresh kid scopes of `parent_scope`, where the block runs as its
        compiled function: the env template. A step is then `env = template.copy()`, the bound
        values put at their slots (`bound`), and `call(env)`. None where each step needs a
        Frame."""
        if self._function is None:
            return None
        if self._map is not _NOTHING_HELD[0]:
            # a fresh kid holds nothing: what it reads is what its parent scope sees
            self._read_through(parent_scope, _NOTHING_HELD[0])
        return self._template

    def direct_held(self, scopes: Sequence[Scope]) -> tuple[list, list] | None:
        """For steps in `scopes`, step scopes of one loop still holding values only (by one
        name -> index map), where the block runs as its compiled function: (env template,
        reads). A step is then `env = template.copy()`, each `env[slot] = held_values[index]`
        of `reads` ((slot, index) pairs; a None held value means the general `step`), the
        bound values put at their slots (`bound`), and `call(env)`. None where a step needs
        `step`."""
        if self._function is None or not scopes:
            return None
        held = scopes[0]._held_only()
        if held is None:
            return None
        index_of = held[0]
        for scope in scopes:
            held = scope._held_only()
            if held is None or held[0] is not index_of:
                return None
        if index_of is not self._map:
            self._read_through(scopes[0], index_of)
        reads = [(slot, index) for slot, index, _ in self._reads]
        return self._template, reads

    def _env(self, scope: Scope, held: tuple[dict[str, int], list], values) -> list:
        """A step's env in a held-only step scope: the template, the bound values, the held
        values read by index."""
        index_of, held_values = held
        if index_of is not self._map:
            self._read_through(scope, index_of)
        env = self._template.copy()
        for i, slot in self.bound:
            env[slot] = values[i]
        for slot, index, name in self._reads:
            value = held_values[index]
            if value is None:  # this step scope holds nothing under the name: look beyond
                outer = Frame(self.plan, scope, None)
                value = _beyond_step(outer, self.parent, name, self.remembered)
            env[slot] = value
        return env

    def _read_through(self, scope: Scope, index_of: dict[str, int]) -> None:
        """Sources of the free inputs for step scopes holding values by `index_of`: a held
        value's index, else the value beyond the step scopes, put in the env template."""
        self._map = index_of
        self._reads = []
        template = self._template = [None] * len(self.plan.names)
        lookup_frame = Frame(self.plan, scope, None)
        for slot, name in self.free:
            index = index_of.get(name)
            if index is None:
                value = _beyond_step(lookup_frame, self.parent, name, self.remembered)
                template[slot] = self._laid_out(name, value)
            else:
                self._reads.append((slot, index, name))

    def _laid_out(self, name: str, value: Any) -> Any:
        """`value` (of `name`, from beyond the steps, so the same at every step), or where
        every op of the block reading it is a product gradient taking it as the right
        operand Y (dX = dOut @ Y^T at each step), the same values as the transpose of a
        contiguous Y^T, copied once per loop run: then Y^T is contiguous and each step's
        product runs OpenBLAS's plain kernel. One BLAS thread, dOut [32, 128], Y [128, 128]:
        19 us with Y^T a transposed view, 10 us contiguous; the copy 11 us once."""
        if (
            self._transposed is None
            or name not in _right_operands_of_products(self.plan)
            or type(value) is not np.ndarray
            or value.ndim != 2
            or not value.flags.c_contiguous
            or value.dtype.kind != "f"
        ):
            return value
        known = self._transposed.get(name)
        if known is not None and known[0] is value:
            return known[1]
        laid_out = np.ascontiguousarray(value.T).T
        self._transposed[name] = (value, laid_out)
        return laid_out


# Product gradients whose dX is dOut @ Y^T with Y as given, and when that holds.
_PRODUCT_GRADIENTS = {
    "matmul_grad": lambda attrs: (
        not attrs.get("transpose_X")
        and not attrs.get("transpose_Y")
        and attrs.get("alpha", 1.0) == 1.0
    ),
    "mul_grad": lambda attrs: (
        attrs.get("x_num_col_dims", 1) == 1 and attrs.get("y_num_col_dims", 1) == 1
    ),
}


def _right_operands_of_products(plan: BlockPlan) -> frozenset[str]:
    """Names `plan`'s block reads only as the Y of plain 2-D product gradients and never
    writes (see StepRunner._laid_out), found once per plan; none where an op runs sub-blocks
    (which may read any name)."""
    found = plan.__dict__.get("_right_operands")
    if found is None:
        as_y, elsewhere = set(), set(plan.written)
        if not plan.frame_free:
            plan.__dict__["_right_operands"] = found = frozenset()
            return found
        for op in plan.block.ops:
            plain = _PRODUCT_GRADIENTS.get(op.type)
            is_plain = plain is not None and plain(op.attrs)
            for slot, names in op.inputs.items():
                for name in names:
                    (as_y if is_plain and slot == "Y" else elsewhere).add(name)
        found = plan.__dict__["_right_operands"] = frozenset(as_y - elsewhere)
    return found


def _sub_plan(parent: Frame, block: Block) -> BlockPlan:
    """The plan of sub-block `block`, made once per enclosing plan."""
    plans = parent.plan.__dict__.setdefault("_sub_plans", {})
    plan = plans.get(block.idx)
    if plan is None or plan.block is not block:
        plan = plans[block.idx] = BlockPlan(block, parent.plan.device)
    return plan


def _beyond_step(frame: Frame, parent: Frame, name: str, outer: dict) -> Any:
    """A value a step scope does not hold: remembered in `outer`, else looked up (and
    remembered there) beyond the step scope."""
    value = outer.get(name, outer)
    return _lookup(frame, parent, name, outer) if value is outer else value


def _lookup(frame: Frame, parent: Frame, name: str, outer: dict | None = None) -> Any:
    """`name` in the frame's scope chain, else in the enclosing frames; with `outer` (see
    run_sub_block) whatever lies beyond the frame's own scope is remembered there."""
    scope = frame.scope
    if outer is None:
        value = _scope_value(scope, name)
        return value if value is not None else parent.lookup(name)
    # `outer` doubles as the marker for "no such variable here": a scope never holds it.
    value = scope._local_value(name, outer)
    if value is outer:
        value = outer.get(name, outer)
        if value is outer:
            value = _scope_value(scope.parent, name)
            if value is None:
                value = parent.lookup(name)
            outer[name] = value
        return value
    return value if value is not None else parent.lookup(name)


def _run_frame(frame: Frame, program: Program, keep: frozenset[str]) -> None:
    if program.random_seed:
        with program_generator(program):
            frame.run(keep=keep)
    else:
        frame.run(keep=keep)


def _fresh_fetches(frame: Frame, block: Block, fetch_names: Sequence[str]) -> Collection[int]:
    """The positions of fetch_names whose values are host arrays only the run's env holds (an
    op's fresh output: not a persistable, a feed, a view of either, or an array an op keeps):
    handed to the caller as they are, as nothing can change them after the run. A name fetched
    twice is fresh once at most."""
    env, slot_of, fresh = frame.env, frame.plan.slot_of, None
    for i, name in enumerate(fetch_names):
        slot = slot_of.get(name)
        # a small array is copied faster than this is checked (the per-run cost, W5)
        if slot is None or getattr(env[slot], "nbytes", 0) < _HAND_OVER_FROM:
            continue
        if fetch_names.index(name) != i:
            continue  # fetched again: a copy
        desc = block.find_var(name)
        if (desc is None or not desc.persistable) and plan_module._owned(env[slot]):
            fresh = fresh or set()
            fresh.add(i)
    return fresh or ()


_HAND_OVER_FROM = 1 << 16  # bytes


def _scope_value(scope: Scope | None, name: str) -> Any:
    """The value of scope.find_var(name) (a Tensor's array), None if absent; step scopes'
    held values are read as they are (Scope._value), without making Variables of them."""
    return None if scope is None else scope._value(name)


def _search_kid_scopes(scope: Scope, name: str) -> Any:
    """A variable made inside a sub-block: the newest kid scope holding it wins."""
    for kid in reversed(scope.kids):
        var = kid.find_local_var(name)
        if var is not None and var._value is not None:
            held = var._value
            return held._array if isinstance(held, Tensor) else held
        found = _search_kid_scopes(kid, name)
        if found is not None:
            return found
    return None


def _store(scope: Scope, name: str, value: Any) -> None:
    var = scope.var(name)
    if is_array(value):
        tensor = var._value
        if not isinstance(tensor, Tensor):
            tensor = var.get_mutable(Tensor)
        tensor._array = value
        if type(value) is not np.ndarray or tensor.place.is_device:
            tensor.place = place_of(value)
    else:
        var.set_value(value)


def _owning_scope(scope: Scope, name: str) -> Scope:
    """The scope of `scope`'s chain that holds `name`."""
    while scope.find_local_var(name) is None and scope.parent is not None:
        scope = scope.parent
    return scope


def _fetch_name(target: VarDesc | str) -> str:
    return target.name if isinstance(target, VarDesc) else str(target)


def _to_numpy(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, np.ndarray):
        # A fetch may be a parameter's own array (or a view of one): the caller gets a copy so
        # writing into it cannot change the scope behind the executor's back.
        return value.copy()
    if is_array(value):  # a device array
        return place_of(value).to_host(value)
    return value


def checked_feed(block: Block, name: str | VarDesc, value: Any) -> tuple[str, np.ndarray]:
    """A fed value as an array of its variable's dtype, with the variable's name; FeedError for
    a name the block does not declare or a value of the wrong shape or dtype."""
    name = name.name if isinstance(name, VarDesc) else name
    if type(name) is not str:
        raise FeedError(f"feed names are variable names (str or Variable), got {name!r}")
    desc = block.find_var(name)
    if desc is None:
        raise FeedError(
            f"feed '{name}' is not a variable of the program{_feed_suggestion(block, name)}"
        )
    try:
        return name, check_feed(desc, value)
    except FeedError as err:  # say who reads the bad feed, and where that op was built
        reader = _first_reader(block, name)
        if reader == _NO_READER:
            raise
        raise FeedError(f"{err.message}; it is read by {reader}") from None


def _feed_suggestion(block: Block, name: str) -> str:
    """' (did you mean ...?)' naming the block's variables closest to `name`; a name that
    differs in case only ('X' for 'x') first."""
    names = [v for v in block.vars if not block.vars[v].persistable] or list(block.vars)
    same = [v for v in names if v.lower() == name.lower()]
    if same:
        return f" (did you mean {', '.join(map(repr, same[:3]))}?)"
    return suggest_names(name, names)


def feed_mapping(feed: Any) -> Mapping[Any, Any]:
    """`feed` as a mapping name -> value: a mapping as it is, a list or tuple of (name, value)
    pairs as a dict (FeedError for a name given twice), None as {}; FeedError otherwise."""
    if feed is None:
        return {}
    if isinstance(feed, Mapping):
        return feed
    if not isinstance(feed, (list, tuple)):
        raise FeedError(
            f"feed must be a mapping name -> value or a list of (name, value) pairs, "
            f"got {type(feed).__name__}"
        )
    pairs: dict[Any, Any] = {}
    for i, item in enumerate(feed):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise FeedError(
                f"feed must be a mapping name -> value or a list of (name, value) pairs: "
                f"item #{i} is not a (name, value) pair but {type(item).__name__}"
            )
        name, value = item
        if not isinstance(name, (str, VarDesc)):
            raise FeedError(
                f"feed names are variable names (str or Variable): item #{i} names "
                f"{type(name).__name__} {name!r}"
            )
        key = _fetch_name(name)
        if key in pairs:
            raise FeedError(f"variable '{key}' is fed twice (feed items #{i} and before)")
        pairs[key] = value
    return pairs


def check_feed(desc: VarDesc, value: Any) -> np.ndarray:
    """The fed value as an array of the variable's dtype; FeedError on a shape or dtype clash
    or when casting to the variable's dtype would change a value."""
    if isinstance(value, Tensor):
        value = value.data()
    if type(value) is not np.ndarray and is_array(value):
        return _check_device_feed(desc, value)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as err:
        raise FeedError(f"feed '{desc.name}' is not an array: {err}") from None
    want = np.dtype(desc.dtype)
    if isinstance(value, (list, tuple)) and array.dtype.kind in "biuf":
        array = _list_as(desc.name, array, want)
    if array.dtype != want:
        same_kind = (array.dtype.kind in "fc") == (want.kind in "fc") and not (
            want.kind == "b" and array.dtype.kind != "b"
        )
        if not same_kind or not np.can_cast(array.dtype, want, "same_kind"):
            raise FeedError(
                f"feed '{desc.name}' has dtype {array.dtype}, but the variable is {want} "
                f"(cast it first: np.asarray(x, '{want}'))"
            )
        array = _cast_keeping_values(desc.name, array, want)
    if desc.shape and (
        array.ndim != len(desc.shape)
        or any(d != -1 and d != a for d, a in zip(desc.shape, array.shape))
    ):
        raise FeedError(
            f"feed '{desc.name}' has shape {list(array.shape)}, but the variable is declared "
            f"{list(desc.shape)} (-1 = any)"
        )
    return array


def _check_device_feed(desc: VarDesc, value: Any) -> Any:
    """A fed device array (CuPy, stand-in) checked for shape and dtype without reading it on
    the host; a dtype cast only where it keeps every value (a safe cast)."""
    want = np.dtype(desc.dtype)
    if value.dtype != want:
        if not np.can_cast(value.dtype, want, "safe"):
            raise FeedError(
                f"feed '{desc.name}' is a device array of dtype {value.dtype}, but the variable "
                f"is {want} and the cast is not safe: cast it first (x.astype('{want}'))"
            )
        value = value.astype(want)
    if desc.shape and (
        value.ndim != len(desc.shape)
        or any(d != -1 and d != a for d, a in zip(desc.shape, value.shape))
    ):
        raise FeedError(
            f"feed '{desc.name}' has shape {list(value.shape)}, but the variable is declared "
            f"{list(desc.shape)} (-1 = any)"
        )
    return value


def _cast_keeping_values(name: str, array: np.ndarray, want: np.dtype) -> np.ndarray:
    """`array` cast to `want` (same kind of number); FeedError naming the first element the
    cast would change: an integer out of `want`'s range, or a finite float made inf. Rounding
    to a narrower float and NaN are accepted."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(want)
    if want.kind in "iu" and array.dtype.kind in "iu" and array.size:
        limits = np.iinfo(want)
        # A cheap whole-array test first; the element-wise mask only to name the culprit.
        low = array.dtype.kind == "i" and array.min() < limits.min
        if low or array.max() > limits.max:
            bad = array > limits.max
            if array.dtype.kind == "i":
                bad |= array < limits.min
            _raise_lossy(name, array, cast, bad, f"outside {want}'s range")
    elif want.kind in "fc" and array.size and np.isinf(cast).any():
        parts = (
            ((array.real, cast.real), (array.imag, cast.imag))
            if want.kind == "c"
            else ((array, cast),)
        )
        bad = np.zeros(array.shape, bool)
        for source, made in parts:
            bad |= np.isinf(made) & np.isfinite(source)
        if bad.any():
            _raise_lossy(name, array, cast, bad, f"too large for {want} (it would become inf)")
    return cast


def _list_as(name: str, array: np.ndarray, want: np.dtype) -> np.ndarray:
    """A Python list's array in the variable's dtype when it is of another kind of number (ints
    for a float variable, 1.0 for an int one): a list has no dtype of its own to respect, but
    a value the cast would change (1.5 for an int, 2**24 + 1 for float32) is a FeedError."""
    if array.dtype.kind == want.kind or want.kind not in "biufc":
        return array  # the same kind: cast (or refused) as an array of that dtype would be
    with np.errstate(all="ignore"):
        cast = array.astype(want)
        bad = cast.astype(array.dtype) != array
    if bad.any():
        _raise_lossy(name, array, cast, bad, f"not exactly a {want} value")
    return cast


def _raise_lossy(name: str, array: np.ndarray, cast: np.ndarray, bad: np.ndarray, why: str):
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    raise FeedError(
        f"feed '{name}' ({array.dtype}) cannot be cast to the variable's dtype {cast.dtype} "
        f"without changing it: the value {array[index]!r} at index {list(index)} is {why} "
        f"and would become {cast[index]!r}"
    )


def _check_feeds_finite(feed: Mapping[Any, Any], plan: BlockPlan, env: list, fed_only) -> None:
    """check_nan_inf: NanInfError naming the first fed float array holding NaN or Inf."""
    for name in feed:
        name = _fetch_name(name)
        slot = plan.slot_of.get(name)
        value = env[slot] if slot is not None else (fed_only or {}).get(name)
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
            finite = np.isfinite(value)
            if not finite.all():
                index = tuple(int(i) for i in np.argwhere(~finite)[0])
                bad = "NaN" if np.isnan(value[index]) else "Inf"
                raise NanInfError(f"feed '{name}' contains {bad} at index {list(index)}")


def _first_reader(plan: BlockPlan | Block, name: str) -> str:
    for i, op in enumerate(plan.ops):
        if name in op.input_names():
            where = f"op '{op.type}' (#{i})"
            return where + (f" built at {op.source}" if op.source else "")
    return _NO_READER


_NO_READER = "the program"


def _missing_feed_message(plan: BlockPlan, name: str) -> str:
    return f"variable '{name}' must be fed: it is read by {_first_reader(plan, name)}"


__all__ = [
    "Executor",
    "NestflowError",
    "check_feed",
    "checked_feed",
    "feed_mapping",
    "global_scope",
]
