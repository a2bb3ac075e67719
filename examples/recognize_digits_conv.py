"""The Fluid book's recognize_digits, convolutional version, on scikit-learn's 8x8 digits.

Two conv-pool stages (nf.nets.simple_img_conv_pool) each followed by batch_norm, then a softmax
fc; the test program is cloned for inference before the optimizer is added, evaluated after
every epoch, and the trained model is saved with nf.io.save_inference_model and loaded back to
classify held-out images. `nestflow demo --model conv` runs the same model as a checked demo.

    python examples/recognize_digits_conv.py [epochs]
"""

import sys
import tempfile

import numpy as np

import nestflow as nf
from nestflow.cli.demo_conv import load_images


def convolutional_neural_network(img):
    # 5x5 filters as in the book, padded by 2 so that an 8x8 image survives two poolings.
    conv_pool_1 = nf.nets.simple_img_conv_pool(
        input=img,
        filter_size=5,
        conv_padding=2,
        num_filters=20,
        pool_size=2,
        pool_stride=2,
        act="relu",
    )
    conv_pool_1 = nf.layers.batch_norm(conv_pool_1)
    conv_pool_2 = nf.nets.simple_img_conv_pool(
        input=conv_pool_1,
        filter_size=5,
        conv_padding=2,
        num_filters=50,
        pool_size=2,
        pool_stride=2,
        act="relu",
    )
    conv_pool_2 = nf.layers.batch_norm(conv_pool_2)
    return nf.layers.fc(input=conv_pool_2, size=10, act="softmax")


def main(epochs: int = 12, batch_size: int = 32) -> float:
    data = load_images(seed=0)
    nf.seed(0)
    main_program, startup_program = nf.Program(), nf.Program()
    with nf.program_guard(main_program, startup_program):
        img = nf.data("img", shape=[-1, 1, 8, 8])
        label = nf.data("label", shape=[-1, 1], dtype="int64")
        prediction = convolutional_neural_network(img)
        avg_loss = nf.layers.mean(nf.layers.cross_entropy(input=prediction, label=label))
        acc = nf.layers.accuracy(input=prediction, label=label)
        test_program = main_program.clone(for_test=True)
        nf.optimizer.Adam(learning_rate=0.001).minimize(avg_loss)

    exe = nf.Executor(nf.CPUPlace())
    scope = nf.Scope()
    exe.run(startup_program, scope=scope)
    rng = np.random.default_rng(0)
    test_feed = {"img": data.test_x, "label": data.test_y}
    for epoch in range(epochs):
        order = rng.permutation(len(data.train_x))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            feed = {"img": data.train_x[rows], "label": data.train_y[rows]}
            exe.run(main_program, feed=feed, fetch_list=[avg_loss], scope=scope)
        test_loss, test_acc = exe.run(
            test_program, feed=test_feed, fetch_list=[avg_loss.name, acc.name], scope=scope
        )
        print(
            f"epoch {epoch + 1:2d}: test loss {float(test_loss):.4f}, "
            f"test accuracy {float(test_acc):.2%}"
        )

    # Saved only to show the reload: the folder is removed once the model has been reloaded.
    with tempfile.TemporaryDirectory(prefix="recognize-digits-conv-") as model_dir:
        nf.io.save_inference_model(model_dir, ["img"], [prediction], main_program, scope)
        program, feed_names, fetch_names, model_scope = nf.io.load_inference_model(model_dir)
        (probabilities,) = exe.run(
            program,
            feed={feed_names[0]: data.test_x[:8]},
            fetch_list=fetch_names,
            scope=model_scope,
        )
        print(f"inference model saved to {model_dir} and reloaded")
        print(
            f"first 8 held-out digits: predicted {probabilities.argmax(axis=1).tolist()}, "
            f"labels {data.test_y[:8].ravel().tolist()}"
        )
    return float(test_acc)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
