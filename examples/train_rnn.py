"""Train the RNN of `nestflow demo --model rnn` (sequence-sum sign, variable lengths).

    python examples/train_rnn.py [--epochs N] [--seed S] [--out DIR]

The model, data and training loop live in nestflow/cli/demo_rnn.py; read it for how an RNN is
built with nf.rnn(): fc layers inside `with rnn.step():`, per-row lengths through
`rnn.step_input(x, lengths=...)`, and the classifier reading `rnn.final_memory(h)`.
"""

from __future__ import annotations

from nestflow.cli.demo_rnn import main

if __name__ == "__main__":
    raise SystemExit(main())
