"""lib/core/signals.py: SIGINT/SIGTERM sent to this very process, both ways of stopping."""

from __future__ import annotations

import signal
import threading

import pytest

from lib.core.signals import SignalStop


def test_first_signal_sets_the_flag_second_raises(capsys: pytest.CaptureFixture[str]) -> None:
    with SignalStop(message="{signal}: saving...") as stop:
        assert not stop()
        signal.raise_signal(signal.SIGTERM)
        assert stop() and stop.event.is_set() and stop.signal == "SIGTERM"
        assert "SIGTERM: saving..." in capsys.readouterr().out
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert stop.signal == "SIGTERM"  # the first one's name is kept


def test_silent_without_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with SignalStop() as stop:
        signal.raise_signal(signal.SIGINT)
    assert stop() and stop.signal == "SIGINT"
    assert capsys.readouterr().out == ""


def test_at_once_raises_where_the_program_is() -> None:
    stop = SignalStop(at_once=True)
    with pytest.raises(KeyboardInterrupt), stop:
        signal.raise_signal(signal.SIGTERM)
    assert stop.signal == "SIGTERM"


def test_at_once_waits_for_a_critical_block() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), SignalStop(at_once=True) as stop, stop.critical():
        with stop.critical():  # nested: only the outermost end raises
            signal.raise_signal(signal.SIGINT)
            done.append("inner")
        done.append("outer")
    assert done == ["inner", "outer"]
    with SignalStop(at_once=True) as stop, stop.critical():
        pass  # no signal: the block ends quietly
    assert not stop()


def test_handlers_are_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with SignalStop() as stop:
        assert signal.getsignal(signal.SIGINT) == stop._handle
        assert signal.getsignal(signal.SIGTERM) == stop._handle
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_outside_the_main_thread_signals_are_left_alone() -> None:
    before = signal.getsignal(signal.SIGINT)
    seen = []

    def body() -> None:
        with SignalStop() as stop:
            seen.append(signal.getsignal(signal.SIGINT))
            seen.append(stop())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [before, False]


def test_parent_signals_make_sighup_the_ctrl_c_path() -> None:
    """A module that starts pipeline scripts (experiments.live, experiments.round) takes SIGTERM and
    SIGHUP as Ctrl-C; the other stages leave SIGHUP alone."""
    from lib.core.signals import PARENT_SIGNALS

    stop = SignalStop(at_once=True, signals=PARENT_SIGNALS)
    with pytest.raises(KeyboardInterrupt), stop:
        signal.raise_signal(signal.SIGHUP)
    assert stop.signal == "SIGHUP"
    before = signal.getsignal(signal.SIGHUP)
    with SignalStop():
        assert signal.getsignal(signal.SIGHUP) == before


def test_an_ignored_sighup_stays_ignored() -> None:
    """Under nohup SIGHUP is ignored: the run outlives its terminal."""
    from lib.core.signals import PARENT_SIGNALS

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with SignalStop(at_once=True, signals=PARENT_SIGNALS) as stop:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
        assert not stop()
    finally:
        signal.signal(signal.SIGHUP, old)


def test_module_critical_defers_the_entered_stop() -> None:
    """``lib.core.signals.critical`` for code that does not hold the SignalStop (stopping children)."""
    from lib.core.signals import critical

    done = []
    with pytest.raises(KeyboardInterrupt), SignalStop(at_once=True), critical():
        signal.raise_signal(signal.SIGTERM)
        done.append("stopped every child")
    assert done == ["stopped every child"]
    with critical():  # none entered: a plain block
        done.append("plain")
