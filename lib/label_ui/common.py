"""What the label app's pages share: answer buttons and keys, clip sizes and URLs, label refresh."""

from __future__ import annotations

from nicegui import run

from lib.atari.video import SCALE
from lib.label_ui.state import AppState
from lib.store.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER
from lib.store.segments import SegmentError

ANSWERS = (FIRST_BETTER, EQUAL, SECOND_BETTER, CANT_TELL)  # the order of the buttons
KEY_OF = {FIRST_BETTER: "1", EQUAL: "0", SECOND_BETTER: "2", CANT_TELL: "x"}
BUTTON_TEXT = {
    FIRST_BETTER: "#1 better (1)",
    EQUAL: "equal (0)",
    SECOND_BETTER: "#2 better (2)",
    CANT_TELL: "can't tell (x)",
}
ATARI_H, ATARI_W = 210, 160  # the screen every ALE game draws
CLIP_W, CLIP_H = ATARI_W * SCALE, ATARI_H * SCALE  # a clip's size on the page: its video's own size


def clip_url(db: int, rel: str) -> str:
    """URL of a segment's clip: ``/clip/<db>/<NN>/<SSSSSSSS>.mp4`` (see ``server.clip_route``)."""
    env, name = rel.split("/")
    return f"/clip/{db}/{env}/{name.removesuffix('.dat')}.mp4"


def clip_error(err: BaseException) -> str:
    """Why a segment could not be shown, for the notices (a SegmentError already names the file)."""
    msg = str(err)
    return msg if isinstance(err, SegmentError) else f"cannot make a clip ({type(err).__name__}: {msg})"


async def refresh_dbs(state: AppState, rescan: bool = False) -> None:
    """Read labels other tabs or processes appended (and, with ``rescan``, segments a recorder
    added, ``AppState.rescan``), off the loop."""

    def work() -> None:
        for d in state.dbs:
            d.labels.refresh()
        if rescan:
            state.rescan()

    await run.io_bound(work)
