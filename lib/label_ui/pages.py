"""The shared frame of the label app and its Overview page; one single-page app per browser tab.
``make_root`` returns NiceGUI's root page function: once per tab it makes the tab's ``TabSession``
(held in closures) and the header, and ``ui.sub_pages`` switches between the Overview, Label new
data and Existing labels without reloading, so a tab keeps its list of pairs. Elements that tests
use carry ``.mark(...)``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from nicegui import ui

from lib.label_ui.common import ANSWERS, refresh_dbs
from lib.label_ui.label_page import label_page
from lib.label_ui.labels_page import labels_page
from lib.label_ui.state import AppState, DbState, TabSession
from lib.store.labels import LABEL_NAMES

PLAYER_JS = Path(__file__).with_name("player.js").read_text(encoding="utf-8")


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


# --- Overview --------------------------------------------------------------------------------


async def overview_page(state: AppState) -> None:
    await refresh_dbs(state, rescan=True)  # new lines of labels.jsonl, new segments: off the event loop
    ui.label("Overview").classes("text-h5")
    for d in state.dbs:
        _db_card(d, d.stats())  # kept counts (``LabelTallies``): no walk over the labels
    for note in state.notices:
        ui.label(note).classes("text-orange-9").mark("notice")
    ui.button("Label new data", on_click=lambda: ui.navigate.to("/label")).props("unelevated")


def _db_card(d: DbState, s: dict) -> None:
    by_answer, by_source = s["by_answer"], s["by_source"]
    with ui.card().classes("w-full max-w-3xl").mark(f"db-{d.index}"):
        ui.label(d.name).classes("text-h6 font-mono")
        bad = f" ({s['unreadable']} unreadable)" if s["unreadable"] else ""
        window = f" — pairs from the {s['recent']} newest (--recent)" if s["recent"] else ""
        ui.label(f"{s['segments']} segments{bad}{window}").mark(f"segments-{d.index}")
        answers = ", ".join(f"{LABEL_NAMES[v]}: {by_answer.get(v, 0)}" for v in ANSWERS)
        ui.label(f"{s['labels']} labels — {answers}")
        sources = ", ".join(f"{src}: {n}" for src, n in sorted(by_source.items())) or "none yet"
        ui.label(f"by source — {sources}")
        ui.label(f"{s['untouched']} segments no label has touched yet")
        checks = s["consistency"]
        if checks:
            per = ", ".join(f"{who}: {a}/{n} ({100 * a / n:.0f}%)" for who, (a, n) in sorted(checks.items()))
            ui.label(f"consistency (pairs shown again, order swapped) — {per}").mark(f"consistency-{d.index}")
        if s["free_pairs"] > 0:
            ui.label(f"{s['free_pairs']} unlabeled pairs left")
        else:
            ui.label(d.why_no_pairs()).classes("text-orange-9")
        for w in d.labels.warnings:
            ui.label(f"warning: {w}").classes("text-orange-9 text-sm")
