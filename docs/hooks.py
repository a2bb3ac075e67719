"""MkDocs hook: fills the operator reference from the registry at build time, so the page lists
exactly the ops this checkout registers (slots, attrs with defaults, gradient, doc)."""

from __future__ import annotations

MARKER = "<!-- registered-ops -->"


def _slot(slot) -> str:
    return slot.name + ("*" if slot.duplicable else "?" if slot.optional else "")


def _attr(spec) -> str:
    return f"`{spec.name}` (required)" if spec.required else f"`{spec.name}={spec.default!r}`"


def ops_markdown() -> str:
    """The operator table: one section per registered forward op, in name order."""
    import nestflow  # noqa: F401  (registers every op)
    from nestflow.ops.registry import registered_ops

    ops = registered_ops()
    lines = [
        f"{sum(1 for d in ops.values() if d.forward_type is None)} operators are registered.",
        "",
    ]
    for name in sorted(ops):
        d = ops[name]
        if d.forward_type is not None:
            continue  # gradient ops are listed with their forward op
        lines.append(f"### `{name}`")
        lines.append("")
        ins = ", ".join(_slot(s) for s in d.inputs) or "none"
        outs = ", ".join(_slot(s) for s in d.outputs) or "none"
        lines.append(f"- inputs: {ins}; outputs: {outs}")
        if d.attrs:
            lines.append("- attrs: " + ", ".join(_attr(a) for a in d.attrs.values()))
        grad = f"`{name}_grad`" if f"{name}_grad" in ops else ("yes" if d.has_gradient else "none")
        lines.append(f"- gradient: {grad}")
        if d.inplace:
            lines.append("- in place: " + ", ".join(f"{o} into {i}" for o, i in d.inplace.items()))
        lines.append("")
        if d.doc:
            lines.append(d.doc.replace("\n#", "\n\\#").replace("][", "]\\["))
            lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, ops_markdown())
    return markdown
