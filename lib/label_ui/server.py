"""Wires the label app together (``build_app``) and serves it (``serve``). It answers the pages,
NiceGUI's assets and websocket, ``/login`` with a token, and ``/clip/<db>/<NN>/<SSSSSSSS>.mp4`` for
a segment the DB listed, looked up in that list, so no path from a URL reaches the file system."""

from __future__ import annotations

import gc
import sys
import time

from fastapi import HTTPException
from fastapi.responses import FileResponse
from nicegui import app, helpers, ui

from lib.label_ui.auth import BodyLimitMiddleware, HostCheckMiddleware, TokenMiddleware
from lib.label_ui.clips import ClipStore, prune_cache
from lib.label_ui.config import LabelConfig, check_port_free
from lib.label_ui.pages import make_root
from lib.label_ui.sampling import SegmentBeliefs, SegmentLooks
from lib.label_ui.state import AppState, DbState
from lib.models.reward import load_reward_model
from lib.store.segments import SegmentError, db_game


def model_view(cfg: LabelConfig, dbs: list[DbState]) -> list[SegmentBeliefs]:
    """The reward model's view of every DB (--reward), computed before the page opens so that
    picking a list of pairs never waits on the model."""
    assert cfg.reward is not None
    rm = load_reward_model(cfg.reward, game=(db_game(dbs[0].root) or (None, None))[0])
    beliefs = [SegmentBeliefs(rm, d.root, warn=lambda m: print(f"warning: {m}", file=sys.stderr)) for d in dbs]
    if cfg.sampling != "random":
        t0 = time.monotonic()
        for d, b in zip(dbs, beliefs, strict=True):
            b.all(d.usable_segments(), log=lambda m: print(m, flush=True))
        print(f"reward model view of {sum(len(b.views) for b in beliefs)} segments in {time.monotonic() - t0:.1f} s")
    return beliefs


def rare_view(dbs: list[DbState]) -> list[SegmentLooks]:
    """``--sampling rare``: every DB's segment looks and rarity, computed before serving."""
    t0 = time.monotonic()
    looks = [SegmentLooks(d.root, warn=lambda m: print(f"warning: {m}", file=sys.stderr)) for d in dbs]
    for d, lk in zip(dbs, looks, strict=True):
        lk.rarity(d.usable_segments())
    print(f"looks of {sum(len(lk.looks) for lk in looks)} segments in {time.monotonic() - t0:.1f} s", flush=True)
    return looks


def build_app(cfg: LabelConfig) -> AppState:
    """Open the DBs, register the clip route (and the token middleware); returns the state."""
    dbs = [DbState.open(i, path, recent=cfg.recent) for i, path in enumerate(cfg.dbs)]
    beliefs = model_view(cfg, dbs) if cfg.reward is not None else None
    looks = rare_view(dbs) if cfg.sampling == "rare" else None
    state = AppState(
        dbs,
        pairs=cfg.pairs,
        seed=cfg.seed,
        labeler=cfg.labeler,
        sampling=cfg.sampling,
        beliefs=beliefs,
        looks=looks,
        pool=cfg.pool,
        control_rate=cfg.control_rate,
    )
    prune_cache(cfg.cache_dir)
    state.clips = ClipStore(cfg.cache_dir, cfg.fps)

    async def clip_route(db: int, env: str, name: str) -> FileResponse:
        rel = f"{env}/{name.removesuffix('.mp4')}.dat"
        if not name.endswith(".mp4") or not 0 <= db < len(dbs) or not dbs[db].has_segment(rel):
            raise HTTPException(status_code=404, detail="no such segment")
        d = dbs[db]
        try:
            path = await state.clips.ensure(d.segment_path(rel))
        except (SegmentError, RuntimeError, OSError) as e:
            state.mark_bad(db, rel, str(e))
            raise HTTPException(status_code=422, detail=f"unreadable segment {d.name}/{rel}") from None
        return FileResponse(path, media_type="video/mp4", headers={"Cache-Control": "private, max-age=86400"})

    app.add_api_route("/clip/{db}/{env}/{name}", clip_route, methods=["GET"])
    if cfg.token:
        app.add_middleware(TokenMiddleware, token=cfg.token, port=cfg.port)
    app.add_middleware(BodyLimitMiddleware)  # before the token check: a login form is small too
    app.add_middleware(HostCheckMiddleware, allowed=cfg.allowed_hosts())  # added last: runs first
    for d in dbs:
        for w in d.labels.warnings:  # e.g. a torn last line after a crash: recovered, but say so
            print(f"warning: {w}", file=sys.stderr)
        if len(d.segments) < 2:
            print(f"note: {d.why_no_pairs()}", file=sys.stderr)
    return state


def serve(cfg: LabelConfig) -> None:
    """Build the app and serve it until Ctrl-C (returns at once under NiceGUI's test simulation)."""
    simulated = helpers.is_user_simulation()
    if not simulated:
        check_port_free(cfg.host, cfg.port)
    state = build_app(cfg)
    if not simulated:
        # What start-up loaded lives as long as the server (300,000 labels are 600,000 objects the
        # collector tracks): frozen out of its sight, a full collection takes microseconds, not
        # the half second every tab's requests waited for. Refcounting still frees what is dropped.
        gc.freeze()
        total = sum(len(d.segments) for d in state.dbs)
        shown = "localhost" if cfg.host in ("127.0.0.1", "::1") else cfg.host
        window = f" (pairs from the {cfg.recent} newest of each DB)" if cfg.recent else ""
        print(f"Labeling {total} segments of {', '.join(d.name for d in state.dbs)}{window}", flush=True)
        if cfg.token_generated:  # only this terminal sees it: other accounts of the machine cannot label
            print(f"Open http://{shown}:{cfg.port}/label?token={cfg.token}  (this run's token; --no-token: none)")
        else:
            print(f"Open http://{shown}:{cfg.port}/label" + ("  (asks for the token once)" if cfg.token else ""))
        sys.stdout.flush()
    try:
        ui.run(
            make_root(state),
            host=cfg.host,
            port=cfg.port,
            title="RLHF labels",
            favicon="🏷️",
            reload=False,
            show=False,
            show_welcome_message=False,
            uvicorn_logging_level="warning",
        )
    except KeyboardInterrupt:  # Ctrl-C: every answer is on disk already (fsync per answer)
        print("stopped", file=sys.stderr)
