import numpy as np
import pytest

import nestflow as nf


@pytest.fixture(autouse=True)
def fresh_programs():
    """Each test builds into its own default programs with names starting from 0."""
    main, startup = nf.Program(), nf.Program()
    with nf.program_guard(main, startup), nf.unique_name.guard():
        nf.seed(0)
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
