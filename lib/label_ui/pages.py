"""The pages: Overview, Label new data, Existing labels -- one single-page app per browser tab.

``make_root`` returns NiceGUI's root page function. It runs once per tab, makes that tab's
``TabSession`` (held in closures, never in a module global) and the shared frame (header with
the three links); ``ui.sub_pages`` switches between the pages without reloading, so a tab keeps
its list of pairs when the person looks at the Overview and comes back.

Elements that tests use carry ``.mark(...)``: clip-1/clip-2 (their ``data-clip`` prop is the clip
URL on show), answer-1/-0/-2/-x, undo, resample, pause, speed, status, counter, pair-<i>,
notices, no-pairs; db-<i> on the Overview; label-row-<i>, edit-<i>-<key>, filter-answer,
filter-source on Existing labels.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from nicegui import background_tasks, run, ui
from nicegui.events import KeyEventArguments

from lib.errors import UserError
from lib.label_ui.state import ANSWER_KEYS, AppState, DbState, PairItem, TabSession
from lib.labels import CANT_TELL, EQUAL, FIRST_BETTER, LABEL_NAMES, SECOND_BETTER, Label
from lib.segments import SegmentError


def _when(t: float | None) -> str:
    """A label's time for people; "?" when absent or out of the calendar's range (a hand-edited file)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


PLAYER_JS = Path(__file__).with_name("player.js").read_text(encoding="utf-8")
ANSWERS = (FIRST_BETTER, EQUAL, SECOND_BETTER, CANT_TELL)  # the order of the buttons
KEY_OF = {FIRST_BETTER: "1", EQUAL: "0", SECOND_BETTER: "2", CANT_TELL: "x"}
BUTTON_TEXT = {
    FIRST_BETTER: "#1 better (1)",
    EQUAL: "equal (0)",
    SECOND_BETTER: "#2 better (2)",
    CANT_TELL: "can't tell (x)",
}
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0)
CLIP_W, CLIP_H = 320, 420  # 2x the Atari screen
PAGE_SIZE = 25


def clip_url(db: int, rel: str) -> str:
    """URL of a segment's clip: ``/clip/<db>/<NN>/<SSSSSSSS>.mp4`` (see ``server.clip_route``)."""
    env, name = rel.split("/")
    return f"/clip/{db}/{env}/{name.removesuffix('.dat')}.mp4"


def make_root(state: AppState) -> Callable[[], None]:
    """NiceGUI's root page function for this server's state."""

    def root() -> None:
        client = ui.context.client
        tab = TabSession(state, tab_id=client.id)
        client.on_delete(tab.close)
        ui.add_head_html(f"<script>{PLAYER_JS}</script>")
        ui.page_title("RLHF labels")
        with ui.header().classes("items-center gap-6 py-2"):
            ui.label("RLHF labels").classes("text-lg font-bold")
            for path, text in (
                ("/", "Overview"),
                ("/label", "Label new data"),
                ("/labels", "Existing labels"),
            ):
                ui.link(text, path).classes("text-white").mark(f"nav-{path.strip('/') or 'overview'}")
        ui.sub_pages(
            {
                "/": partial(overview_page, state),
                "/label": partial(label_page, state, tab),
                "/labels": partial(labels_page, state),
            }
        )

    return root


async def refresh_dbs(state: AppState, rescan: bool = False) -> None:
    """Read labels other tabs or processes appended (and, with ``rescan``, new segments), off the loop."""

    def work() -> None:
        for d in state.dbs:
            d.labels.refresh()
            if rescan:
                d.rescan()

    await run.io_bound(work)


# --- Overview --------------------------------------------------------------------------------


async def overview_page(state: AppState) -> None:
    await refresh_dbs(state)
    ui.label("Overview").classes("text-h5")
    for d in state.dbs:
        _db_card(d)
    for note in state.notices:
        ui.label(note).classes("text-orange-9").mark("notice")
    ui.button("Label new data", on_click=lambda: ui.navigate.to("/label")).props("unelevated")


def _db_card(d: DbState) -> None:
    s = d.stats()
    by_answer, by_source = s["by_answer"], s["by_source"]
    with ui.card().classes("w-full max-w-3xl").mark(f"db-{d.index}"):
        ui.label(d.name).classes("text-h6 font-mono")
        bad = f" ({s['unreadable']} unreadable)" if s["unreadable"] else ""
        ui.label(f"{s['segments']} segments{bad}")
        answers = ", ".join(f"{LABEL_NAMES[v]}: {by_answer.get(v, 0)}" for v in ANSWERS)
        ui.label(f"{s['labels']} labels — {answers}")
        sources = ", ".join(f"{src}: {n}" for src, n in sorted(by_source.items())) or "none yet"
        ui.label(f"by source — {sources}")
        ui.label(f"{s['untouched']} segments no label has touched yet")
        if s["free_pairs"] > 0:
            ui.label(f"{s['free_pairs']} unlabeled pairs left")
        else:
            ui.label(d.why_no_pairs()).classes("text-orange-9")
        for w in d.labels.warnings:
            ui.label(f"warning: {w}").classes("text-orange-9 text-sm")


# --- Label new data --------------------------------------------------------------------------


async def label_page(state: AppState, tab: TabSession) -> None:
    """The pair on show, its two clips looping in step, the answer buttons, and the tab's list."""
    client = ui.context.client
    player = {"paused": False, "speed": 1.0}
    vids: dict[int, ui.element] = {}
    names: dict[int, ui.label] = {}
    rows: list[tuple[ui.item, ui.label]] = []

    with ui.row().classes("w-full items-start gap-8 no-wrap"):
        with ui.column().classes("items-start gap-2"):
            status = ui.label().classes("text-sm").mark("status")
            with ui.row().classes("gap-4 no-wrap"):
                for k in (1, 2):
                    with ui.column().classes("items-center gap-1"):
                        ui.label(f"#{k}").classes("text-h6")
                        vids[k] = (
                            ui.element("video")
                            .props(f'muted playsinline preload="auto" width={CLIP_W} height={CLIP_H}')
                            .style(f"width:{CLIP_W}px;height:{CLIP_H}px;background:#000;image-rendering:pixelated")
                            .mark(f"clip-{k}")
                        )
                        names[k] = ui.label().classes("text-xs font-mono text-grey-7").mark(f"name-{k}")
            with ui.row().classes("gap-2"):
                for value in ANSWERS:
                    ui.button(BUTTON_TEXT[value], on_click=lambda v=value: answer(v)).props("unelevated no-caps").mark(
                        f"answer-{KEY_OF[value]}"
                    )
            with ui.row().classes("gap-2 items-center"):
                ui.button("undo (u)", on_click=lambda: undo()).props("outline no-caps").mark("undo")
                ui.button("Resample list (r)", on_click=lambda: resample()).props("outline no-caps").mark("resample")
                pause_button = ui.button("pause (space)", on_click=lambda: toggle_pause()).props("outline no-caps")
                pause_button.mark("pause")
                speed = ui.toggle({s: f"{s:g}x" for s in SPEEDS}, value=1.0, on_change=lambda e: set_speed(e.value))
                speed.props("dense no-caps").mark("speed")
            ui.label(
                "Keys: 1 / 0 / 2 / x answer · u undo · r resample · space pause · + / − speed · ↑ ↓ pick in the list"
            ).classes("text-xs text-grey-7")
            notices = ui.column().classes("gap-0").mark("notices")
        with ui.column().classes("gap-1 min-w-[26rem]"):
            counter = ui.label().classes("text-sm").mark("counter")
            pair_list = ui.list().props("dense bordered separator").classes("w-full")
    empty = ui.column().classes("gap-1").mark("no-pairs")

    # -- view updates ------------------------------------------------------------------------

    def build_list() -> None:
        if len(rows) == len(tab.items):  # a new list of the same length: reuse the rows
            update_view()
            return
        pair_list.clear()
        rows.clear()
        with pair_list:
            for i in range(len(tab.items)):
                with ui.item(on_click=partial(pick, i)).mark(f"pair-{i}") as row:
                    text = ui.label().classes("font-mono text-xs whitespace-pre")
                rows.append((row, text))
        update_view()

    def row_text(i: int, item: PairItem) -> str:
        db = state.dbs[item.db]
        prefix = f"{db.name} " if len(state.dbs) > 1 else ""
        mark = {
            "answered": f"✓ {LABEL_NAMES.get(item.answer or 0, '')}",
            "taken": "— labeled elsewhere",
            "skipped": "⚠ unreadable",
        }.get(item.status, "")
        return f"{i + 1:>3}. {prefix}{item.a} vs {item.b}  {mark}"

    def update_view() -> None:
        for i, (row, text) in enumerate(rows):
            item = tab.items[i]
            text.set_text(row_text(i, item))
            if i == tab.current:
                row.classes(add="bg-blue-2 font-bold")
            else:
                row.classes(remove="bg-blue-2 font-bold")
        item = tab.item
        open_left = sum(1 for it in tab.items if it.status == "open")
        counter.set_text(f"{tab.answered} answered in this tab · {open_left} open in this list of {len(tab.items)}")
        if item is None:
            status.set_text("No pair selected.")
            names[1].set_text("")
            names[2].set_text("")
        else:
            db = state.dbs[item.db]
            status.set_text(f"Pair {tab.current + 1} of {len(tab.items)} · {db.name} · which clip shows better play?")
            names[1].set_text(item.a)
            names[2].set_text(item.b)
        notices.clear()
        with notices:
            for note in state.notices[-5:]:
                ui.label(note).classes("text-orange-9 text-sm")
        empty.clear()
        if not tab.items:
            with empty:
                ui.label("No pairs to label.").classes("text-h6")
                for why in state.why_no_pairs():
                    ui.label(why)

    async def show_current() -> None:
        """Show the selected pair: make sure both clips exist (usually prefetched), then play them."""
        while True:
            tab.show_seq += 1
            seq = tab.show_seq
            if tab.item is None and tab.items and not any(it.status == "open" for it in tab.items):
                n = tab.resample()  # the list is done: carry on with a new one
                build_list()
                ui.notify(f"New list of {n} pairs" if n else "No unlabeled pairs left")
            update_view()
            item = tab.item
            if item is None:
                client.run_javascript("window.rlhfPlayer && window.rlhfPlayer.stop()")
                for k in (1, 2):
                    vids[k].props(remove="data-clip")
                return
            db = state.dbs[item.db]
            results = await asyncio.gather(
                *(state.clips.ensure(db.segment_path(rel)) for rel in (item.a, item.b)),
                return_exceptions=True,
            )
            if any(isinstance(r, asyncio.CancelledError) for r in results):
                return  # the server is shutting down
            failed = [(rel, r) for rel, r in zip((item.a, item.b), results, strict=True) if isinstance(r, Exception)]
            if not failed:
                break
            for rel, err in failed:
                state.mark_bad(item.db, rel, _reason(err))
                ui.notify(f"Skipped unreadable segment {db.name}/{rel}", type="warning")
            if tab.item is item:
                tab.select_next()
        if seq != tab.show_seq:  # another answer came in meanwhile: that one shows its pair
            return
        urls = [clip_url(item.db, item.a), clip_url(item.db, item.b)]
        for k, url in zip((1, 2), urls, strict=True):
            vids[k].props["data-clip"] = url
        ids = [vids[1].html_id, vids[2].html_id]
        client.run_javascript(f"window.rlhfPlayer.show({json.dumps(ids)}, {json.dumps(urls)})")
        background_tasks.create(prefetch(tab.upcoming(2)), name="prefetch-clips")

    async def prefetch(items: list[PairItem]) -> None:
        """Encode the next pairs' clips now and let the browser fetch them, so answering feels instant."""
        urls = []
        found_bad = False
        for item in items:
            db = state.dbs[item.db]
            for rel in (item.a, item.b):
                try:
                    await state.clips.ensure(db.segment_path(rel))
                except Exception as err:  # the pair is skipped when its turn comes
                    state.mark_bad(item.db, rel, _reason(err))
                    found_bad = True
                    continue
                urls.append(clip_url(item.db, rel))
        if client.is_deleted:
            return
        if found_bad:
            update_view()
        if urls:
            client.run_javascript(f"window.rlhfPlayer && window.rlhfPlayer.prefetch({json.dumps(urls)})")

    # -- actions -----------------------------------------------------------------------------

    async def save(item: PairItem, label: Label) -> str | None:
        """Append the label durably (in a thread); returns what went wrong, or None.

        No UI here: it may run as a task of its own, where NiceGUI has no page context."""
        db = state.dbs[item.db]
        try:
            await run.io_bound(db.labels.append, label)
        except (OSError, ValueError, UserError) as e:
            return f"Could not save the answer to {db.root}/labels.jsonl: {e}"
        return None

    async def answer(value: int) -> None:
        done = tab.answer(value)
        if done is None:
            return
        item, label = done
        # Save while the next pair is put on show: the next pair does not wait for fsync.
        saving = asyncio.ensure_future(save(item, label))
        # Labels other tabs or processes wrote meanwhile: never offer such a pair as the next one.
        await refresh_dbs(state)
        if tab.item is not None and not tab.still_open(tab.item):
            tab.select_next()
        await show_current()
        error = await saving
        if error:
            ui.notify(error, type="negative", timeout=0)
            tab.answer_failed(item)
            await show_current()

    async def undo() -> None:
        done = tab.undo()
        if done is None:
            ui.notify("Nothing to undo in this tab")
            return
        item, label = done
        error = await save(item, label)
        if error:
            ui.notify(error, type="negative", timeout=0)
        else:
            ui.notify(f"Undone: pair {tab.current + 1 if tab.current is not None else ''} is open again")
        await show_current()

    async def resample() -> None:
        await refresh_dbs(state, rescan=True)
        n = tab.resample()
        build_list()
        ui.notify(f"New list of {n} pairs" if n else "No unlabeled pairs left")
        await show_current()

    async def pick(i: int) -> None:
        if tab.select(i) is not None:
            await show_current()

    async def move(step: int) -> None:
        if not tab.items:
            return
        start = 0 if tab.current is None else tab.current
        for k in range(1, len(tab.items) + 1):
            if tab.select((start + step * k) % len(tab.items)) is not None:
                break
        await show_current()

    def toggle_pause() -> None:
        player["paused"] = not player["paused"]
        pause_button.set_text("play (space)" if player["paused"] else "pause (space)")
        client.run_javascript(f"window.rlhfPlayer.setPaused({json.dumps(player['paused'])})")

    def set_speed(value: float) -> None:
        player["speed"] = float(value)
        client.run_javascript(f"window.rlhfPlayer.setRate({player['speed']})")

    def step_speed(direction: int) -> None:
        i = SPEEDS.index(player["speed"]) if player["speed"] in SPEEDS else SPEEDS.index(1.0)
        speed.set_value(SPEEDS[min(max(i + direction, 0), len(SPEEDS) - 1)])

    async def on_key(e: KeyEventArguments) -> None:
        if not e.action.keydown or e.action.repeat or e.modifiers.ctrl or e.modifiers.alt or e.modifiers.meta:
            return
        k = e.key.name
        if k in ANSWER_KEYS:
            await answer(ANSWER_KEYS[k])
        elif k in ("u", "U"):
            await undo()
        elif k in ("r", "R"):
            await resample()
        elif e.key.space or k in ("p", "P"):
            toggle_pause()
        elif k in ("+", "=", "]"):
            step_speed(+1)
        elif k in ("-", "[", "_"):
            step_speed(-1)
        elif e.key.arrow_down or k == "j":
            await move(+1)
        elif e.key.arrow_up or k == "k":
            await move(-1)

    # Buttons stay out of `ignore`: after a click the focused button must not swallow the keys.
    ui.keyboard(on_key=on_key, ignore=["input", "select", "textarea"], repeating=False)

    if not tab.items:
        await refresh_dbs(state, rescan=True)
        tab.resample()
    build_list()
    await show_current()


def _reason(err: BaseException) -> str:
    msg = str(err)
    return msg if isinstance(err, SegmentError) else f"cannot make a clip ({type(err).__name__}: {msg})"


# --- Existing labels -------------------------------------------------------------------------


async def labels_page(state: AppState) -> None:
    """Every current label, newest first, filtered by answer and source; each can be changed."""
    await refresh_dbs(state)
    client = ui.context.client
    view = {"answer": "all", "source": "all", "page": 1}
    answer_options = {"all": "any answer", **{str(v): LABEL_NAMES[v] for v in ANSWERS}}

    def sources() -> dict[str, str]:
        found = sorted({lab.source for d in state.dbs for lab in d.labels.snapshot()})
        return {"all": "any source", **{s: s for s in found}}

    ui.label("Existing labels").classes("text-h5")
    with ui.row().classes("items-center gap-4"):
        ui.select(
            answer_options, value="all", label="answer", on_change=lambda e: set_filter("answer", e.value)
        ).classes("w-40").mark("filter-answer")
        ui.select(sources(), value="all", label="source", on_change=lambda e: set_filter("source", e.value)).classes(
            "w-40"
        ).mark("filter-source")
        summary = ui.label().mark("labels-summary")
    table = ui.column().classes("w-full gap-0")
    pager = ui.pagination(1, 1, direction_links=True, on_change=lambda e: set_page(e.value)).mark("labels-pager")

    with ui.dialog() as dialog, ui.card():
        dialog_title = ui.label().classes("font-mono text-sm")
        with ui.row().classes("gap-4 no-wrap"):
            dvids = [
                ui.element("video").props(f"muted playsinline width={CLIP_W} height={CLIP_H}")
                .style(f"width:{CLIP_W}px;height:{CLIP_H}px;background:#000")
                for _ in range(2)
            ]  # fmt: skip
        ui.button("close", on_click=dialog.close).props("flat")

    def current_rows() -> list[tuple[DbState, Label]]:
        rows = [(d, lab) for d in state.dbs for lab in d.labels.snapshot()]
        if view["answer"] != "all":
            rows = [(d, lab) for d, lab in rows if lab.label == int(view["answer"])]
        if view["source"] != "all":
            rows = [(d, lab) for d, lab in rows if lab.source == view["source"]]
        rows.sort(key=lambda r: r[1].time or 0.0, reverse=True)
        return rows

    def render() -> None:
        rows = current_rows()
        pages = max(1, -(-len(rows) // PAGE_SIZE))
        view["page"] = min(view["page"], pages)
        pager.max = pages
        pager.value = view["page"]
        summary.set_text(f"{len(rows)} labels")
        table.clear()
        start = (view["page"] - 1) * PAGE_SIZE
        with table:
            if not rows:
                ui.label("No labels match.").classes("text-grey-7")
            for n, (d, lab) in enumerate(rows[start : start + PAGE_SIZE]):
                _label_row(n, d, lab)

    def _label_row(n: int, d: DbState, lab: Label) -> None:
        when = _when(lab.time)
        prefix = f"{d.name} · " if len(state.dbs) > 1 else ""
        with ui.row().classes("items-center gap-2 w-full border-b py-1").mark(f"label-row-{n}"):
            ui.label(f"{prefix}{lab.sample1} vs {lab.sample2}").classes("font-mono text-xs w-80")
            ui.label(LABEL_NAMES.get(lab.label, str(lab.label))).classes("w-24 font-bold").mark(f"label-value-{n}")
            ui.label(f"{lab.source} · {when}").classes("text-xs text-grey-7 w-44")
            for value in ANSWERS:
                ui.button(KEY_OF[value], on_click=partial(change, d, lab, value)).props(
                    f"dense no-caps {'unelevated' if value == lab.label else 'outline'}"
                ).mark(f"edit-{n}-{KEY_OF[value]}").tooltip(f"change to: {LABEL_NAMES[value]}")
            ui.button(icon="play_arrow", on_click=partial(view_pair, d, lab)).props(
                'dense flat aria-label="play this pair"'
            ).mark(f"view-{n}")

    async def change(d: DbState, lab: Label, value: int) -> None:
        if value == lab.label:
            return
        extra = {"edited": True, **({"labeler": state.labeler} if state.labeler else {})}
        new = Label(lab.sample1, lab.sample2, value, time=time.time(), source="human", extra=extra)
        try:
            await run.io_bound(d.labels.append, new)
        except (OSError, ValueError, UserError) as e:
            ui.notify(f"Could not save the change: {e}", type="negative", timeout=0)
            return
        ui.notify(f"{lab.sample1} vs {lab.sample2}: {LABEL_NAMES[value]}")
        render()

    async def view_pair(d: DbState, lab: Label) -> None:
        dialog_title.set_text(f"{d.name}: #1 {lab.sample1} vs #2 {lab.sample2} — {LABEL_NAMES.get(lab.label)}")
        dialog.open()
        urls = []
        for rel in (lab.sample1, lab.sample2):
            if not d.has_segment(rel):
                ui.notify(f"{d.name}/{rel} is not in the DB any more", type="warning")
                return
            try:
                await state.clips.ensure(d.segment_path(rel))
            except Exception as err:
                state.mark_bad(d.index, rel, _reason(err))
                ui.notify(f"Unreadable segment {d.name}/{rel}", type="warning")
                return
            urls.append(clip_url(d.index, rel))
        ids = [v.html_id for v in dvids]
        client.run_javascript(f"window.rlhfPlayer.show({json.dumps(ids)}, {json.dumps(urls)})")

    def set_filter(name: str, value: str) -> None:
        view[name] = value
        view["page"] = 1
        render()

    def set_page(value: int) -> None:
        if value != view["page"]:
            view["page"] = value
            render()

    render()
