"""The Fluid book's machine_translation shape on a synthetic task: reverse digit strings.

A bidirectional GRU encoder and a GRU decoder with dot-product attention (the model of
`nestflow demo --model translate`, nestflow/cli/demo_translate.py) are trained with teacher
forcing on strings of 3-12 digits; the inference program then decodes strings typed here by
beam search (BeamSearchDecoder + dynamic_decode, 4 beams, every beam printed with its score)
and greedily (the same decoder with one beam), and is saved with
nf.io.save_inference_model and loaded back to decode again.

    python examples/machine_translation.py [epochs] [training strings]
"""

import sys
import tempfile

import numpy as np

import nestflow as nf
from nestflow.cli import demo_translate as translate

STRINGS = ["123", "9876543210", "31415926", "271828182845"]


def as_source(strings):
    """Digit strings as the model's padded source ids and lengths."""
    lengths = np.array([len(s) for s in strings], np.int64)
    src = np.zeros((len(strings), lengths.max()), np.int64)
    for row, text in enumerate(strings):
        src[row, : len(text)] = [int(c) + translate.DIGIT0 for c in text]
    return {"src": src, "src_len": lengths}


def main(epochs: int = 2, train_size: int = translate.TRAIN_SIZE) -> None:
    rng = np.random.default_rng(0)
    data = translate.make_pairs(train_size, rng)
    model = translate.build_training()
    scope = nf.Scope()
    losses = translate.train(model, data, scope, epochs, progress=False)
    print("training loss per epoch:", ", ".join(f"{v:.4f}" for v in losses))

    exe = nf.Executor()
    beam = translate.build_decoding(beam_size=4)
    greedy = translate.build_decoding(beam_size=1)
    feed = as_source(STRINGS)
    ids, scores = exe.run(beam.program, feed=feed, fetch_list=[beam.ids, beam.scores], scope=scope)
    (greedy_ids,) = exe.run(greedy.program, feed=feed, fetch_list=[greedy.ids], scope=scope)
    for row, text in enumerate(STRINGS):
        beams = ", ".join(
            f"{translate.as_text(ids[row, :, k])} ({scores[row, k]:.3f})"
            for k in range(ids.shape[2])
        )
        print(f"{text}: greedy {translate.as_text(greedy_ids[row, :, 0])}; beams {beams}")

    with tempfile.TemporaryDirectory() as out:
        nf.io.save_inference_model(out, ["src", "src_len"], [beam.ids], beam.program, scope)
        program, feeds, fetches, loaded_scope = nf.io.load_inference_model(out)
        (again,) = exe.run(program, feed=feed, fetch_list=fetches, scope=loaded_scope)
    print(f"saved and reloaded: decodes the same ids: {np.array_equal(again, ids)}")


if __name__ == "__main__":
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    size = int(sys.argv[2]) if len(sys.argv) > 2 else translate.TRAIN_SIZE
    main(epochs, size)
