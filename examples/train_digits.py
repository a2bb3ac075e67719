"""Digits with seed 003's NetBuilder: build a net op by op, then run it in a scope.

`nestflow demo` (nestflow/cli/demo_mlp.py) trains the same MLP with Programs and an Executor;
this script shows the other style: every variable lives in the scope the net runs in, so the
prediction is read straight from it.

    python examples/train_digits.py [epochs]
"""

import sys

import numpy as np

import nestflow as nf
from nestflow.cli.demo_mlp import load_digits


def main(epochs: int = 15, batch_size: int = 32) -> float:
    data = load_digits(seed=0)
    nf.seed(0)
    builder = nf.NetBuilder(nf.Net.create())
    image = builder.data("image", [-1, 64])
    label = builder.data("label", [-1, 1], dtype="int64")
    hidden = builder.add_op("fc", input=image, size=128, activation="relu")
    logits = builder.add_op("fc", input=hidden, size=10)
    prediction = builder.add_op("softmax", logits)
    loss = builder.add_op("softmax_with_cross_entropy", logits=logits, label=label)
    avg_loss = builder.add_op("mean", loss)
    builder.backward_from(avg_loss)
    builder.add_optimization(1e-3, "adam")

    scope = nf.Scope()
    rng = np.random.default_rng(0)
    test = {"image": data.test_x, "label": data.test_y}
    for epoch in range(epochs):
        order = rng.permutation(len(data.train_x))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            builder.run(scope, feed={"image": data.train_x[rows], "label": data.train_y[rows]})
        builder.run(scope, need_backward=False, feed=test)  # forward ops only
        probabilities = scope.find_var(prediction.name).get(nf.Tensor).numpy()
        test_loss = float(scope.find_var(avg_loss.name).get(nf.Tensor).numpy())
        accuracy = float((probabilities.argmax(axis=1) == data.test_y.ravel()).mean())
        print(f"epoch {epoch + 1:2d}: test loss {test_loss:.4f}, test accuracy {accuracy:.2%}")
    return accuracy


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
