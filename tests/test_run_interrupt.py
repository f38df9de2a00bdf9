"""grpo_tutorial/run/interrupt.py: the first Ctrl-C asks the loop to stop after the step, the second aborts.

Real SIGINTs are sent to this process (``signal.raise_signal``), inside the
context manager, so the handler is the one Python calls.
"""

import signal
import threading

import pytest

from grpo_tutorial.run import StopAfterStep


def test_the_first_ctrl_c_is_a_request_the_second_aborts(capsys):
    before = signal.getsignal(signal.SIGINT)
    with StopAfterStep() as stop:
        assert stop.requested is False
        signal.raise_signal(signal.SIGINT)
        assert stop.requested is True  # no KeyboardInterrupt: the step in flight goes on
        assert capsys.readouterr().err == (
            "\nCtrl-C: finishing the current step, then saving a checkpoint "
            "(press Ctrl-C again to abort at once, losing this step)\n"
        )
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # the handler before the block is back


def test_the_previous_handler_is_back_after_an_error_in_the_block():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(ValueError):
        with StopAfterStep():
            assert signal.getsignal(signal.SIGINT) is not before
            raise ValueError("a failed step")
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):  # and Ctrl-C interrupts at once again
        signal.raise_signal(signal.SIGINT)


def test_outside_the_main_thread_it_installs_nothing():
    before = signal.getsignal(signal.SIGINT)
    seen = {}

    def worker():
        with StopAfterStep() as stop:
            seen["handler"] = signal.getsignal(signal.SIGINT)
            seen["requested"] = stop.requested

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "requested": False}
    assert signal.getsignal(signal.SIGINT) is before


def test_one_object_may_be_entered_again():
    before = signal.getsignal(signal.SIGINT)
    stop = StopAfterStep()
    for _ in range(2):
        with stop:
            pass
        assert signal.getsignal(signal.SIGINT) is before
