"""One page's conversation with a viewer: asks taken in order, answered latest first.

An ask changes what is shown at once (checked; a bad one is answered with an ``error`` and changes nothing),
then its product is computed on the channel's own thread: images (and grids) on one, patterns on another,
phase images (the phase panel's) on a third. While a product is computed, newer asks of that channel replace
the one waiting, so a drag of a detector or a slider is answered at the rate the service answers, never
queued behind stale positions. A live acquisition is watched and its images pushed (seq None) as frames
arrive.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable

import numpy as np

from . import phase
from .protocol import array_answer, ask_of
from .state import Shown, ViewState

logger = logging.getLogger(__name__)
LIVE_POLL = 0.5  # seconds between looks at a live acquisition's received count

Send = Callable[[dict, list[bytes]], None]


class Channel:
    """A thread that runs the newest job given to it; a job given while another runs replaces the waiting one,
    unless that one was given to be kept (a fit: the user asked for it once), which runs first."""

    def __init__(self, name: str):
        self.waiting: list[tuple[Callable[[], None], bool]] = []  # (job, kept), in the order they run
        self.ready = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self.loop, name=f"qgpu-view-{name}", daemon=True)
        self.thread.start()

    def give(self, job: Callable[[], None], kept: bool = False) -> None:
        with self.ready:
            self.waiting = [w for w in self.waiting if w[1]] + [(job, kept)]
            self.ready.notify()

    def loop(self) -> None:
        while True:
            with self.ready:
                while not self.waiting and not self.closed:
                    self.ready.wait()
                if self.closed:
                    return
                job, _ = self.waiting.pop(0)
            job()

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify()


class Session:
    """Answers one page's asks about ``state`` through ``send(header, buffers)`` (called from worker threads)."""

    def __init__(self, state: ViewState, send: Send):
        self.state = state
        self.send = send
        self.images = Channel("images")
        self.patterns = Channel("patterns")
        self.phases = Channel("phases")
        self.phase_open = False  # whether the page has asked for phase images (a live one's are then pushed)
        self.stopped = threading.Event()
        self.received = -1
        self.watcher = threading.Thread(target=self.watch_live, name="qgpu-view-live", daemon=True)
        self.watcher.start()

    def handle(self, message) -> None:
        """Take one ask (a dict or its JSON text): change what is shown and queue what it needs answered."""
        seq, kind = None, "?"
        try:
            ask = ask_of(message)
            seq, kind = ask.get("seq"), ask["type"]
            if kind == "hello":
                self.answer_state()
                shown = self.state.shown
                self.images.give(lambda: self.answer_image(seq, shown, kind))
                self.patterns.give(lambda: self.answer_pattern(seq, shown, kind))
            elif kind == "detector":
                shown = self.state.set(detector=ask.get("detector"))
                self.images.give(lambda: self.answer_image(seq, shown, kind))
            elif kind == "mode":
                shown = self.state.set(mode=ask.get("mode"))
                self.images.give(lambda: self.answer_image(seq, shown, kind))
            elif kind == "index":  # the state after the image: a new acquisition's calibration is a query of its own
                shown = self.state.set(index=ask.get("index"))
                self.images.give(lambda: (self.answer_image(seq, shown, kind), self.answer_state()))
                self.patterns.give(lambda: self.answer_pattern(seq, shown, kind))
                if self.phase_open:
                    steering = self.state.steering
                    self.phases.give(lambda: self.answer_phase(seq, shown.index, steering, "index"))
            elif kind == "cursor":
                shown = self.state.set(cursor=(ask.get("row"), ask.get("col")))
                self.patterns.give(lambda: self.answer_pattern(seq, shown, kind))
            elif kind == "region":
                shown = self.state.set(region=(ask.get("rect"), ask.get("op", "sum")))
                self.patterns.give(lambda: self.answer_pattern(seq, shown, kind))
            elif kind == "grid":
                shown = self.state.set(detector=ask["detector"]) if "detector" in ask else self.state.shown
                self.images.give(lambda: self.answer_grid(seq, shown))
            elif kind == "phase":
                steering = self.state.steer(ask)
                index = self.state.shown.index
                if ask.get("go_on"):
                    self.state.go_on(index, steering)
                self.phase_open = True
                self.phases.give(lambda: self.answer_phase(seq, index, steering))
            elif kind == "fit":
                index = self.state.shown.index
                self.phases.give(lambda: self.answer_fit(seq, index), kept=True)
            elif kind == "reset":
                steering = self.state.reset()
                index = self.state.shown.index
                self.answer_state()
                self.phases.give(lambda: self.answer_phase(seq, index, steering))
            elif kind == "phase_grid":
                steering = self.state.steering
                self.phases.give(lambda: self.answer_phase_grid(seq, steering))
        except Exception as err:  # the ask was wrong, or the service refused it: said, nothing changed
            self.error(seq, kind, err)

    # -- answers (on the channels' threads) ----------------------------------------

    def answer_state(self) -> None:
        self.send(self.state.state(), [])

    def answer_image(self, seq, shown: Shown, ask: str) -> None:
        try:
            image = self.state.image(shown)
            low, high = finite_range(image)
            header, buffers = array_answer("image", seq, image, detector=shown.detector, mode=shown.mode, index=shown.index,
                                           min=low, max=high)
            self.send(header, buffers)
        except Exception as err:
            self.error(seq, ask, err)

    def answer_pattern(self, seq, shown: Shown, ask: str) -> None:
        try:
            source = {"cursor": list(shown.cursor)} if shown.region is None else {"rect": list(shown.region[0]), "op": shown.region[1]}
            self.send(*array_answer("pattern", seq, self.state.pattern(shown), source=source, index=shown.index))
        except Exception as err:
            self.error(seq, ask, err)

    def answer_grid(self, seq, shown: Shown) -> None:
        try:
            self.send(*array_answer("grid", seq, self.state.grid(shown), names=self.state.series.names, detector=shown.detector))
        except Exception as err:
            self.error(seq, "grid", err)

    def answer_phase(self, seq, index: int, steering: phase.Steering, ask: str = "phase") -> None:
        """The phase image (with amplitude and spectrum where wanted), or, where a CPU owner would take long
        and the user has not said to go on, an error giving the expected seconds."""
        try:
            optics = self.state.steered_optics(index, steering)  # once: a live acquisition's is a new calibration
            seconds = self.state.slow_on_cpu(index, steering, optics)
            if seconds is not None:
                name = self.state.series[index].name
                self.send({"type": "error", "seq": seq, "ask": ask, "seconds": seconds, "steering": dataclasses.asdict(steering),
                           "message": f"{steering.method} of {name} takes about {seconds:.0f} s on its CPU worker: "
                                      f"press 'go on' to compute it, or choose a smaller upsampling or SSB"}, [])
                return
            self.send({"type": "progress", "seq": seq, "ask": ask, "what": f"{steering.method} of {self.state.series[index].name}"}, [])
            image = self.state.phase(index, steering, optics)
            layers = {"phase": image.phase}
            if image.amplitude is not None:
                layers["amplitude"] = image.amplitude
            if steering.spectrum:
                layers["spectrum"] = phase.power_spectrum(image.phase)
            ranges = [finite_range(v) for v in layers.values()]
            stacked = image.phase[None] if len(layers) == 1 else np.stack(list(layers.values()))  # one layer: a view
            header, buffers = array_answer("phase", seq, stacked, layers=list(layers), ranges=ranges,
                                           pixel_A=image.pixel_A, upsampling=image.upsampling, index=index,
                                           steering=dataclasses.asdict(steering), name=image.name)
            self.send(header, buffers)
        except Exception as err:
            self.error(seq, ask, err)

    def answer_fit(self, seq, index: int) -> None:
        try:
            self.send({"type": "progress", "seq": seq, "ask": "fit", "what": f"fitting the aberrations of {self.state.series[index].name}"}, [])
            self.state.fit(index)
            self.answer_state()
        except Exception as err:
            self.error(seq, "fit", err)
            return
        self.answer_phase(seq, index, self.state.steering, "fit")

    def answer_phase_grid(self, seq, steering: phase.Steering) -> None:
        try:
            self.send({"type": "progress", "seq": seq, "ask": "phase_grid", "what": f"{steering.method} of every acquisition"}, [])
            self.send(*array_answer("grid", seq, self.state.phase_grid(steering), names=self.state.series.names, of="phase",
                                    steering=dataclasses.asdict(steering)))
        except Exception as err:
            self.error(seq, "phase_grid", err)

    def error(self, seq, ask: str, err: Exception) -> None:
        """Tell the page what went wrong with an ask; the view stays as it was."""
        message = f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
        try:
            self.send({"type": "error", "seq": seq, "ask": ask, "message": message}, [])
        except Exception:  # the page is gone
            logger.debug("viewer page gone while told: %s", message)

    def push(self, shown: Shown) -> None:
        """Send the page a choice made from Python (or a live acquisition's new frames): state, image, pattern."""
        self.answer_state()
        self.images.give(lambda: self.answer_image(None, shown, "push"))
        self.patterns.give(lambda: self.answer_pattern(None, shown, "push"))

    # -- live acquisitions -----------------------------------------------------

    def watch_live(self) -> None:
        """Push the image and pattern again (seq None) while the shown live acquisition receives frames."""
        while not self.stopped.wait(LIVE_POLL):
            shown = self.state.shown
            if not self.state.is_live(shown.index):
                continue
            try:
                received = self.state.series[shown.index].received
            except Exception:  # released or the service gone: nothing to show changes
                continue
            if received != self.received:
                self.received = received
                self.push(shown)
                if self.phase_open:
                    steering = self.state.steering
                    self.phases.give(lambda: self.answer_phase(None, shown.index, steering, "push"))

    def close(self) -> None:
        self.stopped.set()
        self.images.close()
        self.patterns.close()
        self.phases.close()


def finite_range(values: np.ndarray) -> list[float]:
    """[min, max] of the finite values ([0, 0] where none is): two passes where every value is finite."""
    if values.size == 0:
        return [0.0, 0.0]
    low, high = values.min(), values.max()
    if values.dtype.kind != "f" or (np.isfinite(low) and np.isfinite(high)):
        return [float(low), float(high)]
    finite = values[np.isfinite(values)]
    return [float(finite.min()), float(finite.max())] if finite.size else [0.0, 0.0]
