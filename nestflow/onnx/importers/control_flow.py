"""Mappers of ONNX's control flow: If onto nf.layers.cond (each branch a sub-block run by a
conditional_block op; a condition known at import imports the taken branch inline) and Loop
onto nf.While (the trip count and condition carried as [1] variables, scan outputs collected
in tensor arrays)."""

from __future__ import annotations

from nestflow import layers
from nestflow.onnx.importers.registry import Node, mapper

# A Loop whose trip count is not a constant (fed, or absent: a while loop) stops after this
# many steps with MaxStepsExceededError: a model whose condition never turns false (ONNX
# Runtime runs it forever) must not hang the program that imported it.
MAX_LOOP_STEPS = 100_000


def _as_vector(node: Node, name: str) -> str:
    """`name` (one element, any rank) as a [1] variable (a constant one too: the loop's trip
    count and condition must be variables the While reads)."""
    return node.graph.var(node.op("reshape", {"X": name}, {"shape": [1]}))


@mapper("If")
def if_(node: Node) -> None:
    graph = node.graph
    branches = node.attr("then_branch"), node.attr("else_branch")
    known = node.const(0)
    if known is not None:  # the condition is a constant: the taken branch, inline
        outs = graph.import_subgraph(branches[0 if bool(known.reshape(-1)[0]) else 1], [])
        for k, name in enumerate(outs):
            node.set_output(k, name)
        return
    pred = graph.block.find_var(_as_vector(node, node.input(0)))

    def branch(subgraph):
        def build():
            names = graph.import_subgraph(subgraph, [])
            return [graph.block.find_var(n) for n in names]

        return build

    merged = layers.cond(pred, branch(branches[0]), branch(branches[1]))
    for k, var in enumerate(merged or []):
        node.set_output(k, var.name)


@mapper("Loop")
def loop(node: Node) -> None:
    graph = node.graph
    body = node.attr("body")
    parent = graph.block
    find = parent.find_var
    carried_count = node.num_inputs - 2
    # the trip count, the loop condition and the carried values: variables of the loop's
    # own, which the body updates in place
    step = layers.assign(layers.fill_constant([1], "int64", 0.0))
    limit = find(_as_vector(node, node.input(0))) if node.has_input(0) else None
    if node.has_input(1):
        going = layers.assign(find(_as_vector(node, node.input(1))))
    else:
        going = layers.fill_constant([1], "bool", 1.0)
    keep = (
        layers.logical_and(going, layers.less_than(step, limit)) if limit else layers.assign(going)
    )
    carried = [layers.assign(find(node.input(k))) for k in range(2, node.num_inputs)]
    arrays = []
    bounded = node.const(0) is not None  # the trip count ends the loop
    with layers.While(keep, max_steps=None if bounded else MAX_LOOP_STEPS).block():
        here = graph.block.find_var
        iteration = node.op("reshape", {"X": step.name}, {"shape": []})
        condition = node.op("reshape", {"X": going.name}, {"shape": []})
        outs = graph.import_subgraph(body, [iteration, condition, *(v.name for v in carried)])
        # a body output may be a loop variable itself (an Identity of its old value): copy
        # those before any loop variable is written
        own = {step.name, going.name, *(v.name for v in carried)}
        outs = [layers.assign(here(n)).name if n in own else n for n in outs]
        for name in outs[1 + carried_count :]:  # scan outputs: one array element per step
            value = here(name)
            array = parent.create_var(
                graph.fresh(f"{node.base}.scan"), dtype=value.dtype, type="tensor_array"
            )
            parent.append_op("create_array", outputs={"Out": [array]}, attrs={"dtype": value.dtype})
            layers.array_write(value, step, array)
            arrays.append(array)
        for name, var in zip(outs[1 : 1 + carried_count], carried):
            layers.assign(here(name), output=var)
        layers.increment(step)
        layers.assign(here(_as_vector(node, outs[0])), output=going)
        if limit is not None:
            layers.logical_and(going, layers.less_than(step, limit), out=keep)
        else:
            layers.assign(going, output=keep)
    for k, var in enumerate(carried):
        node.set_output(k, var.name)
    for k, array in enumerate(arrays):
        node.set_output(carried_count + k, layers.array_to_tensor(array, axis=0).name)
