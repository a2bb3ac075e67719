"""Pictures of programs: a Program as Graphviz DOT text, each sub-block drawn as a cluster nested
inside the cluster of the control-flow op that runs it.

Operators are boxes, variables ellipses; parameters are filled boxes and other persistable
variables (running statistics, optimizer state) grey ellipses, so what a model learns stands
out from what flows through it. A variable is drawn once, in the block that declares it; an op
of a sub-block reading an outer variable gets an edge from that outer node, which is how step
inputs and memories cross into a step block in the picture.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from nestflow.errors import FileWriteError, NestflowError
from nestflow.framework.program import Block, OpDesc, Program, VarDesc

_PARAMETER = 'shape=box, style="filled,rounded", fillcolor="#f6d186"'
_PERSISTABLE = 'shape=ellipse, style=filled, fillcolor="#dddddd"'
_VARIABLE = "shape=ellipse"
_OP = 'shape=box, style=filled, fillcolor="#cfe3f7"'


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _var_node(var: VarDesc) -> str:
    return _quote(f"var:{var.block.idx}:{var.name}")


def _op_node(op: OpDesc, block: Block, index: int) -> str:
    return _quote(f"op:{block.idx}:{index}")


def _var_style(var: VarDesc) -> str:
    if var.is_parameter:
        return _PARAMETER
    return _PERSISTABLE if var.persistable else _VARIABLE


def _var_label(var: VarDesc) -> str:
    if var.type != "lod_tensor":
        return f"{var.name}\n({var.type})"
    shape = ", ".join("?" if d < 0 else str(d) for d in var.shape)
    return f"{var.name}\n{var.dtype}[{shape}]"


def to_dot(program: Program, name: str = "program") -> str:
    """The DOT text of `program`: one cluster per block, nested under the op running it.

    >>> import nestflow as nf
    >>> main = nf.Program()
    >>> with nf.program_guard(main, nf.Program()):
    ...     y = nf.layers.fc(nf.data("x", [-1, 3]), size=2)
    >>> "digraph" in main.to_dot() and "fc_0.w" in main.to_dot()
    True
    """
    lines = [
        f"digraph {_quote(name)} {{",
        "  compound=true;",
        "  rankdir=TB;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    edges: list[str] = []
    _block_cluster(program, program.global_block(), lines, edges, "  ", set())
    lines.extend(edges)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _block_cluster(
    program: Program, block: Block, lines: list[str], edges: list[str], pad: str, seen: set[int]
) -> None:
    # A walk over sub-blocks from a file must not loop (a malformed program may name its own
    # block); such a reference is drawn as an edge to nothing rather than followed.
    seen.add(block.idx)
    title = "block 0 (global)" if block.idx == 0 else f"block {block.idx}"
    lines.append(f"{pad}subgraph {_quote(f'cluster_block_{block.idx}')} {{")
    lines.append(f"{pad}  label={_quote(title)};")
    lines.append(f'{pad}  style="rounded,dashed";')
    for var in block.vars.values():
        lines.append(
            f"{pad}  {_var_node(var)} [label={_quote(_var_label(var))}, {_var_style(var)}];"
        )
    for index, op in enumerate(block.ops):
        node = _op_node(op, block, index)
        subs = [b for b in op.sub_blocks() if b.idx not in seen]
        inner = pad + "  "
        if subs:
            lines.append(f"{inner}subgraph {_quote(f'cluster_op_{block.idx}_{index}')} {{")
            lines.append(f"{inner}  label={_quote(f'{op.type} #{index}')};")
            lines.append(f'{inner}  style=filled; fillcolor="#f3f3f3";')
            lines.append(f"{inner}  {node} [label={_quote(f'{op.type} #{index}')}, {_OP}];")
            for sub in subs:
                _block_cluster(program, sub, lines, edges, inner + "  ", seen)
            lines.append(f"{inner}}}")
        else:
            lines.append(f"{inner}{node} [label={_quote(f'{op.type} #{index}')}, {_OP}];")
        for slot, names in op.inputs.items():
            for var_name in names:
                var = block.find_var(var_name) if var_name else None
                if var is not None:
                    edges.append(f"  {_var_node(var)} -> {node} [label={_quote(slot)}];")
        for slot, names in op.outputs.items():
            for var_name in names:
                var = block.find_var(var_name) if var_name else None
                if var is not None:
                    edges.append(f"  {node} -> {_var_node(var)} [label={_quote(slot)}];")
    lines.append(f"{pad}}}")


def render(dot_text: str, path: str | Path, fmt: str | None = None) -> Path:
    """Render DOT text to `path` with Graphviz's `dot` (format from the suffix: svg, png, pdf);
    a `.dot` or `.gv` path gets the text itself. NestflowError if `dot` is not installed (the
    DOT text is always available from `Program.to_dot()`)."""
    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower() or "svg"
    if fmt in ("dot", "gv"):
        _write(path, dot_text.encode())
        return path
    exe = shutil.which("dot")
    if exe is None:
        raise NestflowError(
            f"cannot render {path}: Graphviz's 'dot' is not installed (apt-get install graphviz); "
            "write a .dot file instead, or use Program.to_dot() for the text"
        )
    done = subprocess.run(
        [exe, f"-T{fmt}"], input=dot_text.encode(), capture_output=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise NestflowError(f"dot -T{fmt} failed: {done.stderr.decode(errors='replace').strip()}")
    _write(path, done.stdout)
    return path


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise FileWriteError(f"cannot write {path}: {exc}") from None
