"""Existing labels: every current label, newest first, filtered by answer and source, a page at a
time; each can be replayed (a dialog with both clips) or changed (a new line, the last one wins)."""

from __future__ import annotations

import json
import time
from functools import partial

from nicegui import run, ui

from lib.errors import UserError
from lib.label_ui.common import ANSWERS, CLIP_H, CLIP_W, KEY_OF, clip_error, clip_url, refresh_dbs
from lib.label_ui.state import AppState, DbState
from lib.labels import FIRST_BETTER, LABEL_NAMES, SECOND_BETTER, Label

PAGE_SIZE = 25


def when(t: float | None) -> str:
    """A label's time for people; "?" when absent or out of the calendar's range (a hand-edited file)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def model_vs_you(state: AppState, rows: list[tuple[DbState, Label]]) -> list[tuple[DbState, Label]]:
    """Labels with a preference (#1 or #2 better) whose pair the reward model orders the other
    way, the model's most confident first: check either the label or the model."""
    out = []
    for d, lab in rows:
        view = state.model_views(d.index, lab.sample1, lab.sample2)
        if view is None or lab.label not in (FIRST_BETTER, SECOND_BETTER):
            continue
        p = view[2]
        if (lab.label == FIRST_BETTER and p < 0.5) or (lab.label == SECOND_BETTER and p > 0.5):
            out.append((abs(p - 0.5), d, lab))
    out.sort(key=lambda r: -r[0])
    return [(d, lab) for _, d, lab in out]


class LabelsPage:
    """One tab's Existing labels page: filters, the table, a pager, and a dialog to replay a pair."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.client = ui.context.client
        self.answer, self.source, self.page = "all", "all", 1
        self.order = "newest"  # or "model": labels the reward model contradicts, most confident first

    def build(self) -> None:
        answers = {"all": "any answer", **{str(v): LABEL_NAMES[v] for v in ANSWERS}}
        found = sorted({lab.source for d in self.state.dbs for lab in d.labels.snapshot()})
        sources = {"all": "any source", **{s: s for s in found}}
        ui.label("Existing labels").classes("text-h5")
        with ui.row().classes("items-center gap-4"):
            ui.select(
                answers, value="all", label="answer", on_change=lambda e: self.set_filter("answer", e.value)
            ).classes("w-40").mark("filter-answer")
            ui.select(
                sources, value="all", label="source", on_change=lambda e: self.set_filter("source", e.value)
            ).classes("w-40").mark("filter-source")
            if self.state.beliefs is not None:
                orders = {"newest": "newest first", "model": "model vs you"}
                ui.select(
                    orders, value="newest", label="show", on_change=lambda e: self.set_filter("order", e.value)
                ).classes("w-44").mark("filter-order").tooltip(
                    "model vs you: labels where the reward model prefers the other clip, most confident first"
                )
            self.summary = ui.label().mark("labels-summary")
        self.table = ui.column().classes("w-full gap-0")
        self.pager = ui.pagination(1, 1, direction_links=True, on_change=lambda e: self.set_page(e.value))
        self.pager.mark("labels-pager")
        with ui.dialog() as self.dialog, ui.card():
            self.dialog_title = ui.label().classes("font-mono text-sm")
            with ui.row().classes("gap-4 no-wrap"):
                self.dvids = [
                    ui.element("video")
                    .props(f"muted playsinline width={CLIP_W} height={CLIP_H}")
                    .style(f"width:{CLIP_W}px;height:{CLIP_H}px;background:#000")
                    for _ in range(2)
                ]
            ui.button("close", on_click=self.dialog.close).props("flat")

    def current_rows(self) -> list[tuple[DbState, Label]]:
        rows = [(d, lab) for d in self.state.dbs for lab in d.labels.snapshot()]
        if self.answer != "all":
            rows = [(d, lab) for d, lab in rows if lab.label == int(self.answer)]
        if self.source != "all":
            rows = [(d, lab) for d, lab in rows if lab.source == self.source]
        rows.sort(key=lambda r: r[1].time or 0.0, reverse=True)
        if self.order == "model":
            rows = model_vs_you(self.state, rows)
        return rows

    def render(self) -> None:
        rows = self.current_rows()
        pages = max(1, -(-len(rows) // PAGE_SIZE))
        self.page = min(self.page, pages)
        self.pager.max = pages
        self.pager.value = self.page
        self.summary.set_text(f"{len(rows)} labels")
        self.table.clear()
        start = (self.page - 1) * PAGE_SIZE
        with self.table:
            if not rows:
                ui.label("No labels match.").classes("text-grey-7")
            for n, (d, lab) in enumerate(rows[start : start + PAGE_SIZE]):
                self.label_row(n, d, lab)

    def label_row(self, n: int, d: DbState, lab: Label) -> None:
        prefix = f"{d.name} · " if len(self.state.dbs) > 1 else ""
        with ui.row().classes("items-center gap-2 w-full border-b py-1").mark(f"label-row-{n}"):
            ui.label(f"{prefix}{lab.sample1} vs {lab.sample2}").classes("font-mono text-xs w-80")
            ui.label(LABEL_NAMES.get(lab.label, str(lab.label))).classes("w-24 font-bold").mark(f"label-value-{n}")
            ui.label(f"{lab.source} · {when(lab.time)}").classes("text-xs text-grey-7 w-44")
            view = self.state.model_views(d.index, lab.sample1, lab.sample2) if self.state.beliefs else None
            if view is not None:
                ui.label(f"model P(#1) {view[2]:.2f}").classes("text-xs w-28").mark(f"label-model-{n}")
            for value in ANSWERS:
                ui.button(KEY_OF[value], on_click=partial(self.change, d, lab, value)).props(
                    f"dense no-caps {'unelevated' if value == lab.label else 'outline'}"
                ).mark(f"edit-{n}-{KEY_OF[value]}").tooltip(f"change to: {LABEL_NAMES[value]}")
            ui.button(icon="play_arrow", on_click=partial(self.view_pair, d, lab)).props(
                'dense flat aria-label="play this pair"'
            ).mark(f"view-{n}")

    async def change(self, d: DbState, lab: Label, value: int) -> None:
        if value == lab.label:
            return
        extra = {"edited": True, **({"labeler": self.state.labeler} if self.state.labeler else {})}
        new = Label(lab.sample1, lab.sample2, value, time=time.time(), source="human", extra=extra)
        try:
            await run.io_bound(d.labels.append, new)
        except (OSError, ValueError, UserError) as e:
            ui.notify(f"Could not save the change: {e}", type="negative", timeout=0)
            return
        ui.notify(f"{lab.sample1} vs {lab.sample2}: {LABEL_NAMES[value]}")
        self.render()

    async def view_pair(self, d: DbState, lab: Label) -> None:
        self.dialog_title.set_text(f"{d.name}: #1 {lab.sample1} vs #2 {lab.sample2} — {LABEL_NAMES.get(lab.label)}")
        self.dialog.open()
        urls = []
        for rel in (lab.sample1, lab.sample2):
            if not d.has_segment(rel):
                ui.notify(f"{d.name}/{rel} is not in the DB any more", type="warning")
                return
            try:
                await self.state.clips.ensure(d.segment_path(rel))
            except Exception as err:
                self.state.mark_bad(d.index, rel, clip_error(err))
                ui.notify(f"Unreadable segment {d.name}/{rel}", type="warning")
                return
            urls.append(clip_url(d.index, rel))
        ids = [v.html_id for v in self.dvids]
        self.client.run_javascript(f"window.rlhfPlayer.show({json.dumps(ids)}, {json.dumps(urls)})")

    def set_filter(self, name: str, value: str) -> None:
        setattr(self, name, value)
        self.page = 1
        self.render()

    def set_page(self, value: int) -> None:
        if value != self.page:
            self.page = value
            self.render()


async def labels_page(state: AppState) -> None:
    """The Existing labels page of one tab."""
    await refresh_dbs(state)
    page = LabelsPage(state)
    page.build()
    page.render()
