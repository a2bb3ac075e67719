"""A Transformer encoder classifier on synthetic token sequences.

Each sequence is 8-24 tokens of a 16-word vocabulary holding two tokens A and two tokens B
among distractors; its label is whether some A is immediately followed by a B (every sequence
has the same A's and B's, so only their neighbourhood tells). The network:

    embedding + learned position embedding
        -> nf.nets.transformer_encoder (2 pre-norm layers of nf.layers.multi_head_attention
           and a gelu feed-forward block; keys past each row's length are masked)
        -> max pool over each row's valid steps -> fc softmax

The test program is cloned for inference before the optimizer is added and evaluated after
every epoch; the trained model is saved with nf.io.save_inference_model and loaded back to
classify held-out sequences. `nestflow demo --model transformer` runs the same model as a
checked demo (exit 1 below 95% held-out accuracy).

    python examples/transformer.py [epochs] [training sequences]
"""

import sys
import tempfile

import numpy as np

import nestflow as nf
from nestflow.cli.demo_transformer import MAX_LENGTH, batches, feed_of, make_sequences


def encoder_classifier(ids, lengths, vocab=16, d_model=32, heads=4, class_dim=2):
    tokens = nf.layers.embedding(input=ids, size=[vocab, d_model])
    positions = nf.layers.create_parameter(
        [MAX_LENGTH, d_model], "float32", initializer=nf.initializer.Normal(0.0, 0.5)
    )
    states = nf.nets.transformer_encoder(
        tokens + positions,
        num_layers=2,
        nhead=heads,
        dim_feedforward=2 * d_model,
        dropout=0.0,
        activation="gelu",
        normalize_before=True,
        src_key_padding_lengths=lengths,
        final_norm=True,
    )
    pooled = nf.layers.sequence_pool(input=states, pool_type="max", lengths=lengths)
    return nf.layers.fc(input=pooled, size=class_dim, act="softmax")


def main(epochs: int = 12, train_size: int = 4000) -> float:
    rng = np.random.default_rng(0)
    train_data, test_data = make_sequences(train_size, rng), make_sequences(1000, rng)
    nf.seed(0)
    main_program, startup_program = nf.Program(), nf.Program()
    with nf.program_guard(main_program, startup_program):
        ids = nf.data("ids", shape=[-1, MAX_LENGTH], dtype="int64")
        lengths = nf.data("lengths", shape=[-1], dtype="int64")
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        prediction = encoder_classifier(ids, lengths)
        avg_cost = nf.layers.mean(nf.layers.cross_entropy(input=prediction, label=label))
        acc = nf.layers.accuracy(input=prediction, label=label)
        test_program = main_program.clone(for_test=True)
        nf.optimizer.Adam(learning_rate=5e-3).minimize(avg_cost)

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
    with tempfile.TemporaryDirectory(prefix="transformer-") as model_dir:
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
            f"first 8 held-out sequences: predicted {probabilities.argmax(axis=1).tolist()}, "
            f"labels {test_data.labels[:8].ravel().tolist()}"
        )
    return float(test_acc)


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    main(*arguments)
