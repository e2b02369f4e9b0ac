"""``02_label_ui.py``'s command line: ``LabelConfig`` declares each flag once (``lib.core.settings``);
``parse_label_config`` checks it and fills in the DBs, the token and the cache directory. Every
mistake ends in one line."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from lib.core import settings
from lib.core.errors import UserError, warn
from lib.core.files import read_regular
from lib.core.settings import SEED_CHECKS, Check, check_between, check_fields, setting
from lib.label_ui.oracle import MAX_LABEL_RATE, PAPER_HORIZON, SCHEDULES, FollowSettings
from lib.label_ui.sampling import MODEL_MODES, POOL_FACTOR, RETIRED_SAMPLING_MODES, SAMPLING_MODES
from lib.models.teachers import (
    DEFAULT_DEATH_PENALTY,
    DEFAULT_TEACHER,
    TEACHERS,
    TIE_RULES,
    death_penalty_for,
    teacher_help,
)
from lib.store.labels import LABELS_FILE
from lib.store.segments import check_same_game

TOKEN_ENV = "RLHF_LABEL_TOKEN"
MAX_PAIRS = 10_000  # one tab's list
MAX_ORACLE = 10_000_000
MAX_POOL = 10_000_000
MAX_RECENT = 10_000_000
MIN_POLL, MAX_POLL = 0.05, 3600.0
CACHE_SUBDIR = Path("rlhf-atari") / "clips"  # under the user's cache directory: the clips' default home
GROUPS = {  # --help's groups, in order, and their titles
    "core": "core",
    "page": "page: the server, its access and the clips",
    "labels": "labels: which pairs to ask",
    "oracle": "oracle: labels from a synthetic teacher, no server",
    "follow": "follow: --oracle N --follow labels while the agent trains",
}
FOLLOW_ONLY = ("schedule", "label_rate", "poll")  # given without --follow they are an error, not ignored


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where clips are cached without --cache-dir: ``$XDG_CACHE_HOME`` when absolute, else
    ``~/.cache``, under ``CACHE_SUBDIR``: the same from every working directory, outside every DB."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return (Path(xdg) if os.path.isabs(xdg) else home / ".cache") / CACHE_SUBDIR


def _path(text: str) -> Path:
    """A path argument; an empty one (which Path would read as the current directory) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


def _host_name(flag: str, what: str, refused: str) -> Check:
    """A check that the value can be a host name: not empty, no space and none of ``refused``."""
    return (
        lambda v: bool(v) and not any(c.isspace() or c in refused for c in v),
        f"{flag} must be {what}, got {{v!r}}",
    )


def _pair_count(flag: str, most: int) -> list[Check]:
    """Checks that a count of pairs (None: not given) lies in 1..``most``."""
    return [
        (lambda v: v is None or v >= 1, f"{flag} must be at least 1 pair, got {{v}}"),
        (lambda v: v is None or v <= most, f"{flag} must be at most {most:,} pairs, got {{v}}"),
    ]


@dataclass(frozen=True)
class LabelConfig:
    """Everything the label server and the oracle are told: each field but the last three is one
    flag (``setting``), in ``--help`` order. ``parse_label_config`` fills in what a flag leaves open
    (None: not given): the token, the cache directory, the death penalty, the follow schedule."""

    # core
    db: list[str] = setting(
        help="segment DB (made by 01_a2c.py --db-path); repeat for several DBs",
        group="core",
        flags=("-d", "--db"),
        action="append",
        metavar="DIR",
    )
    seed: int | None = setting(
        None,
        "random seed for the pair lists / oracle pairs",
        group="core",
        type=int,
        checks=SEED_CHECKS,
    )
    labeler: str | None = setting(None, "name stored with every answer (field 'labeler')", group="core")
    # page: the server, its access and the clips
    host: str = setting(
        "127.0.0.1",
        "address to listen on (default %(default)s; another address needs --token)",
        group="page",
        checks=[_host_name("--host", "an address or a host name", "/\\@?#")],
    )
    port: int = setting(
        8080,
        "port (default %(default)s)",
        group="page",
        checks=[(lambda v: 0 < v < 65536, "--port must be between 1 and 65535, got {v}")],
    )
    token: str | None = setting(
        None,
        f"ask every browser for this token once; visible to other users in ps, so prefer ${TOKEN_ENV} or --token-file",
        group="page",
    )
    token_file: Path | None = setting(
        None, "read the token from the first line of FILE", group="page", type=_path, metavar="FILE"
    )
    no_token: bool = setting(
        False,
        "no token on loopback (by default one is made at start and printed in the page's URL): "
        "then every account of this machine can label",
        group="page",
    )
    public_host: list[str] | None = setting(
        None,
        "a host name browsers use to reach the server besides its address and localhost "
        "(e.g. the machine's DNS name with --host 0.0.0.0); others are refused (DNS rebinding)",
        group="page",
        action="append",
        metavar="NAME",
        checks=[_host_name("--public-host", "a host name or an address", "/\\@?#,")],
    )
    fps: float = setting(
        15.0,
        "clip speed in agent steps per second at 1x (default %(default)g = game speed)",
        group="page",
        checks=[(lambda v: 0.5 <= v <= 120, "--fps must be in [0.5, 120] agent steps per second, got {v:g}")],
    )
    cache_dir: Path | None = setting(
        None,
        lambda: (
            f"where encoded clips are cached (default: {CACHE_SUBDIR} in the user's cache directory, "
            f"$XDG_CACHE_HOME or ~/.cache, wherever the page is started: here {default_cache_dir()})"
        ),
        group="page",
        type=_path,
    )
    # labels: which pairs to ask
    pairs: int = setting(
        20,
        "length of each tab's list of pairs (default %(default)s)",
        group="labels",
        checks=[(lambda v: 1 <= v <= MAX_PAIRS, f"--pairs must be between 1 and {MAX_PAIRS}, got {{v}}")],
    )
    reward: Path | None = setting(
        None,
        "a reward model (03_reward_train.py): the page shows its per-step prediction under each clip and "
        "its P(#1 better), Existing labels its 'model vs you' view; --sampling picks pairs by it",
        group="labels",
        type=_path,
        metavar="MODEL",
        checks=[
            (lambda v: v is None or v.is_file(), "--reward {v}: no such file (a model made by 03_reward_train.py)")
        ],
    )
    sampling: str = setting(
        "random",
        "which pairs to ask about: 'random'; 'uncertain', those the model's predicted preference is "
        "closest to 50/50 on (from --pool random candidates); 'disagree', those an ensemble model's members "
        "disagree on most; 'exploits', first the segments the model overrates most against their true return; "
        "'rare', first the segments that look least like the others (no model). uncertain, disagree and "
        "exploits need --reward; --oracle picks the same way",
        group="labels",
        choices=SAMPLING_MODES,
        retired=RETIRED_SAMPLING_MODES,
    )
    pool: int | None = setting(
        None,
        f"random candidate pairs that uncertain / disagree choose from (default {POOL_FACTOR}x the pairs wanted)",
        group="labels",
        type=int,
        metavar="N",
        checks=_pair_count("--pool", MAX_POOL),
    )
    recent: int = setting(
        0,
        "draw pairs only from the N newest segments of each DB, newest by the step counter in the name "
        "(NN/SSSSSSSS.dat), with any --sampling, the page and --oracle alike: what the agent does now "
        "(default %(default)s = every segment)",
        group="labels",
        metavar="N",
        checks=[
            (
                lambda v: 0 <= v <= MAX_RECENT,
                f"--recent must be between 0 (every segment) and {MAX_RECENT:,} segments, got {{v}}",
            )
        ],
    )
    control_rate: float = setting(
        0.05,
        "share of list entries that show again a pair this labeler answered, order swapped, unmarked; "
        "Overview reports how often the answers agree (default %(default)g; 0 turns it off)",
        group="labels",
        metavar="P",
        checks=[(lambda v: 0 <= v <= 1, "--control-rate must be in [0, 1], got {v:g}")],
    )
    # oracle: labels from a synthetic teacher, no server
    oracle: int | None = setting(
        None,
        "label N new pairs of each DB (random, or as --sampling picks) with a synthetic teacher "
        "(--teacher), print a summary and exit (with --follow: as the clips appear)",
        group="oracle",
        type=int,
        metavar="N",
        checks=_pair_count("--oracle", MAX_ORACLE),
    )
    teacher: str = setting(DEFAULT_TEACHER, "with --oracle: " + teacher_help(), group="oracle", choices=TEACHERS)
    teacher_noise: float = setting(
        0.0,
        "with --oracle: share of answers that are random (#1 or #2 at random), as the paper models people",
        group="oracle",
        metavar="P",
        checks=[(lambda v: 0 <= v <= 1, "--teacher-noise must be in [0, 1], got {v:g}")],
    )
    teacher_ties: str = setting(
        "equal",
        "with --oracle: when the teacher sees no difference, answer 'equal' (0) or 'skip' (-1, can't tell)",
        group="oracle",
        choices=TIE_RULES,
    )
    death_penalty: float | None = setting(  # None: the teacher's own (death_penalty_for)
        None,
        "with --oracle and the score teacher: each life lost in a clip costs P points of its sum, as the "
        f"papers' synthetic oracles penalise an episode end (default {DEFAULT_DEATH_PENALTY:g}, chosen in "
        "docs/results.md; 0: a clip where the sub dies ties with one where it idles)",
        group="oracle",
        type=float,
        metavar="P",
    )
    # follow: --oracle N --follow labels while the agent trains; None: not given (FollowSettings' default)
    follow: bool = setting(
        False,
        "with --oracle N: keep running, look for new segments every --poll seconds, label new pairs as "
        "the schedule owes them, stop once N labels are written per DB (or at Ctrl-C / SIGTERM: every label "
        "so far is whole in labels.jsonl); the agent's steps T are the sum over env directories of the largest "
        "step counter in their segment names",
        group="follow",
    )
    schedule: str | None = setting(
        None,
        f"with --follow: labels owed by agent step T, the DB's labels at start included: 'constant', "
        f"--label-rate R per 1,000 steps (R/1000 * T labels); 'paper', Christiano et al.'s rate falling as "
        f"H/(T + H), H = {PAPER_HORIZON:,.0f} steps (R/1000 * H * ln(1 + T/H) labels) "
        f"(default {FollowSettings.schedule})",
        group="follow",
        choices=SCHEDULES,
    )
    label_rate: float | None = setting(
        None,
        f"with --follow: labels per 1,000 agent steps (for 'paper' at the start) (default {FollowSettings.rate:g})",
        group="follow",
        type=float,
        metavar="R",
        checks=[
            (
                lambda v: v is None or 0 < v <= MAX_LABEL_RATE,  # also refuses nan
                f"--label-rate must be more than 0 and at most {MAX_LABEL_RATE:g} labels per 1,000 agent steps, "
                "got {v:g}",
            )
        ],
    )
    poll: float | None = setting(
        None,
        f"with --follow: how often to look for new segments (default {FollowSettings.poll:g})",
        group="follow",
        type=float,
        metavar="SECONDS",
        checks=[
            (
                lambda v: v is None or MIN_POLL <= v <= MAX_POLL,
                f"--poll must be in [{MIN_POLL:g}, {MAX_POLL:g}] seconds, got {{v:g}}",
            )
        ],
    )
    # set by parse_label_config
    dbs: tuple[Path, ...] = ()  # -d/--db, checked: directories of one game
    public_hosts: tuple[str, ...] = ()  # --public-host's names
    token_generated: bool = False  # no token given: one was made for this run (printed at start)

    def check(self) -> None:
        """UserError with one line for the first value that cannot work: each flag's own checks in
        ``--help`` order, then the checks between flags."""
        check_fields(self)
        wrong = [
            (self.sampling in MODEL_MODES and self.reward is None, f"--sampling {self.sampling} picks pairs by the reward model's view: pass --reward MODEL"),  # noqa: E501
            (self.follow and self.oracle is None, "--follow needs --oracle N (the label page picks up new segments by itself)"),  # noqa: E501
            *((getattr(self, name) is not None and not self.follow, f"--{name.replace('_', '-')} is for --oracle N --follow: add --follow") for name in FOLLOW_ONLY),  # noqa: E501
            (self.token is not None and self.token_file is not None, "give the token once: --token or --token-file"),
        ]  # fmt: skip
        check_between(wrong)

    def allowed_hosts(self) -> set[str]:
        """Host names the server answers to: its address, loopback names, and --public-host."""
        return {self.host, "localhost", "127.0.0.1", "::1", *self.public_hosts}


def _refuse(message: str) -> NoReturn:
    """argparse's mistakes as a UserError: one line (``error: ...``) and exit 2, no usage block."""
    raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    """02_label_ui.py's flags in groups (``--help``), one per ``LabelConfig`` flag field."""
    p = settings.build_parser(
        LabelConfig,
        "02_label_ui.py",
        "Label pairs of clips from segment DBs in a web page (or with --oracle, from true rewards).",
        GROUPS,
    )
    p.error = _refuse  # type: ignore[method-assign]
    return p


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine (127.x, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_label_config(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> LabelConfig:
    """Parse and check the command line, then fill in what it leaves open; UserError with one line
    for any mistake."""
    environ = os.environ if environ is None else environ
    cfg = LabelConfig(**vars(build_parser().parse_args(argv)))
    dbs = _checked_dbs(cfg.db)
    cfg.check()
    try:
        death_penalty = death_penalty_for(cfg.teacher, cfg.death_penalty)
    except ValueError as e:
        raise UserError(str(e)) from None
    token, generated = _access_token(cfg, environ)
    cache_dir = _checked_cache_dir(cfg, dbs, environ)
    if cfg.token is not None:
        warn(f"--token is visible to every user of this machine (ps); prefer ${TOKEN_ENV} or --token-file")
    return replace(
        cfg,
        dbs=tuple(dbs),
        public_hosts=tuple(cfg.public_host or ()),
        token=token,
        token_generated=generated,
        cache_dir=cache_dir,
        death_penalty=death_penalty,
        schedule=FollowSettings.schedule if cfg.schedule is None else cfg.schedule,
        label_rate=FollowSettings.rate if cfg.label_rate is None else cfg.label_rate,
        poll=FollowSettings.poll if cfg.poll is None else cfg.poll,
    )


def _checked_dbs(given: list[str]) -> list[Path]:
    """-d/--db: existing directories, each once, of one game, whose labels.jsonl can be appended to."""
    dbs: list[Path] = []
    for d in given:
        if not d.strip():
            raise UserError("-d/--db: an empty path; pass a segment DB made by 01_a2c.py --db-path (e.g. -d db/v0)")
        path = Path(d)
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "not found"
            raise UserError(f"DB {d} {what}: pass a segment DB made by 01_a2c.py --db-path (e.g. -d db/v0)")
        if path.resolve() in {p.resolve() for p in dbs}:
            raise UserError(f"DB {d} is given twice")
        dbs.append(path)
    check_same_game(dbs, "labeling")
    for path in dbs:
        labels = path / LABELS_FILE
        if labels.is_symlink() or (labels.exists() and not labels.is_file()):
            what = "a symlink" if labels.is_symlink() else "not a regular file"
            raise UserError(f"{labels} is {what}: refusing to write labels through it (make it a plain file)")
        check_single_link(labels)
    return dbs


def _access_token(cfg: LabelConfig, environ: dict[str, str] | os._Environ[str]) -> tuple[str | None, bool]:
    """The token every browser must give once, and whether it was made here (none given, loopback)."""
    token = _token(cfg, environ)
    if cfg.no_token and token is not None:
        raise UserError("--no-token and a token (--token, --token-file or $RLHF_LABEL_TOKEN) contradict each other")
    if token is not None and len(token) > 1024:
        raise UserError(f"the token must have at most 1024 characters, got {len(token)}")
    if token is not None and len(token) < 8:
        raise UserError(
            "--token must have at least 8 characters (e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if cfg.oracle is None and not is_loopback(cfg.host) and token is None:
        raise UserError(
            f"refusing to listen on {cfg.host} without a token: anyone who can reach it could read and change "
            f"labels; pass --token (or set {TOKEN_ENV}), or keep 127.0.0.1 and reach it with "
            f"ssh -L {cfg.port}:127.0.0.1:{cfg.port} <server>"
        )
    generated = cfg.oracle is None and token is None and not cfg.no_token
    if generated:  # loopback: other accounts of this machine reach it too, so a token by default
        token = secrets.token_urlsafe()
    return token, generated


def _checked_cache_dir(cfg: LabelConfig, dbs: list[Path], environ: Mapping[str, str]) -> Path:
    """--cache-dir (default ``default_cache_dir``), resolved, never inside a DB; made and checked
    writable when a page will serve clips."""
    given = cfg.cache_dir if cfg.cache_dir is not None else default_cache_dir(environ)
    cache_dir = given.resolve()
    for db in dbs:
        root = db.resolve()
        if cache_dir == root or root in cache_dir.parents:
            raise UserError(f"--cache-dir {given} is inside the DB {db}: put clips outside segment directories")
    return _cache_dir(given) if cfg.oracle is None else cache_dir


def check_single_link(labels: Path) -> None:
    """UserError when ``labels`` has another name (a hard link): an append would write there too."""
    try:
        st = labels.lstat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"cannot read {labels}: {e.strerror}") from None
    if st.st_nlink > 1:
        raise UserError(
            f"{labels} has {st.st_nlink} hard links: refusing to append labels to a file with another name "
            "(copy it: cp labels.jsonl x && mv x labels.jsonl)"
        )


def _cache_dir(given: Path) -> Path:
    """--cache-dir resolved and created; UserError when it cannot be a directory we write to."""
    try:
        path = given.resolve()
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except FileExistsError:
        raise UserError(f"--cache-dir {given} is a file, not a directory: pass a directory for clips") from None
    except (OSError, RuntimeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise UserError(f"--cache-dir {given} cannot be used ({why}): pass a directory you can write to") from None
    return path


def _token(cfg: LabelConfig, environ: dict[str, str] | os._Environ[str]) -> str | None:
    """The token from --token (with a warning: ps shows it), --token-file, or the environment."""
    if cfg.token is not None:
        return cfg.token
    if cfg.token_file is not None:
        try:
            text = read_regular(cfg.token_file, 4096).decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read --token-file {cfg.token_file}: {getattr(e, 'strerror', None) or e}") from None
        token = text.splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise UserError(f"--token-file {cfg.token_file} is empty")
        return token
    return environ.get(TOKEN_ENV) or None


def check_port_free(host: str, port: int) -> None:
    """Fail with one line (instead of uvicorn's traceback) when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port} ({e.strerror}): pick another --port") from None
