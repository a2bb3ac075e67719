"""The stand-in device's CuPy-like behaviour (nestflow/core/standin.py); the device code paths
it runs are tested through tests/executor/test_places.py and the op harness."""


def test_an_emulated_capture_refuses_matrix_products_on_its_own_thread_only():
    """CuPy refuses cuBLAS on the capturing stream; another thread's products go on."""
    import threading

    from nestflow.core import standin

    a = standin.xp.ones((2, 2))
    entered, done, seen = threading.Event(), threading.Event(), []

    def capture():
        with standin.capturing():
            entered.set()
            done.wait(5)
            try:
                standin.xp.matmul(a, a)
            except NotImplementedError:
                seen.append("refused")

    thread = threading.Thread(target=capture)
    thread.start()
    entered.wait(5)
    assert standin.xp.matmul(a, a).get().tolist() == [[2.0, 2.0], [2.0, 2.0]]
    done.set()
    thread.join()
    assert seen == ["refused"]
