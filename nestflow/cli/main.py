"""`nestflow demo [--model mlp|rnn|conv] [--epochs N] [--out DIR] [--distributed]`,
`nestflow show DIR [--graph OUT] [--all-attrs]`, `nestflow export MODEL_DIR OUT.onnx [--opset N]` and
`nestflow launch -n N [--hostfile FILE] script.py [args]`."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

from nestflow.errors import NestflowError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nestflow", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="train a model on scikit-learn's bundled 8x8 digits, save and reload it"
    )
    demo.add_argument(
        "--model",
        choices=("mlp", "rnn", "conv", "translate", "sentiment", "srl", "transformer", "word2vec"),
        default="mlp",
    )
    demo.add_argument("--epochs", type=int, default=None, help="passes over the training set")
    demo.add_argument("--out", default=None, help="directory for the saved model (default: temp)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--limit", type=int, default=None, help="use only this many digits (a quick run)"
    )
    demo.add_argument(
        "--min-accuracy",
        type=float,
        default=None,
        help="exit with status 1 if held-out accuracy is below this (default: the demo's "
        "MIN_ACCURACY, 0.97 for mlp, 0.985 for conv)",
    )
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    demo.add_argument(
        "--place",
        default="cpu",
        help="where the demo runs: cpu (default), cuda[:i] (a GPU through CuPy) or standin (the "
        "stand-in device that checks the GPU code paths on the host)",
    )
    demo.add_argument(
        "--distributed",
        action="store_true",
        help="train the mlp on 2 MPI ranks (nestflow launch; needs nestflow[distributed])",
    )
    show = commands.add_parser("show", help="print the program listing of a saved model")
    show.add_argument("path", help="a directory written by save_inference_model, or a .pb file")
    show.add_argument(
        "--graph",
        metavar="OUT",
        default=None,
        help="also draw the program to OUT (.svg/.png/.pdf through Graphviz's dot, .dot: the text)",
    )
    show.add_argument(
        "--all-attrs",
        action="store_true",
        help="list every attribute of each op (default: only those that differ from the op's "
        "defaults)",
    )
    export = commands.add_parser(
        "export", help="write a saved inference model as an ONNX model (needs nestflow[onnx])"
    )
    export.add_argument("model_dir", help="a directory written by save_inference_model")
    export.add_argument("out", help="the .onnx file to write")
    export.add_argument("--opset", type=int, default=17, help="the ONNX opset (default 17)")
    launch = commands.add_parser(
        "launch", help="run a training script on N MPI ranks (needs nestflow[distributed])"
    )
    from nestflow.cli import launch as launching

    launching.add_arguments(launch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args, sys.argv[1:] if argv is None else list(argv))
        if args.command == "launch":
            from nestflow.cli.launch import run

            return run(args)
        if args.command == "export":
            return _export(args)
        return _show(args.path, args.graph, args.all_attrs)
    except NestflowError as exc:
        print(f"nestflow: error: {exc}", file=sys.stderr)
        return 1


def _demo(args: argparse.Namespace, argv: list[str]) -> int:
    if args.distributed:
        from nestflow.cli import demo_distributed

        return demo_distributed.main(args, argv)
    module_name = f"nestflow.cli.demo_{args.model}"
    if importlib.util.find_spec(module_name) is None:
        print(
            f"nestflow: the '{args.model}' demo is not available in this version "
            f"({module_name} is missing); try --model mlp",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(module_name)
    import nestflow as nf
    from nestflow.core.place import parse_place

    nf.set_default_place(parse_place(args.place))
    if args.min_accuracy is None:
        args.min_accuracy = getattr(module, "MIN_ACCURACY", 0.97)
    return module.run(args)


def _export(args: argparse.Namespace) -> int:
    try:
        from nestflow.onnx.exporter import export_inference_model

        model = export_inference_model(args.model_dir, args.out, args.opset)
    except ModuleNotFoundError as exc:
        print(f"nestflow: {exc}", file=sys.stderr)
        return 1
    inputs = ", ".join(i.name for i in model.graph.input)
    outputs = ", ".join(o.name for o in model.graph.output)
    print(f"wrote {args.out} (ONNX opset {args.opset}; inputs {inputs}; outputs {outputs})")
    return 0


def _show(path: str, graph: str | None = None, all_attrs: bool = False) -> int:
    from nestflow.cli.listing import program_listing
    from nestflow.core.tensor import Tensor
    from nestflow.framework.program import Program
    from nestflow.io import inference

    if os.path.isdir(path):
        program, feeds, fetches, scope = inference.load_inference_model(path)
        print(f"model {path}")
        print(f"  feed:  {', '.join(feeds)}")
        print(f"  fetch: {', '.join(fetches)}")
        for name in sorted(scope.local_var_names()):
            tensor = scope.find_var(name).get(Tensor)
            print(f"  param {name}: {tensor.dtype}{list(tensor.shape)}")
    else:
        try:
            with open(path, "rb") as file:
                program = Program.from_bytes(file.read())
        except OSError as exc:
            print(f"nestflow: cannot read '{path}': {exc}", file=sys.stderr)
            return 1
    print(program_listing(program, all_attrs))
    if graph is not None:
        from nestflow.framework.dot import render

        print(f"graph written to {render(program.to_dot(), graph)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
