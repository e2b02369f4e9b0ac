"""Label new data: the pair on show, its two clips looping in step, the answer buttons, the tab's
list. ``LabelPage`` is one tab's page (made per visit): ``build`` lays the elements out once,
``update_view`` writes the tab's state into them, ``show_current`` starts both clips in the browser
(``player.js``) and ``prefetch`` encodes the next pairs' clips ahead. The rules live in
``TabSession``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import numpy as np
from nicegui import background_tasks, run, ui
from nicegui.events import KeyEventArguments

from lib.core.errors import UserError
from lib.label_ui.common import ANSWERS, BUTTON_TEXT, CLIP_H, CLIP_W, KEY_OF, clip_error, clip_url, refresh_dbs
from lib.label_ui.state import ANSWER_KEYS, AppState, PairItem, TabSession
from lib.store.labels import LABEL_NAMES, Label

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0)
KEYS_HELP = "Keys: 1 / 0 / 2 / x answer · u undo · r resample · space pause · + / − speed · ↑ ↓ pick in the list"
STATUS_MARK = {"answered": "✓ {answer}", "taken": "— labeled elsewhere", "skipped": "⚠ unreadable"}


class LabelPage:
    """One tab's label page: its elements, the clip player glue and the actions."""

    def __init__(self, state: AppState, tab: TabSession) -> None:
        self.state, self.tab = state, tab
        self.client = ui.context.client
        self.paused, self.speed_value = False, 1.0
        self.vids: dict[int, ui.element] = {}
        self.names: dict[int, ui.label] = {}
        self.plots: dict[int, ui.html] = {}
        self.rows: list[tuple[ui.item, ui.label]] = []
        # key -> action (KeyEventArguments.key.name); answers come from the session's own table
        self.keys: dict[str, Callable[[], Awaitable[None] | None]] = {
            **{k: partial(self.answer, v) for k, v in ANSWER_KEYS.items()},
            **dict.fromkeys(("u", "U"), self.undo),
            **dict.fromkeys(("r", "R"), self.resample),
            **dict.fromkeys((" ", "p", "P"), self.toggle_pause),
            **dict.fromkeys(("+", "=", "]"), partial(self.step_speed, +1)),
            **dict.fromkeys(("-", "[", "_"), partial(self.step_speed, -1)),
            **dict.fromkeys(("ArrowDown", "j"), partial(self.move, +1)),
            **dict.fromkeys(("ArrowUp", "k"), partial(self.move, -1)),
        }

    # -- the view ------------------------------------------------------------------------------

    def build(self) -> None:
        with ui.row().classes("w-full items-start gap-8 no-wrap"):
            with ui.column().classes("items-start gap-2"):
                self.status = ui.label().classes("text-sm").mark("status")
                with ui.row().classes("gap-4 no-wrap"):
                    for k in (1, 2):
                        self._clip_column(k)
                with ui.row().classes("gap-2"):
                    for value in ANSWERS:
                        ui.button(BUTTON_TEXT[value], on_click=partial(self.answer, value)).props(
                            "unelevated no-caps"
                        ).mark(f"answer-{KEY_OF[value]}")
                if self.state.beliefs is not None:
                    self.model_line = ui.label().classes("text-sm").mark("model-view")
                self._player_controls()
                ui.label(KEYS_HELP).classes("text-xs text-grey-7")
                self.notices = ui.column().classes("gap-0").mark("notices")
            with ui.column().classes("gap-1 min-w-[26rem]"):
                self.counter = ui.label().classes("text-sm").mark("counter")
                self.pair_list = ui.list().props("dense bordered separator").classes("w-full")
        self.empty = ui.column().classes("gap-1").mark("no-pairs")

    def _clip_column(self, k: int) -> None:
        with ui.column().classes("items-center gap-1"):
            ui.label(f"#{k}").classes("text-h6")
            self.vids[k] = (
                ui.element("video")
                .props(f'muted playsinline preload="auto" width={CLIP_W} height={CLIP_H}')
                .style(f"width:{CLIP_W}px;height:{CLIP_H}px;background:#000;image-rendering:pixelated")
                .mark(f"clip-{k}")
            )
            self.names[k] = ui.label().classes("text-xs font-mono text-grey-7").mark(f"name-{k}")
            if self.state.beliefs is not None:  # --reward: the model's per-step prediction, a cursor at the frame
                self.plots[k] = ui.html("").mark(f"model-plot-{k}")

    def _player_controls(self) -> None:
        with ui.row().classes("gap-2 items-center"):
            ui.button("undo (u)", on_click=self.undo).props("outline no-caps").mark("undo")
            ui.button("Resample list (r)", on_click=self.resample).props("outline no-caps").mark("resample")
            self.pause_button = ui.button("pause (space)", on_click=self.toggle_pause).props("outline no-caps")
            self.pause_button.mark("pause")
            options = {s: f"{s:g}x" for s in SPEEDS}
            self.speed = ui.toggle(options, value=1.0, on_change=lambda e: self.set_speed(e.value))
            self.speed.props("dense no-caps").mark("speed")

    def build_list(self) -> None:
        if len(self.rows) == len(self.tab.items):  # a new list of the same length: reuse the rows
            self.update_view()
            return
        self.pair_list.clear()
        self.rows.clear()
        with self.pair_list:
            for i in range(len(self.tab.items)):
                with ui.item(on_click=partial(self.pick, i)).mark(f"pair-{i}") as row:
                    text = ui.label().classes("font-mono text-xs whitespace-pre")
                self.rows.append((row, text))
        self.update_view()

    def row_text(self, i: int, item: PairItem) -> str:
        prefix = f"{self.state.dbs[item.db].name} " if len(self.state.dbs) > 1 else ""
        mark = STATUS_MARK.get(item.status, "").format(answer=LABEL_NAMES.get(item.answer or 0, ""))
        return f"{i + 1:>3}. {prefix}{item.a} vs {item.b}  {mark}"

    def update_view(self) -> None:
        tab = self.tab
        for i, (row, text) in enumerate(self.rows):
            text.set_text(self.row_text(i, tab.items[i]))
            if i == tab.current:
                row.classes(add="bg-blue-2 font-bold")
            else:
                row.classes(remove="bg-blue-2 font-bold")
        open_left = sum(1 for it in tab.items if it.status == "open")
        self.counter.set_text(
            f"{tab.answered} answered in this tab · {open_left} open in this list of {len(tab.items)}"
        )
        item = tab.item
        if item is None:
            self.status.set_text("No pair selected.")
        else:
            db = self.state.dbs[item.db]
            self.status.set_text(
                f"Pair {tab.current + 1} of {len(tab.items)} · {db.name} · which clip shows better play?"
            )
        self.names[1].set_text(item.a if item else "")
        self.names[2].set_text(item.b if item else "")
        if self.state.beliefs is not None:
            self.update_model_view(item)
        self.notices.clear()
        with self.notices:
            for note in self.state.notices[-5:]:
                ui.label(note).classes("text-orange-9 text-sm")
        self.empty.clear()
        if not tab.items:
            with self.empty:
                ui.label("No pairs to label.").classes("text-h6")
                for why in self.state.why_no_pairs():
                    ui.label(why)

    def update_model_view(self, item: PairItem | None) -> None:
        """Under each clip the model's per-step prediction; above the buttons its P(#1 better)."""
        view = self.state.model_views(item.db, item.a, item.b) if item is not None else None
        if view is None:
            for k in self.plots:
                self.plots[k].set_content("")
            self.model_line.set_text("" if item is None else "reward model: no prediction (unreadable segment)")
            return
        va, vb, p = view
        lo = float(min(va.steps.min(), vb.steps.min()))
        hi = float(max(va.steps.max(), vb.steps.max()))
        for k, v in ((1, va), (2, vb)):
            self.plots[k].set_content(reward_plot_svg(v.steps, lo, hi, self.vids[k].html_id))
        self.model_line.set_text(
            f"reward model: P(#1 better) = {p:.2f} · predicted returns {va.member_returns.mean():+.2f} "
            f"vs {vb.member_returns.mean():+.2f}"
        )

    # -- the clip player ---------------------------------------------------------------------

    async def show_current(self) -> None:
        """Show the selected pair: make sure both clips exist (usually prefetched), then play them."""
        tab = self.tab
        while True:
            tab.show_seq += 1
            seq = tab.show_seq
            if tab.item is None and tab.items and not any(it.status == "open" for it in tab.items):
                await refresh_dbs(self.state, rescan=True)  # segments recorded meanwhile
                if tab.item is None and not any(it.status == "open" for it in tab.items):  # still, after the wait
                    n = await new_list(tab)  # the list is done: carry on with a new one
                    if n is None:
                        return  # the server is shutting down
                    self.build_list()
                    ui.notify(f"New list of {n} pairs" if n else "No unlabeled pairs left")
            self.update_view()
            item = tab.item
            if item is None:
                self.client.run_javascript("window.rlhfPlayer && window.rlhfPlayer.stop()")
                for k in (1, 2):
                    self.vids[k].props(remove="data-clip")
                return
            ready = await self._ensure_clips(item)
            if ready is None:
                return  # the server is shutting down
            if ready:
                break
        if seq != tab.show_seq:  # another answer came in meanwhile: that one shows its pair
            return
        urls = [clip_url(item.db, item.a), clip_url(item.db, item.b)]
        for k, url in zip((1, 2), urls, strict=True):
            self.vids[k].props["data-clip"] = url
        ids = [self.vids[1].html_id, self.vids[2].html_id]
        self.client.run_javascript(f"window.rlhfPlayer.show({json.dumps(ids)}, {json.dumps(urls)})")
        background_tasks.create(self.prefetch_next(), name="prefetch-clips")

    async def _ensure_clips(self, item: PairItem) -> bool | None:
        """Both clips of ``item`` encoded: True. An unreadable segment is marked and the tab moves
        on: False. Cancelled (shutdown): None."""
        db = self.state.dbs[item.db]
        results = await asyncio.gather(
            *(self.state.clips.ensure(db.segment_path(rel)) for rel in (item.a, item.b)), return_exceptions=True
        )
        if any(isinstance(r, asyncio.CancelledError) for r in results):
            return None
        failed = [(rel, r) for rel, r in zip((item.a, item.b), results, strict=True) if isinstance(r, Exception)]
        for rel, err in failed:
            self.state.mark_bad(item.db, rel, clip_error(err))
            ui.notify(f"Skipped unreadable segment {db.name}/{rel}", type="warning")
        if failed and self.tab.item is item:
            self.tab.select_next()
        return not failed

    async def prefetch_next(self) -> None:
        """Prefetch the next two pairs; near the end of the list they come from the next list,
        picked off the event loop (``TabSession.prepare``)."""
        tab = self.tab
        items = tab.upcoming(2, prepare=False)
        if len(items) < 2 and tab.current is not None and tab.prepared is None:
            await run.io_bound(tab.prepare)
            items = tab.upcoming(2, prepare=False)
        await self.prefetch(items)

    async def prefetch(self, items: list[PairItem]) -> None:
        """Encode the next pairs' clips now and let the browser fetch them, so answering feels instant."""
        urls = []
        found_bad = False
        for item in items:
            db = self.state.dbs[item.db]
            for rel in (item.a, item.b):
                try:
                    await self.state.clips.ensure(db.segment_path(rel))
                except Exception as err:  # the pair is skipped when its turn comes
                    self.state.mark_bad(item.db, rel, clip_error(err))
                    found_bad = True
                    continue
                urls.append(clip_url(item.db, rel))
        if self.client.is_deleted:
            return
        if found_bad:
            self.update_view()
        if urls:
            self.client.run_javascript(f"window.rlhfPlayer && window.rlhfPlayer.prefetch({json.dumps(urls)})")

    # -- actions -----------------------------------------------------------------------------

    async def save(self, item: PairItem, label: Label) -> str | None:
        """Append the label durably (in a thread); returns what went wrong, or None. No UI here: it
        may run as a task of its own, where NiceGUI has no page context."""
        db = self.state.dbs[item.db]
        try:
            await run.io_bound(db.labels.append, label)
        except (OSError, ValueError, UserError) as e:
            return f"Could not save the answer to {db.root}/labels.jsonl: {e}"
        return None

    async def answer(self, value: int) -> None:
        tab = self.tab
        done = tab.answer(value)
        if done is None:
            return
        item, label = done
        # Save while the next pair is put on show: the next pair does not wait for fsync.
        saving = asyncio.ensure_future(self.save(item, label))
        # Labels other tabs or processes wrote meanwhile: never offer such a pair as the next one.
        await refresh_dbs(self.state)
        if tab.item is not None and not tab.still_open(tab.item):
            tab.select_next()
        await self.show_current()
        error = await saving
        if error:
            ui.notify(error, type="negative", timeout=0)
            tab.answer_failed(item)
            await self.show_current()
        else:
            tab.saved(item)  # in the index now: no list offers it

    async def undo(self) -> None:
        done = self.tab.undo()
        if done is None:
            ui.notify("Nothing to undo in this tab")
            return
        error = await self.save(*done)
        if error:
            ui.notify(error, type="negative", timeout=0)
        else:
            current = self.tab.current + 1 if self.tab.current is not None else ""
            ui.notify(f"Undone: pair {current} is open again")
        await self.show_current()

    async def resample(self) -> None:
        n = await next_list(self.state, self.tab)
        if n is None:
            return  # the server is shutting down
        self.build_list()
        ui.notify(f"New list of {n} pairs" if n else "No unlabeled pairs left")
        await self.show_current()

    async def pick(self, i: int) -> None:
        if self.tab.select(i) is not None:
            await self.show_current()

    async def move(self, step: int) -> None:
        tab = self.tab
        if not tab.items:
            return
        start = 0 if tab.current is None else tab.current
        for k in range(1, len(tab.items) + 1):
            if tab.select((start + step * k) % len(tab.items)) is not None:
                break
        await self.show_current()

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self.pause_button.set_text("play (space)" if self.paused else "pause (space)")
        self.client.run_javascript(f"window.rlhfPlayer.setPaused({json.dumps(self.paused)})")

    def set_speed(self, value: float) -> None:
        self.speed_value = float(value)
        self.client.run_javascript(f"window.rlhfPlayer.setRate({self.speed_value})")

    def step_speed(self, direction: int) -> None:
        i = SPEEDS.index(self.speed_value) if self.speed_value in SPEEDS else SPEEDS.index(1.0)
        self.speed.set_value(SPEEDS[min(max(i + direction, 0), len(SPEEDS) - 1)])

    async def on_key(self, e: KeyEventArguments) -> None:
        if not e.action.keydown or e.action.repeat or e.modifiers.ctrl or e.modifiers.alt or e.modifiers.meta:
            return
        action = self.keys.get(e.key.name)
        if action is not None:
            result: Any = action()
            if asyncio.iscoroutine(result):
                await result


async def new_list(tab: TabSession) -> int | None:
    """The tab's next list on show: picked off the event loop (``draw``), put on show on it
    (``use``). Returns its length; None when the server is shutting down (nothing changed)."""
    items = await run.io_bound(tab.draw)
    return None if items is None else tab.use(items)


async def next_list(state: AppState, tab: TabSession) -> int | None:
    """A new list of pairs for the tab (``new_list``), after a look for the labels and segments
    that came meanwhile (``refresh_dbs``); returns its length (None: shutting down)."""
    await refresh_dbs(state, rescan=True)
    return await new_list(tab)


PLOT_H = 48  # px: the model's plot under a clip, as wide as the clip


def reward_plot_svg(steps: np.ndarray, lo: float, hi: float, video_id: str) -> str:
    """An SVG line of the per-step predictions (both clips of a pair on one scale, ``lo``..``hi``;
    a dashed line at 0 when it is in range) and a cursor ``player.js`` moves with the video."""
    n = len(steps)
    span = hi - lo if hi > lo else 1.0
    xs = [CLIP_W * (i + 0.5) / max(n, 1) for i in range(n)]
    ys = [PLOT_H - 2 - (PLOT_H - 4) * (float(v) - lo) / span for v in steps]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    zero = ""
    if lo < 0 < hi:
        y0 = PLOT_H - 2 - (PLOT_H - 4) * (0 - lo) / span
        zero = f'<line x1="0" x2="{CLIP_W}" y1="{y0:.1f}" y2="{y0:.1f}" stroke="#999" stroke-dasharray="3 3"/>'
    return (
        f'<svg width="{CLIP_W}" height="{PLOT_H}" data-plot-for="{video_id}" data-steps="{n}" '
        f'style="background:#f5f5f5"><title>predicted reward per step ({lo:+.3f} .. {hi:+.3f})</title>{zero}'
        f'<polyline points="{points}" fill="none" stroke="#1565c0" stroke-width="1.5"/>'
        f'<line class="rlhf-cursor" x1="0" x2="0" y1="0" y2="{PLOT_H}" stroke="#c62828" stroke-width="1.5"/></svg>'
    )


async def label_page(state: AppState, tab: TabSession) -> None:
    """The Label new data page of one tab."""
    page = LabelPage(state, tab)
    page.build()
    # Buttons stay out of `ignore`: after a click the focused button must not swallow the keys.
    ui.keyboard(on_key=page.on_key, ignore=["input", "select", "textarea"], repeating=False)
    if not tab.items:
        # Pairs are reserved for a page that connected (its websocket), never for a bare GET:
        # a request without JavaScript would otherwise hold a list of pairs until it times out.
        await page.client.connected()
        if page.client.is_deleted:
            return
        if await next_list(state, tab) is None:
            return
    page.build_list()
    await page.show_current()
