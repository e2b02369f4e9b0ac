"""Ctrl-C and SIGTERM for the long-running stages. ``SignalStop`` catches them while entered (main
thread only) and keeps the first one's name in ``signal``. By default a signal only sets ``event``:
the loop polls ``stop()``, finishes its unit and writes what it has; a second signal raises
KeyboardInterrupt, for a wait that hangs. With ``at_once`` a signal raises KeyboardInterrupt at
once, except inside ``critical()``, which finishes first. A parent of pipeline scripts
(``experiments.live``, ``experiments.round``) takes ``PARENT_SIGNALS``: SIGHUP takes the Ctrl-C path
too, so its ``finally`` stops every child. An ignored SIGHUP stays ignored."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PARENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ENTERED: list[SignalStop] = []  # entered in the main thread, innermost last


class SignalStop:
    """SIGINT / SIGTERM (``signals``) while entered; ``stop()`` says whether one came. ``message``:
    printed on the first signal, ``{signal}`` replaced by its name (None: silent)."""

    def __init__(
        self, at_once: bool = False, message: str | None = None, signals: tuple[int, ...] = STOP_SIGNALS
    ) -> None:
        self.at_once, self.message, self.signals = at_once, message, signals
        self.event = threading.Event()
        self.signal: str | None = None
        self._old: dict[int, object] = {}
        self._depth = 0
        self._pending = False

    def __enter__(self) -> SignalStop:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # nohup: the run outlives its terminal
                self._old[sig] = signal.signal(sig, self._handle)
            _ENTERED.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if self in _ENTERED:
            _ENTERED.remove(self)

    def __call__(self) -> bool:
        return self.event.is_set()

    def _handle(self, signum: int, frame: object) -> None:
        again = self.event.is_set()
        self.signal = self.signal or signal.Signals(signum).name
        self.event.set()
        if self.at_once:
            if self._depth:
                self._pending = True
                return
            raise KeyboardInterrupt
        if again:
            raise KeyboardInterrupt  # a second signal: stop waiting
        if self.message is not None:
            print("\n" + self.message.format(signal=self.signal), flush=True)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """With ``at_once``: a signal inside waits until the block is done, then raises."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending:
                self._pending = False
                raise KeyboardInterrupt


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """The innermost entered ``SignalStop``'s ``critical()``: for code that does not hold it
    (stopping child processes); a plain block when none is entered."""
    with _ENTERED[-1].critical() if _ENTERED else contextlib.nullcontext():
        yield
