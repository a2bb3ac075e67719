"""The Fluid book's label_semantic_roles, in small, on synthetic sentences.

Each sentence holds one or two verbs; a predicate mark points at one. Its roles are IOB chunks:
A0 is the run of nouns right before the predicate, A1 the run right after, V the predicate
(see nestflow/cli/demo_srl.py for the generator). The network is the book's, one LSTM deep:

    word embedding + mark embedding -> bidirectional LSTM (with each sentence's length)
        -> fc to the tag scores -> linear_chain_crf (training cost)
                                -> crf_decoding (Viterbi path) -> chunk_eval (precision, recall, F1)

The CRF's transition parameter is named ("crfw") so that crf_decoding shares it. The test
program is cloned for inference before the optimizer is added and scored with chunk_eval after
every epoch; the trained decoder is saved with nf.io.save_inference_model and loaded back.
`nestflow demo --model srl` runs the same model as a checked demo (exit 1 below 0.95 F1).

    python examples/srl.py [epochs] [training sentences]
"""

import sys
import tempfile

import numpy as np

import nestflow as nf
from nestflow.cli.demo_srl import CHUNK_TYPES, NUM_TAGS, batches, feed_of, make_sentences


def db_lstm(words, mark, lengths, vocab=40, word_dim=32, mark_dim=8, hidden=48):
    word_emb = nf.layers.embedding(input=words, size=[vocab, word_dim])
    mark_emb = nf.layers.embedding(input=mark, size=[2, mark_dim])
    features = nf.layers.concat([word_emb, mark_emb], axis=2)
    states, _h, _c = nf.layers.lstm(features, hidden, lengths, is_bidirec=True)
    return nf.layers.fc(input=states, size=NUM_TAGS, num_flatten_dims=2)


def main(epochs: int = 3, train_size: int = 3000) -> float:
    rng = np.random.default_rng(0)
    train_data, test_data = make_sentences(train_size, rng), make_sentences(500, rng)
    nf.seed(0)
    main_program, startup_program = nf.Program(), nf.Program()
    with nf.program_guard(main_program, startup_program):
        words = nf.data("words", shape=[-1, -1], dtype="int64")
        mark = nf.data("mark", shape=[-1, -1], dtype="int64")
        lengths = nf.data("lengths", shape=[-1], dtype="int64")
        target = nf.data("target", shape=[-1, -1], dtype="int64")
        feature_out = db_lstm(words, mark, lengths)
        crf_cost = nf.layers.linear_chain_crf(
            input=feature_out, label=target, param_attr=nf.ParamAttr(name="crfw"), length=lengths
        )
        avg_cost = nf.layers.mean(crf_cost)
        crf_decode = nf.layers.crf_decoding(
            input=feature_out, param_attr=nf.ParamAttr(name="crfw"), length=lengths
        )
        precision, recall, f1, *_counts = nf.layers.chunk_eval(
            input=crf_decode, label=target, chunk_scheme="IOB", num_chunk_types=CHUNK_TYPES,
            seq_length=lengths,
        )  # fmt: skip
        test_program = main_program.clone(for_test=True)
        nf.optimizer.Adam(learning_rate=0.01).minimize(avg_cost)

    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup_program, scope=scope)
    order = np.random.default_rng(1)
    score = 0.0
    for epoch in range(epochs):
        costs = []
        for rows in batches(train_data, order):
            (cost,) = exe.run(main_program, feed=feed_of(train_data, rows),
                              fetch_list=[avg_cost], scope=scope)  # fmt: skip
            costs.append(float(cost))
        p, r, score = (
            float(v[0])
            for v in exe.run(
                test_program,
                feed=feed_of(test_data, slice(None)),
                fetch_list=[precision, recall, f1],
                scope=scope,
            )  # fmt: skip
        )
        print(f"epoch {epoch}: cost {np.mean(costs):.4f}, held-out precision {p:.4f}, "
              f"recall {r:.4f}, F1 {score:.4f}")  # fmt: skip

    with tempfile.TemporaryDirectory() as out:
        nf.io.save_inference_model(out, ["words", "mark", "lengths"], [crf_decode],
                                   main_program, scope)  # fmt: skip
        program, feeds, fetches, loaded = nf.io.load_inference_model(out)
        feed = feed_of(test_data, slice(0, 3))
        (path,) = exe.run(program, feed={k: feed[k] for k in feeds}, fetch_list=fetches,
                          scope=loaded)  # fmt: skip
    for row in range(3):
        n = int(test_data.lengths[row])
        print("words  ", test_data.words[row, :n].tolist())
        print("decoded", path[row, :n].tolist())
        print("labels ", test_data.tags[row, :n].tolist())
    return score


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
