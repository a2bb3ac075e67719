"""Prune: the minimal program computing some targets (seed 002's `Prune(desc, targets)`).

An op is kept when it writes a variable that is needed; its inputs then become needed. The walk
goes backwards over each block, so in-place writers (an optimizer's ParamOut is the parameter
itself) pull in everything that computed their inputs. An op owning sub-blocks counts what its
sub-blocks read from outer blocks as its inputs and what they write to outer blocks as its
outputs; its sub-blocks are pruned in turn to what they export. A control-flow op first loses
the outputs nothing needs (with what makes them in its sub-blocks), so a branch or step computes
only what is used.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from nestflow.errors import NestflowError, TypeMismatchError
from nestflow.framework.program import Block, OpDesc, Program, VarDesc
from nestflow.ops.registry import get_op_def, has_op


def prune(program: Program, targets: Sequence[VarDesc | str] | VarDesc | str) -> Program:
    """A new program holding only the ops (in their original order) and the variables that
    computing `targets` needs; `program` is not changed.

    Raises NestflowError when a target is not a variable of the program's global block,
    TypeMismatchError when `program` is not a Program or a target not a variable or name.

    >>> x = nf.data("x", shape=[-1, 2], dtype="float32")
    >>> a = nf.layers.scale(x, scale=2.0)
    >>> b = nf.layers.exp(x)
    >>> small = nf.prune(nf.default_main_program(), [a])
    >>> [op.type for op in small.global_block().ops]
    ['scale']
    >>> len(nf.default_main_program().global_block().ops)  # unchanged
    2
    """
    if not isinstance(program, Program):
        raise TypeMismatchError(f"prune expects a nestflow Program, got {type(program).__name__}")
    names = target_names(targets)
    small = Program.from_desc(program.to_desc())
    glob = small.global_block()
    for name in names:
        if glob.find_var(name) is None:
            raise NestflowError(
                f"prune target '{name}' is not a variable of the program's global block"
            )
    exports = _block_exports(small)
    kept_blocks: set[int] = set()
    # Each block's walk hands back the sub-blocks of the ops it keeps, to be pruned right away
    # (before it goes on): what a recursion would do, at any nesting depth.
    accesses: _Accesses = {}
    walks = [_prune_block(glob, set(names), exports, kept_blocks, accesses)]
    while walks:
        sub = next(walks[-1], None)
        if sub is None:
            walks.pop()
        elif sub.idx not in kept_blocks:
            needed = set(exports[sub.idx])
            walks.append(_prune_block(sub, needed, exports, kept_blocks, accesses))
    for block in small.blocks:
        if block.idx not in kept_blocks:
            # Block indices are referenced by attrs, so an unreachable block stays as an empty
            # placeholder rather than being removed.
            block.ops.clear()
            block.vars.clear()
    _drop_unused_vars(small, kept_blocks, names)
    small._bump()
    return small


def target_names(targets: Sequence[VarDesc | str] | VarDesc | str) -> list[str]:
    """The names of `targets` (a variable, a name, or a sequence of them); TypeMismatchError
    for anything else."""
    if isinstance(targets, (VarDesc, str)):
        targets = [targets]
    if not isinstance(targets, (list, tuple)):
        raise TypeMismatchError(
            f"targets must be a variable, a name or a list of them, got "
            f"{type(targets).__name__} ({targets!r})"
        )
    names = []
    for target in targets:
        if not isinstance(target, (VarDesc, str)):
            raise TypeMismatchError(
                f"a target must be a variable or a name, got {type(target).__name__} ({target!r})"
            )
        names.append(target.name if isinstance(target, VarDesc) else target)
    return names


_cache: weakref.WeakKeyDictionary[Program, tuple[int, dict[tuple[str, ...], Program]]] = (
    weakref.WeakKeyDictionary()
)


def prune_cached(program: Program, targets: Sequence[VarDesc | str] | VarDesc | str) -> Program:
    """`prune`, remembered per (program, program.version, target names); an edit to the program
    invalidates its entries. Callers must not edit the returned program."""
    key = tuple(target_names(targets))
    version, entries = _cache.get(program, (-1, {}))
    if version != program.version:
        entries = {}
        _cache[program] = (program.version, entries)
    small = entries.get(key)
    if small is None:
        small = entries[key] = prune(program, list(key))
    return small


# block idx -> the names the block (with the blocks nested in it) reads and writes from outside
_Accesses = dict[int, tuple[set[str], set[str]]]


def _prune_block(
    block: Block,
    needed: set[str],
    exports: dict[int, set[str]],
    kept_blocks: set[int],
    accesses: _Accesses,
) -> Iterator[Block]:
    """Keep the ops of `block` that compute `needed`; yields the sub-blocks of each kept op,
    which the caller prunes before resuming the walk. `accesses` remembers _outer_accesses
    of blocks not pruned yet (an entry goes when its block changes)."""
    kept_blocks.add(block.idx)
    keep: list[OpDesc] = []
    for op in reversed(block.ops):
        reads, writes = _op_reads_writes(op, accesses)
        if not (writes & needed):
            continue
        if _drop_unneeded_outputs(op, needed):
            accesses.pop(block.idx, None)
            fresh = _block_exports(block.program)  # its sub-blocks now export less
            for sub in op.sub_blocks():
                exports[sub.idx] = fresh[sub.idx]
            reads, writes = _op_reads_writes(op, accesses)
        keep.append(op)
        # Ops that read what they write (in-place updates) still need the earlier writer.
        needed -= writes - reads
        needed |= reads
        yield from op.sub_blocks()
    keep.reverse()
    block.ops[:] = keep
    accesses.pop(block.idx, None)


def _drop_unneeded_outputs(op: OpDesc, needed: set[str]) -> bool:
    """Remove the outputs of a control-flow op that nothing needs, with their entries in the
    attrs that list what each output is made from (OpDef.output_attrs); True if any went."""
    if not has_op(op.type):
        return False
    changed = False
    for slot, attr_names in get_op_def(op.type).output_attrs.items():
        names = op.outputs.get(slot, [])
        kept = [i for i, name in enumerate(names) if name in needed]
        if len(kept) == len(names):
            continue
        op.outputs[slot] = [names[i] for i in kept]
        for attr in attr_names:
            values = op.attrs[attr]
            op.attrs[attr] = [values[i] for i in kept]
        changed = True
    return changed


def _op_reads_writes(op: OpDesc, accesses: _Accesses | None = None) -> tuple[set[str], set[str]]:
    """Names `op` reads and writes in its own block, counting its sub-blocks' outer accesses."""
    reads = {n for n in op.input_names() if n}
    writes = {n for n in op.output_names() if n}
    accesses = {} if accesses is None else accesses
    for sub in op.sub_blocks():
        sub_reads, sub_writes = _outer_accesses(sub, accesses)
        reads |= sub_reads
        writes |= sub_writes
    return reads, writes


def _outer_accesses(block: Block, accesses: _Accesses) -> tuple[set[str], set[str]]:
    """Names `block` (and blocks nested in it) reads and writes that it does not declare.

    Innermost blocks first (a sub-block has a higher index than the block running it), each
    from its ops' slots and its sub-blocks' outer accesses: no recursion, at any depth. Blocks
    in `accesses` are taken from there; the others are added to it."""
    nested: dict[int, Block] = {}
    pending = [block]
    while pending:
        one = pending.pop()
        if one.idx not in nested and one.idx not in accesses:
            nested[one.idx] = one
            pending.extend(sub for op in one.ops for sub in op.sub_blocks())
    for idx in sorted(nested, reverse=True):
        one = nested[idx]
        reads: set[str] = set()
        writes: set[str] = set()
        for op in one.ops:
            reads.update(n for n in op.input_names() if n)
            writes.update(n for n in op.output_names() if n)
            for sub in op.sub_blocks():
                sub_reads, sub_writes = accesses.get(sub.idx, (set(), set()))
                reads |= sub_reads
                writes |= sub_writes
        local = set(one.vars)
        accesses[idx] = (reads - local, writes - local)
    return accesses[block.idx]


def _block_exports(program: Program) -> dict[int, set[str]]:
    """Per block, the names its pruning must keep computing: what it writes that its owner op
    names (slots or string attrs), that outer blocks see, or that any other block reads (a
    gradient block reading a forward block's values from the kept step scopes)."""
    owner: dict[int, OpDesc] = {}
    reads_in: dict[int, set[str]] = {}
    for block in program.blocks:
        reads_in[block.idx] = {n for op in block.ops for n in op.input_names() if n}
        for op in block.ops:
            for sub in op.sub_blocks():
                owner.setdefault(sub.idx, op)
    readers = Counter(n for reads in reads_in.values() for n in reads)  # blocks reading each
    exports: dict[int, set[str]] = {}
    for block in program.blocks:
        written = {n for op in block.ops for n in op.output_names() if n}
        wanted = written - set(block.vars)
        op = owner.get(block.idx)
        if op is not None:
            wanted |= written & _mentioned_names(op)
        own = reads_in[block.idx]
        wanted.update(n for n in written if readers[n] > (n in own))
        exports[block.idx] = wanted
    return exports


def _mentioned_names(op: OpDesc) -> set[str]:
    names = set(op.input_names()) | set(op.output_names())
    for value in op.attrs.values():
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            names.update(value)
    return names


def _drop_unused_vars(program: Program, kept_blocks: Iterable[int], targets: list[str]) -> None:
    used: set[str] = set(targets)
    for idx in kept_blocks:
        for op in program.block(idx).ops:
            used |= _mentioned_names(op)
    for idx in kept_blocks:
        block = program.block(idx)
        for var in block.vars.values():
            if var.name in used and var.lengths_var:
                used.add(var.lengths_var)
    for idx in kept_blocks:
        block = program.block(idx)
        for name in [n for n in block.vars if n not in used]:
            del block.vars[name]


__all__ = ["prune", "prune_cached", "target_names"]
