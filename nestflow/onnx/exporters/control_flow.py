"""ONNX mappers of the control-flow ops (nestflow.ops.ifelse, recurrent, while_loop, block,
conditional_block) and of tensor arrays (ONNX sequences).

- `ifelse` (per row): the rows of each branch are gathered (NonZero + Gather), both branches'
  ops are inlined on their rows, and each output's rows are scattered back into the original
  order (ScatterND). No subgraph: a branch that gets no rows runs on zero rows.
- `recurrent`: a Loop over the time steps (trip count = the time dim); its body slices each
  step input at the step (Gather on axis 1), runs the step, and with per-row lengths keeps a
  finished row's memory (Where) and zeroes its output; outputs are the Loop's scan outputs,
  transposed to [batch, time, ...].
- `while`: a Loop whose carried values are the while's carried variables (tensor arrays as
  sequences) and whose condition is the body's new value of the condition variable.
- `conditional_block`: an If whose else branch gives empty placeholders (the op "holds
  nothing" then); `select_input` picks a value by an If per branch, `select_output` by Where.
- `block`: its ops inlined.
"""

from __future__ import annotations

from collections.abc import Sequence

from nestflow.onnx.exporters.graph import (
    INT64_MIN,
    Emitter,
    Env,
    Graph,
    OpContext,
    Value,
    exports,
    onnx_dtype,
)


def _subgraph(ctx: Emitter, what: str) -> Emitter:
    """An emitter writing into a new, empty subgraph whose Env sees the current one."""
    graph = Graph(ctx.model.names.fresh(f"{ctx.base}/{what}"))
    return ctx.child(graph, Env(parent=ctx.env))


def _graph_input(
    em: Emitter, base: str, dtype: str, sequence: bool = False, rank: int | None = None
) -> str:
    """A new input of the subgraph: a tensor of `rank` (None: any) or a sequence."""
    name = em.model.names.fresh(base)
    em.graph.inputs.append(Value(name, dtype, sequence).value_info(rank=rank))
    return name


def _set_graph_outputs(em: Emitter, values: Sequence[Value]) -> None:
    """The subgraph's outputs, each made inside it (an Identity for a value the graph only
    passes on: an input or an outer value) and each under its own name."""
    made = {out for node in em.graph.nodes for out in node.output}
    seen: set[str] = set()
    for value in values:
        name = value.name
        if name not in made or name in seen:
            name = em.node("Identity", [name])
        seen.add(name)
        em.graph.outputs.append(Value(name, value.dtype, value.sequence).value_info())


# ---- block, rnn_memory_boot ----


@exports("block")
def block(ctx: OpContext) -> None:
    env = Env(parent=ctx.env)
    ctx.model.convert_block(ctx.attrs["sub_block"], ctx.graph, env)
    inner = ctx.child(ctx.graph, env)
    for i, name in enumerate(ctx.attrs["outs"]):
        ctx.set_output("Out", inner.lookup(name, ctx.op).name, i)


@exports("rnn_memory_boot")
def rnn_memory_boot(ctx: OpContext) -> None:
    a = ctx.attrs
    shape = ctx.node("Concat", [ctx.dim(ctx.input("Ref"), 0), ctx.ints(a["shape"])], axis=0)
    ctx.set_output("Out", ctx.fill(shape, a["value"], a["dtype"]))


# ---- ifelse ----


@exports("ifelse")
def ifelse(ctx: OpContext) -> None:
    a = ctx.attrs
    mask = ctx.reshape(ctx.input("Cond"), [-1])
    true_rows = ctx.reshape(ctx.node("NonZero", [mask]), [-1])
    false_rows = ctx.reshape(ctx.node("NonZero", [ctx.node("Not", [mask])]), [-1])
    results = []
    for side, rows in (("true", true_rows), ("false", false_rows)):
        env = Env(parent=ctx.env)
        branch = ctx.child(ctx.graph, env)
        for name in ctx.op.input("X"):
            value = ctx.lookup(name, ctx.op)
            branch.bind(name, ctx.node("Gather", [value.name, rows], axis=0), value.dtype)
        ctx.model.convert_block(a[f"{side}_block"], ctx.graph, env)
        results.append([branch.lookup(name, ctx.op) for name in a[f"{side}_outs"]])
    # row j of (true rows, then false rows) goes back to row order[j]
    order = ctx.unsqueeze(ctx.node("Concat", [true_rows, false_rows], axis=0), [-1])
    for i, (true_part, false_part) in enumerate(zip(*results)):
        rows = ctx.node("Concat", [true_part.name, false_part.name], axis=0)
        ctx.set_output("Out", ctx.node("ScatterND", [rows, order, rows]), i)


# ---- recurrent ----


def _rows_mask(em: Emitter, active: str, rank: int) -> str:
    """active [batch] shaped to broadcast against a value of `rank`."""
    return em.unsqueeze(active, list(range(1, rank))) if rank > 1 else active


@exports("recurrent")
def recurrent(ctx: OpContext) -> None:
    a = ctx.attrs
    memories, outs = a["memories"], a["step_outputs"]
    in_names = ctx.op.input("Inputs")
    if not in_names:
        raise ctx.unsupported("the step reads no sequence (no step input)")
    sequences = [ctx.lookup(name, ctx.op) for name in in_names]
    steps = ctx.to_scalar(ctx.dim(sequences[0].name, 1))
    boots = []
    for i, boot_name in enumerate(ctx.op.input("Boots")):
        boot = ctx.lookup(boot_name, ctx.op)
        if ctx.in_var("Boots", i).ndim == 0:  # a 0-d initial value is one row
            boot = Value(ctx.reshape(boot.name, [1]), boot.dtype)
        boots.append(boot)
    body, ranks = _step_body(ctx, in_names, sequences, boots)
    results = ctx.node(
        "Loop",
        [steps, "", *(b.name for b in boots)],
        outputs=len(memories) + len(outs),
        body=body.graph.to_proto(),
    )
    results = [results] if isinstance(results, str) else results
    for i in range(len(memories)):
        ctx.set_output("FinalMemories", results[i], i)
    batch = ctx.dim(sequences[0].name, 0)
    for i, (name, rank) in enumerate(zip(outs, ranks)):
        stacked = results[len(memories) + i]
        ctx.set_output("Outputs", _batch_major(ctx, stacked, name, rank, steps, batch), i)


def _step_body(ctx: OpContext, in_names, sequences, boots) -> tuple[Emitter, list[int]]:
    """The Loop body of a recurrent op: (step, cond, memories...) -> (cond, new memories...,
    step outputs...), rows past their length keeping their memory and giving zeros. Returns
    it with the rank of each step output."""
    a = ctx.attrs
    step_block = a["sub_block"]
    body = _subgraph(ctx, "step")
    step = _graph_input(body, "step", "int64", rank=0)
    cond_in = _graph_input(body, "cond", "bool", rank=0)
    olds = []
    for name, boot, boot_name in zip(a["memories"], boots, ctx.op.input("Boots")):
        rank = max(ctx.var(boot_name).ndim, 1)  # (a 0-d boot was made one row)
        olds.append(body.bind(name, _graph_input(body, name, boot.dtype, rank=rank), boot.dtype))
    for name, seq in zip(in_names, sequences):
        body.bind(name, body.node("Gather", [seq.name, step], axis=1), seq.dtype)
    ctx.model.convert_block(step_block, body.graph, body.env)

    lengths = ctx.input("Lengths")
    if lengths is not None and ctx.in_var("Lengths").dtype != "int64":
        lengths = ctx.cast(lengths, "int64")
    active = body.node("Less", [step, lengths]) if lengths is not None else None

    def masked(value: Value, rank: int, otherwise: str) -> Value:
        if active is None:
            return value
        rows = _rows_mask(body, active, rank)
        return Value(body.node("Where", [rows, value.name, otherwise]), value.dtype)

    news = []
    for name, update, old in zip(a["memories"], a["updates"], olds):
        rank = max(step_block.find_var(name).ndim, 1)
        news.append(masked(body.lookup(update, ctx.op), rank, old.name))
    scans, ranks = [], []
    for name in a["step_outputs"]:
        value = body.lookup(name, ctx.op)
        rank = step_block.find_var(name).ndim
        if rank == 0:  # a 0-d step value is one row
            value, rank = Value(body.reshape(value.name, [1]), value.dtype), 1
        scans.append(masked(value, rank, body.scalar(0, value.dtype)))
        ranks.append(rank)
    cond_out = Value(body.node("Identity", [cond_in]), "bool")
    _set_graph_outputs(body, [cond_out, *news, *scans])
    return body, ranks


def _batch_major(ctx: OpContext, stacked: str, name: str, rank: int, steps: str, batch: str):
    """A scan output [time, batch, ...] as [batch, time, ...]. A Loop that ran no step gives
    a [0] scan output: it is shaped [0, batch, ...] first (a no-op otherwise) when the step
    output's row shape is known, as nestflow then gives."""
    tail = ctx.attrs["sub_block"].find_var(name).shape[1:]
    if len(tail) == rank - 1 and all(d >= 0 for d in tail):
        parts = [ctx.reshape(steps, [1]), batch] + ([ctx.ints(tail)] if tail else [])
        stacked = ctx.reshape(stacked, ctx.node("Concat", parts, axis=0))
    return ctx.node("Transpose", [stacked], perm=[1, 0, *range(2, rank + 1)])


# ---- while ----


@exports("while")
def while_(ctx: OpContext) -> None:
    a = ctx.attrs
    carried, inner = a["carried"], a["carried_inner"]
    cond_name = ctx.op.input("Condition")[0]
    initial = [ctx.lookup(name, ctx.op) for name in carried]
    first_cond = ctx.to_scalar(ctx.input("Condition"))
    # nestflow raises past max_steps; the exported loop stops there
    trip_count = ctx.scalar(a["max_steps"], "int64") if a["max_steps"] >= 0 else ""

    body = _subgraph(ctx, "body")
    _graph_input(body, "iteration", "int64", rank=0)
    cond_in = _graph_input(body, "cond", "bool", rank=0)
    for name, value in zip(carried, initial):
        var = ctx.var(name)
        rank = None if value.sequence else var.ndim
        carried_input = _graph_input(body, name, value.dtype, value.sequence, rank)
        body.bind(name, carried_input, value.dtype, value.sequence)

    ctx.model.convert_block(a["sub_block"], body.graph, body.env)
    finals = [body.lookup(name, ctx.op) for name in inner]
    if cond_name in carried:
        cond_value = finals[carried.index(cond_name)]
        cond_out = Value(body.to_scalar(cond_value.name), "bool")
    else:
        cond_out = Value(body.node("Identity", [cond_in]), "bool")
    _set_graph_outputs(body, [cond_out, *finals])

    results = ctx.node(
        "Loop",
        [trip_count, first_cond, *(v.name for v in initial)],
        outputs=len(carried),
        body=body.graph.to_proto(),
    )
    results = [results] if isinstance(results, str) else results
    for i, name in enumerate(results):
        ctx.set_output("Out", name, i)


# ---- conditional_block, select_input, select_output ----


def _condition(ctx: OpContext) -> str:
    """The scalar bool an If runs on: the one Cond value, or (Fluid's other mode) whether
    every Cond tensor has elements."""
    conds = ctx.inputs("Cond")
    if ctx.attrs["is_scalar_condition"]:
        return ctx.to_scalar(conds[0])
    zero = ctx.scalar(0, "int64")
    holds = [ctx.node("Greater", [ctx.node("Size", [c]), zero]) for c in conds]
    result = holds[0]
    for other in holds[1:]:
        result = ctx.node("And", [result, other])
    return result


@exports("conditional_block")
def conditional_block(ctx: OpContext) -> None:
    then = _subgraph(ctx, "then")
    ctx.model.convert_block(ctx.attrs["sub_block"], then.graph, then.env)
    values = [then.lookup(name, ctx.op) for name in ctx.attrs["outs"]]
    _set_graph_outputs(then, values)
    otherwise = _subgraph(ctx, "else")
    placeholders = []
    for name, value in zip(ctx.attrs["outs"], values):
        if value.sequence:
            raise ctx.unsupported(f"a tensor array ('{name}') as an output of the block")
        rank = ctx.attrs["sub_block"].find_var(name).ndim
        empty = otherwise.fill(otherwise.ints([0] * rank), 0, value.dtype)
        placeholders.append(Value(empty, value.dtype))
    _set_graph_outputs(otherwise, placeholders)
    results = (
        ctx.node(
            "If",
            [_condition(ctx)],
            outputs=len(values),
            then_branch=then.graph.to_proto(),
            else_branch=otherwise.graph.to_proto(),
        )
        if values
        else []
    )
    results = [results] if isinstance(results, str) else results
    for i, name in enumerate(results):
        ctx.set_output("Out", name, i)


def _pick(ctx: OpContext, index: str, first: Value, second: Value) -> str:
    """If(index holds: first, else: second)."""
    branches = []
    for value in (first, second):
        em = _subgraph(ctx, "pick")
        _set_graph_outputs(em, [value])
        branches.append(em.graph.to_proto())
    return ctx.node("If", [index], then_branch=branches[0], else_branch=branches[1])


@exports("select_input")
def select_input(ctx: OpContext) -> None:
    mask = ctx.to_scalar(ctx.input("Mask"))
    dtype = ctx.in_var("Mask").dtype
    values = [ctx.lookup(name, ctx.op) for name in ctx.op.input("X")]
    out = values[-1]
    for k in range(len(values) - 2, -1, -1):
        hit = ctx.node("Equal", [mask, ctx.scalar(k, dtype)])
        out = Value(_pick(ctx, hit, values[k], out), out.dtype)
    ctx.set_output("Out", ctx.node("Identity", [out.name]) if len(values) == 1 else out.name)


@exports("select_output")
def select_output(ctx: OpContext) -> None:
    x, dtype = ctx.input("X"), ctx.in_var("X").dtype
    mask = ctx.to_scalar(ctx.input("Mask"))
    zero = ctx.scalar(0, dtype)
    for k in range(len(ctx.op.output("Out"))):
        hit = ctx.node("Equal", [mask, ctx.scalar(k, ctx.in_var("Mask").dtype)])
        ctx.set_output("Out", ctx.node("Where", [hit, x, zero]), k)


# ---- tensor arrays (ONNX sequences) ----


def _position(ctx: OpContext) -> str:
    """I as an int64 scalar."""
    i = ctx.to_scalar(ctx.input("I"))
    return i if ctx.in_var("I").dtype == "int64" else ctx.cast(i, "int64")


@exports("create_array")
def create_array(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("SequenceEmpty", [], dtype=onnx_dtype(ctx.attrs["dtype"])))


@exports("array_write")
def array_write(ctx: OpContext) -> None:
    """Element I replaced by X when the array has one (SequenceErase + SequenceInsert),
    else X appended: writing past the end (leaving holes) has no ONNX counterpart."""
    x, dtype = ctx.input("X"), ctx.in_var("X").dtype
    if ctx.has_input("Array"):
        array = ctx.input("Array")
    else:
        array = ctx.node("SequenceEmpty", [], dtype=onnx_dtype(dtype))
    pos = _position(ctx)
    inside = ctx.node("Less", [pos, ctx.node("SequenceLength", [array])])
    replace = _subgraph(ctx, "replace")
    erased = replace.node("SequenceErase", [array, pos])
    replaced = replace.node("SequenceInsert", [erased, x, pos])
    _set_graph_outputs(replace, [Value(replaced, dtype, True)])
    append = _subgraph(ctx, "append")
    _set_graph_outputs(append, [Value(append.node("SequenceInsert", [array, x]), dtype, True)])
    out = ctx.node(
        "If", [inside], then_branch=replace.graph.to_proto(), else_branch=append.graph.to_proto()
    )
    ctx.set_output("Out", out)


@exports("array_read")
def array_read(ctx: OpContext) -> None:
    ctx.set_output("Out", ctx.node("SequenceAt", [ctx.input("Array"), _position(ctx)]))


@exports("array_length")
def array_length(ctx: OpContext) -> None:
    length = ctx.node("SequenceLength", [ctx.input("Array")])
    ctx.set_output("Out", ctx.reshape(length, [1]))


@exports("array_to_tensor")
def array_to_tensor(ctx: OpContext) -> None:
    out = ctx.node("ConcatFromSequence", [ctx.input("Array")], axis=ctx.attrs["axis"], new_axis=1)
    ctx.set_output("Out", out)


# ---- gather_tree (beam search backtracking) ----


@exports("gather_tree")
def gather_tree(ctx: OpContext) -> None:
    """A Loop over the steps from the last: out[t] = Ids[t] at each final beam's ancestor at
    step t, which moves to its parent (Parents[t]) for the step before."""
    ids, parents = ctx.input("Ids"), ctx.input("Parents")
    dtype = ctx.in_var("Ids").dtype
    steps = ctx.to_scalar(ctx.dim(ids, 0))
    beam = ctx.to_scalar(ctx.dim(ids, 2))
    start = ctx.node("Range", [ctx.scalar(0, "int64"), beam, ctx.scalar(1, "int64")])
    start = ctx.node("Expand", [ctx.cast(start, dtype), ctx.shape(ids, 1, 3)])

    body = _subgraph(ctx, "backtrack")
    step = _graph_input(body, "step", "int64", rank=0)
    cond_in = _graph_input(body, "cond", "bool", rank=0)
    beams = _graph_input(body, "beams", dtype)
    t = body.node("Sub", [body.node("Sub", [steps, step]), body.scalar(1, "int64")])
    picked = body.node("GatherElements", [body.node("Gather", [ids, t], axis=0), beams], axis=1)
    parent = body.node("GatherElements", [body.node("Gather", [parents, t], axis=0), beams], axis=1)
    cond_out = body.node("Identity", [cond_in])
    _set_graph_outputs(body, [Value(cond_out, "bool"), Value(parent, dtype), Value(picked, dtype)])
    _, backwards = ctx.node("Loop", [steps, "", start], outputs=2, body=body.graph.to_proto())
    # last step first, as a [steps, batch, beam] tensor (also when no step ran)
    backwards = ctx.reshape(backwards, ctx.shape(ids))
    ends = ctx.ints([INT64_MIN])
    forwards = ctx.node("Slice", [backwards, ctx.ints([-1]), ends, ctx.ints([0]), ctx.ints([-1])])
    ctx.set_output("Out", forwards)
