"""The Fluid book's understand_sentiment (bidirectional LSTM version) on synthetic reviews.

Each review is 5-40 tokens of a 20-word vocabulary holding one token A and one token B among
distractors; its label is whether A comes before B, anywhere in the review (the bag of words
says nothing: only the order does, over spans of up to 38 tokens). The network is the book's:

    embedding -> bidirectional LSTM (with each review's length) -> max pool over time -> fc

Reviews are padded to the longest of their batch and fed with their lengths; padding steps
neither change the LSTM's state nor reach the pooling. The test program is cloned for inference
before the optimizer is added and evaluated after every epoch; the trained model is saved with
nf.io.save_inference_model and loaded back to classify held-out reviews. `nestflow demo --model
sentiment` runs the same model as a checked demo (exit 1 below 95% held-out accuracy).

    python examples/understand_sentiment.py [epochs] [training reviews]
"""

import sys
import tempfile

import numpy as np

import nestflow as nf
from nestflow.cli.demo_sentiment import batches, feed_of, make_reviews


def bilstm_net(ids, lengths, vocab=20, emb_dim=16, hid_dim=32, class_dim=2):
    emb = nf.layers.embedding(input=ids, size=[vocab, emb_dim])
    states, _last_h, _last_c = nf.layers.lstm(emb, hid_dim, lengths, is_bidirec=True)
    pooled = nf.layers.sequence_pool(input=states, pool_type="max", lengths=lengths)
    return nf.layers.fc(input=pooled, size=class_dim, act="softmax")


def main(epochs: int = 3, train_size: int = 4000) -> float:
    rng = np.random.default_rng(0)
    train_data, test_data = make_reviews(train_size, rng), make_reviews(1000, rng)
    nf.seed(0)
    main_program, startup_program = nf.Program(), nf.Program()
    with nf.program_guard(main_program, startup_program):
        ids = nf.data("ids", shape=[-1, -1], dtype="int64")
        lengths = nf.data("lengths", shape=[-1], dtype="int64")
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        prediction = bilstm_net(ids, lengths)
        avg_cost = nf.layers.mean(nf.layers.cross_entropy(input=prediction, label=label))
        acc = nf.layers.accuracy(input=prediction, label=label)
        test_program = main_program.clone(for_test=True)
        nf.optimizer.Adam(learning_rate=0.01).minimize(avg_cost)

    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup_program, scope=scope)
    test_feed = feed_of(test_data, slice(None))
    for epoch in range(epochs):
        for rows in batches(train_data, rng):
            exe.run(
                main_program, feed=feed_of(train_data, rows), fetch_list=[avg_cost], scope=scope
            )
        test_cost, test_acc = exe.run(
            test_program, feed=test_feed, fetch_list=[avg_cost.name, acc.name], scope=scope
        )
        print(
            f"epoch {epoch + 1}: test cost {float(test_cost):.4f}, "
            f"test accuracy {float(test_acc):.2%}"
        )

    # Saved only to show the reload: the folder is removed once the model has been reloaded.
    with tempfile.TemporaryDirectory(prefix="understand-sentiment-") as model_dir:
        nf.io.save_inference_model(model_dir, ["ids", "lengths"], [prediction], main_program, scope)
        program, feed_names, fetch_names, model_scope = nf.io.load_inference_model(model_dir)
        first = feed_of(test_data, slice(0, 8))
        (probabilities,) = exe.run(
            program,
            feed={name: first[name] for name in feed_names},
            fetch_list=fetch_names,
            scope=model_scope,
        )
        print(f"inference model saved to {model_dir} and reloaded")
        print(
            f"first 8 held-out reviews: predicted {probabilities.argmax(axis=1).tolist()}, "
            f"labels {test_data.labels[:8].ravel().tolist()}"
        )
    return float(test_acc)


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    main(*arguments)
