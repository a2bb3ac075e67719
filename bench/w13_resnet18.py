"""W13: one SGD train step of ResNet-18 in its CIFAR form on a synthetic [32, 3, 32, 32] batch,
at 1 and at 2 threads (issue 29).

CIFAR ResNet-18: a 3x3 stem conv (64, stride 1) + batch_norm + relu, four stages of two basic
blocks (64, 128, 256, 512 channels; the first block of stages 2-4 has stride 2 and a 1x1
conv + batch_norm shortcut), global average pool, fc 10, softmax cross-entropy, SGD. nestflow:
nf.layers conv2d (no bias) / batch_norm / elementwise_add(act="relu") / pool2d / fc, one
Executor.run per step fetching the loss. PyTorch eager: the same net from torch.nn. Each side at 1
and at 2 threads (nf.set_num_threads / torch.set_num_threads), the four contenders' rounds
interleaved. Targets: <= 1.2x PyTorch at 2 threads, nestflow's own 2-thread speed-up >= 1.7x.
Timing only: the two nets start from their own random parameters (the step's cost does not
depend on their values).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import load_note, main, scaling_rows, setup_torch

BATCH, CLASSES, LR = 32, 10, 0.01
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((BATCH, 3, 32, 32)).astype("float32")
    return xs, rng.integers(0, CLASSES, (BATCH, 1)).astype("int64")


def make_nestflow_step(xs, ys) -> Callable[[], float]:
    import nestflow as nf

    layers = nf.layers

    def conv_bn(h, channels, k, stride, act=None):
        h = layers.conv2d(h, channels, k, stride=stride, padding=k // 2, bias_attr=False)
        return layers.batch_norm(h, act=act)

    def block(h, channels, stride):
        out = conv_bn(h, channels, 3, stride, act="relu")
        out = conv_bn(out, channels, 3, 1)
        if stride != 1 or h.shape[1] != channels:
            h = conv_bn(h, channels, 1, stride)
        return layers.elementwise_add(out, h, act="relu")

    main_prog, startup = nf.Program(), nf.Program()
    with nf.program_guard(main_prog, startup):
        x = nf.data("x", [-1, 3, 32, 32])
        y = nf.data("y", [-1, 1], "int64")
        h = conv_bn(x, 64, 3, 1, act="relu")
        for channels, stride in STAGES:
            h = block(h, channels, stride)
            h = block(h, channels, 1)
        h = layers.pool2d(h, pool_type="avg", global_pooling=True)
        logits = layers.fc(h, CLASSES)
        loss = layers.mean(layers.softmax_with_cross_entropy(logits, y))
        nf.optimizer.SGD(learning_rate=LR).minimize(loss)
    exe, scope = nf.Executor(nf.CPUPlace()), nf.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": xs, "y": ys}

    def step() -> float:
        (value,) = exe.run(main_prog, feed=feed, fetch_list=[loss], scope=scope)
        return float(value)

    return step


def make_torch_step(xs, ys, torch) -> Callable[[], float]:
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = torch.relu(self.b1(self.c1(x)))
            out = self.b2(self.c2(out))
            return torch.relu(out + (x if self.short is None else self.short(x)))

    blocks, cin = [], 64
    for channels, stride in STAGES:
        blocks += [Block(cin, channels, stride), Block(channels, channels, 1)]
        cin = channels
    net = nn.Sequential(
        nn.Conv2d(3, 64, 3, 1, 1, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, CLASSES),
    )
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    tx, ty = torch.from_numpy(xs), torch.from_numpy(ys[:, 0])

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(tx), ty)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def run(rounds: int = 5) -> dict:
    torch = setup_torch()
    xs, ys = batch()
    makers = {"nestflow": lambda: make_nestflow_step(xs, ys)}
    if torch is not None:
        makers["torch"] = lambda: make_torch_step(xs, ys, torch)
    notes = [load_note() + " at the start"]
    rows, _ = scaling_rows("train step", makers, torch, rounds, 1.0, {2: 1.2})
    notes.append(load_note() + " at the end")
    return {
        "workload": "W13 ResNet-18 (CIFAR form) train step, [32, 3, 32, 32], SGD",
        "rows": rows,
        "notes": notes,
    }


if __name__ == "__main__":
    main(run)
