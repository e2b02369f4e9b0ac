"""Existing labels: every current label, newest first, filtered by answer and source, a page at a
time; each can be replayed (a dialog with both clips) or changed (a new line, the last one wins)."""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterable, Iterator
from functools import partial
from itertools import islice

from nicegui import run, ui

from lib.core.errors import UserError
from lib.label_ui.common import ANSWERS, CLIP_H, CLIP_W, KEY_OF, clip_error, clip_url, refresh_dbs
from lib.label_ui.state import AppState, DbState
from lib.store.labels import FIRST_BETTER, LABEL_NAMES, SECOND_BETTER, Label

PAGE_SIZE = 25


def when(t: float | None) -> str:
    """A label's time for people; "?" when absent or out of the calendar's range (a hand-edited file)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def pages(labels: int) -> int:
    """Pages of ``PAGE_SIZE`` that ``labels`` labels fill (one when there are none)."""
    return max(1, -(-labels // PAGE_SIZE))


def model_vs_you(state: AppState, rows: Iterable[tuple[DbState, Label]]) -> list[tuple[DbState, Label]]:
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
        found = sorted({source for d in self.state.dbs for _, source in d.labels.kinds()})
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
        self.pager.props("max-pages=9 boundary-numbers")  # 12,000 pages of 300,000 labels: not 12,000 buttons
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

    def wanted(self, answer: int, source: str) -> bool:
        """Whether the filters let a label of this answer and source through."""
        return (self.answer == "all" or answer == int(self.answer)) and (self.source == "all" or source == self.source)

    def newest(self) -> Iterator[tuple[DbState, Label]]:
        """The labels the filters let through, newest first over every DB (ties: DB order, then
        file order). Lazy: a page takes what it shows and stops."""

        def tagged(d: DbState) -> Iterator[tuple[tuple[float, int, int], DbState, Label]]:
            for t, negseq, lab in d.labels.newest_first():
                yield (t, -d.index, negseq), d, lab

        streams = [tagged(d) for d in self.state.dbs]
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda r: r[0], reverse=True)
        return ((d, lab) for _, d, lab in merged if self.wanted(lab.label, lab.source))

    def count(self) -> int:
        """How many labels the filters let through, from the kept counts."""
        return sum(n for d in self.state.dbs for (a, src), n in d.labels.kinds().items() if self.wanted(a, src))

    def page_rows(self) -> tuple[int, list[tuple[DbState, Label]]]:
        """How many labels the filters let through, and the current page's (the last page if the
        current one is past it). Newest first: from the kept counts and order, no walk over every
        label; model vs you (--reward only) looks at every label."""
        ranked = model_vs_you(self.state, self.newest()) if self.order == "model" else None
        total = len(ranked) if ranked is not None else self.count()
        self.page = min(self.page, pages(total))
        start = (self.page - 1) * PAGE_SIZE
        if ranked is not None:
            return total, ranked[start : start + PAGE_SIZE]
        return total, list(islice(self.newest(), start, start + PAGE_SIZE))

    def render(self) -> None:
        total, rows = self.page_rows()
        self.pager.max = pages(total)
        self.pager.value = self.page
        self.summary.set_text(f"{total} labels")
        self.table.clear()
        with self.table:
            if not rows:
                ui.label("No labels match.").classes("text-grey-7")
            for n, (d, lab) in enumerate(rows):
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
