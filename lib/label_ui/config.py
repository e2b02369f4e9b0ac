"""Command-line arguments of ``02_label_ui.py`` and the checks that turn mistakes into one line."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import NoReturn

from lib.errors import UserError, warn
from lib.files import read_regular
from lib.labels import LABELS_FILE
from lib.oracle import MAX_LABEL_RATE, PAPER_HORIZON, SCHEDULES
from lib.sampling import MODEL_MODES, POOL_FACTOR, SAMPLING_MODES
from lib.seeds import check_seed
from lib.segments import check_same_game
from lib.teachers import DEFAULT_DEATH_PENALTY, DEFAULT_TEACHER, TEACHERS, TIE_RULES, death_penalty_for, teacher_help

TOKEN_ENV = "RLHF_LABEL_TOKEN"
MAX_PAIRS = 10_000  # one tab's list
MAX_ORACLE = 10_000_000
MAX_POOL = 10_000_000
MAX_RECENT = 10_000_000
MIN_POLL, MAX_POLL = 0.05, 3600.0
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_SUBDIR = Path("rlhf-atari") / "clips"  # under the user's cache directory: the clips' default home


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where clips are cached without --cache-dir: the user's cache directory (``$XDG_CACHE_HOME``
    when it is an absolute path, as the XDG base-directory rule says, else ``~/.cache``) under
    ``CACHE_SUBDIR``: the same from every working directory, outside the code and every DB."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return (Path(xdg) if os.path.isabs(xdg) else home / ".cache") / CACHE_SUBDIR


@dataclass(frozen=True)
class LabelConfig:
    """Everything the label server needs; built by ``parse_config`` from the command line."""

    dbs: tuple[Path, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    pairs: int = 20
    token: str | None = None
    token_generated: bool = False  # no token given: one was made for this run (printed at start)
    fps: float = 15.0
    cache_dir: Path = field(default_factory=default_cache_dir)
    oracle: int | None = None
    teacher: str = DEFAULT_TEACHER
    teacher_noise: float = 0.0
    teacher_ties: str = "equal"
    death_penalty: float = 0.0  # the resolved one (--death-penalty unset: the teacher's default)
    seed: int | None = None
    labeler: str | None = None
    public_hosts: tuple[str, ...] = ()
    reward: Path | None = None
    sampling: str = "random"
    pool: int | None = None
    control_rate: float = 0.05
    recent: int = 0  # 0: pairs from every segment; N: from the N newest of each DB
    follow: bool = False  # --oracle N --follow: label as clips appear, at a schedule
    schedule: str = "constant"
    label_rate: float = 1.0  # labels per 1,000 agent steps (paper: at the start)
    poll: float = 2.0  # seconds between looks at the DB(s) when following

    def allowed_hosts(self) -> set[str]:
        """Host names the server answers to: its address, loopback names, and --public-host."""
        return {self.host, "localhost", "127.0.0.1", "::1", *self.public_hosts}


def _path(text: str) -> Path:
    """A path argument; an empty one (which Path would read as the current directory) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is a UserError: one line (``error: ...``) and exit 2, no usage block."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    """02_label_ui.py's flags in groups (``--help``); every default comes from ``LabelConfig``."""
    p = _Parser(
        prog="02_label_ui.py",
        description="Label pairs of clips from segment DBs in a web page (or with --oracle, from true rewards).",
    )
    core = p.add_argument_group("core")
    core.add_argument(
        "-d",
        "--db",
        action="append",
        required=True,
        metavar="DIR",
        help="segment DB (made by 01_a2c.py --db-path); repeat for several DBs",
    )
    core.add_argument(
        "--seed", type=int, default=LabelConfig.seed, help="random seed for the pair lists / oracle pairs"
    )
    core.add_argument("--labeler", default=LabelConfig.labeler, help="name stored with every answer (field 'labeler')")
    _add_page_args(p.add_argument_group("page: the server, its access and the clips"))
    _add_pair_args(p.add_argument_group("labels: which pairs to ask"))
    _add_oracle_args(p.add_argument_group("oracle: labels from a synthetic teacher, no server"))
    _add_follow_args(p.add_argument_group("follow: --oracle N --follow labels while the agent trains"))
    return p


def _add_page_args(p: argparse._ArgumentGroup) -> None:
    """The server, its access and the clips."""
    d = LabelConfig
    p.add_argument(
        "--host",
        default=d.host,
        help="address to listen on (default 127.0.0.1; another address needs --token)",
    )
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port})")
    p.add_argument(
        "--token",
        default=None,
        help=f"ask every browser for this token once; visible to other users in ps, so prefer ${TOKEN_ENV} "
        "or --token-file",
    )
    p.add_argument(
        "--token-file", type=_path, default=None, metavar="FILE", help="read the token from the first line of FILE"
    )
    p.add_argument(
        "--no-token",
        action="store_true",
        help="no token on loopback (by default one is made at start and printed in the page's URL): "
        "then every account of this machine can label",
    )
    p.add_argument(
        "--public-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name browsers use to reach the server besides its address and localhost "
        "(e.g. the machine's DNS name with --host 0.0.0.0); others are refused (DNS rebinding)",
    )
    p.add_argument(
        "--fps",
        type=float,
        default=d.fps,
        help="clip speed in agent steps per second at 1x (default 15 = game speed)",
    )
    p.add_argument(
        "--cache-dir",
        type=_path,
        default=None,
        help=f"where encoded clips are cached (default: {CACHE_SUBDIR} in the user's cache directory, "
        f"$XDG_CACHE_HOME or ~/.cache, wherever the page is started: here {default_cache_dir()})",
    )


def _add_oracle_args(p: argparse._ArgumentGroup) -> None:
    """--oracle and its synthetic teacher."""
    d = LabelConfig
    p.add_argument(
        "--oracle",
        type=int,
        default=None,
        metavar="N",
        help="label N new pairs of each DB (random, or as --sampling picks) with a synthetic teacher "
        "(--teacher), print a summary and exit (with --follow: as the clips appear)",
    )
    p.add_argument(
        "--teacher",
        choices=TEACHERS,
        default=d.teacher,
        help="with --oracle: " + teacher_help(),
    )
    p.add_argument(
        "--teacher-noise",
        type=float,
        default=d.teacher_noise,
        metavar="P",
        help="with --oracle: share of answers that are random (#1 or #2 at random), as the paper models people",
    )
    p.add_argument(
        "--teacher-ties",
        choices=TIE_RULES,
        default=d.teacher_ties,
        help="with --oracle: when the teacher sees no difference, answer 'equal' (0) or 'skip' (-1, can't tell)",
    )
    p.add_argument(
        "--death-penalty",
        type=float,
        default=None,
        metavar="P",
        help="with --oracle and the score teacher: each life lost in a clip costs P points of its sum, as the "
        f"papers' synthetic oracles penalise an episode end (default {DEFAULT_DEATH_PENALTY:g}, chosen in "
        "docs/results.md; 0: a clip where the sub dies ties with one where it idles)",
    )


def _add_follow_args(p: argparse._ArgumentGroup) -> None:
    """--follow and its schedule (given without --follow they are an error, not ignored)."""
    d = LabelConfig
    p.add_argument(
        "--follow",
        action="store_true",
        help="with --oracle N: keep running, look for new segments every --poll seconds, label new pairs as "
        "the schedule owes them, stop once N labels are written per DB (or at Ctrl-C / SIGTERM: every label "
        "so far is whole in labels.jsonl); the agent's steps T are the sum over env directories of the largest "
        "step counter in their segment names",
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help=f"with --follow: labels owed by agent step T, the DB's labels at start included: 'constant', "
        f"--label-rate R per 1,000 steps (R/1000 * T labels); 'paper', Christiano et al.'s rate falling as "
        f"H/(T + H), H = {PAPER_HORIZON:,.0f} steps (R/1000 * H * ln(1 + T/H) labels) (default {d.schedule})",
    )
    p.add_argument(
        "--label-rate",
        type=float,
        default=None,
        metavar="R",
        help=f"with --follow: labels per 1,000 agent steps (for 'paper' at the start) (default {d.label_rate:g})",
    )
    p.add_argument(
        "--poll",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"with --follow: how often to look for new segments (default {d.poll:g})",
    )


def _add_pair_args(p: argparse._ArgumentGroup) -> None:
    """Which pairs to ask, the reward model's view, control pairs."""
    d = LabelConfig
    p.add_argument("--pairs", type=int, default=d.pairs, help=f"length of each tab's list of pairs (default {d.pairs})")
    p.add_argument(
        "--reward",
        type=_path,
        default=None,
        metavar="MODEL",
        help="a reward model (03_reward_train.py): the page shows its per-step prediction under each clip and "
        "its P(#1 better), Existing labels its 'model vs you' view; --sampling picks pairs by it",
    )
    p.add_argument(
        "--sampling",
        choices=SAMPLING_MODES,
        default=d.sampling,
        help="which pairs to ask about: 'random'; 'uncertain', those the model's predicted preference is "
        "closest to 50/50 on (from --pool random candidates); 'disagree', those an ensemble model's members "
        "disagree on most; 'exploits', first the segments the model overrates most against their true return; "
        "'rare', first the segments that look least like the others (no model); 'gauge' (SeaQuest), clips with a "
        "low oxygen gauge and a diver aboard paired with each other, then rare's pairs (no model). uncertain, "
        "disagree and exploits need --reward; --oracle picks the same way",
    )
    p.add_argument(
        "--pool",
        type=int,
        default=None,
        metavar="N",
        help=f"random candidate pairs that uncertain / disagree choose from (default {POOL_FACTOR}x the pairs wanted)",
    )
    p.add_argument(
        "--recent",
        type=int,
        default=d.recent,
        metavar="N",
        help="draw pairs only from the N newest segments of each DB, newest by the step counter in the name "
        "(NN/SSSSSSSS.dat), with any --sampling, the page and --oracle alike: what the agent does now "
        "(default 0 = every segment)",
    )
    p.add_argument(
        "--control-rate",
        type=float,
        default=d.control_rate,
        metavar="P",
        help="share of list entries that show again a pair this labeler answered, order swapped, unmarked; "
        "Overview reports how often the answers agree (default 0.05; 0 turns it off)",
    )


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine (127.x, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_config(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> LabelConfig:
    """Parse and check the command line; every mistake raises UserError with one line."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    dbs = _checked_dbs(args.db)
    _check_values(args)
    token, generated = _access_token(args, environ)
    cache_dir = _checked_cache_dir(args, dbs, environ)
    if args.token is not None:
        warn(f"--token is visible to every user of this machine (ps); prefer ${TOKEN_ENV} or --token-file")
    same = {f.name: getattr(args, f.name) for f in fields(LabelConfig) if hasattr(args, f.name)}
    return replace(
        LabelConfig(dbs=tuple(dbs)),
        **{k: v for k, v in same.items() if k not in ("token", "cache_dir")},
        public_hosts=tuple(args.public_host),
        token=token,
        token_generated=generated,
        cache_dir=cache_dir,
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


def _check_values(args: argparse.Namespace) -> None:
    """Every number and name in range (UserError with one line)."""
    if args.seed is not None:
        check_seed(args.seed)
    if not 1 <= args.pairs <= MAX_PAIRS:
        raise UserError(f"--pairs must be between 1 and {MAX_PAIRS}, got {args.pairs}")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be between 1 and 65535, got {args.port}")
    if not 0.5 <= args.fps <= 120:
        raise UserError(f"--fps must be in [0.5, 120] agent steps per second, got {args.fps:g}")
    if not args.host or any(c.isspace() or c in "/\\@?#" for c in args.host):
        raise UserError(f"--host must be an address or a host name, got {args.host!r}")
    for name in args.public_host:
        if not name or any(c.isspace() or c in "/\\@?#," for c in name):
            raise UserError(f"--public-host must be a host name or an address, got {name!r}")
    if args.oracle is not None and not 1 <= args.oracle <= MAX_ORACLE:
        what = "at least 1 pair" if args.oracle < 1 else f"at most {MAX_ORACLE:,} pairs"
        raise UserError(f"--oracle must be {what}, got {args.oracle}")
    if args.sampling in MODEL_MODES and args.reward is None:
        raise UserError(f"--sampling {args.sampling} picks pairs by the reward model's view: pass --reward MODEL")
    if args.reward is not None and not args.reward.is_file():
        raise UserError(f"--reward {args.reward}: no such file (a model made by 03_reward_train.py)")
    if not 0.0 <= args.control_rate <= 1.0:
        raise UserError(f"--control-rate must be in [0, 1], got {args.control_rate:g}")
    if args.pool is not None and not 1 <= args.pool <= MAX_POOL:
        what = "at least 1 pair" if args.pool < 1 else f"at most {MAX_POOL:,} pairs"
        raise UserError(f"--pool must be {what}, got {args.pool}")
    if not 0.0 <= args.teacher_noise <= 1.0:
        raise UserError(f"--teacher-noise must be in [0, 1], got {args.teacher_noise:g}")
    try:
        args.death_penalty = death_penalty_for(args.teacher, args.death_penalty)
    except ValueError as e:
        raise UserError(str(e)) from None
    if not 0 <= args.recent <= MAX_RECENT:
        raise UserError(f"--recent must be between 0 (every segment) and {MAX_RECENT:,} segments, got {args.recent}")
    _check_follow(args)


def _check_follow(args: argparse.Namespace) -> None:
    """--follow needs --oracle; its schedule flags need --follow; then the defaults fill in."""
    if args.follow and args.oracle is None:
        raise UserError("--follow needs --oracle N (the label page picks up new segments by itself)")
    for flag in ("schedule", "label_rate", "poll"):
        if getattr(args, flag) is not None and not args.follow:
            raise UserError(f"--{flag.replace('_', '-')} is for --oracle N --follow: add --follow")
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(LabelConfig, flag))
    if not (0 < args.label_rate <= MAX_LABEL_RATE):  # also refuses nan
        raise UserError(
            f"--label-rate must be more than 0 and at most {MAX_LABEL_RATE:g} labels per 1,000 agent steps, "
            f"got {args.label_rate:g}"
        )
    if not MIN_POLL <= args.poll <= MAX_POLL:
        raise UserError(f"--poll must be in [{MIN_POLL:g}, {MAX_POLL:g}] seconds, got {args.poll:g}")


def _access_token(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> tuple[str | None, bool]:
    """The token every browser must give once, and whether it was made here (none given, loopback)."""
    token = _token(args, environ)
    if args.no_token and token is not None:
        raise UserError("--no-token and a token (--token, --token-file or $RLHF_LABEL_TOKEN) contradict each other")
    if token is not None and len(token) > 1024:
        raise UserError(f"the token must have at most 1024 characters, got {len(token)}")
    if token is not None and len(token) < 8:
        raise UserError(
            "--token must have at least 8 characters (e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if args.oracle is None and not is_loopback(args.host) and token is None:
        raise UserError(
            f"refusing to listen on {args.host} without a token: anyone who can reach it could read and change "
            f"labels; pass --token (or set {TOKEN_ENV}), or keep 127.0.0.1 and reach it with "
            f"ssh -L {args.port}:127.0.0.1:{args.port} <server>"
        )
    generated = args.oracle is None and token is None and not args.no_token
    if generated:  # loopback: other accounts of this machine reach it too, so a token by default
        token = secrets.token_urlsafe()
    return token, generated


def _checked_cache_dir(args: argparse.Namespace, dbs: list[Path], environ: Mapping[str, str]) -> Path:
    """--cache-dir (``default_cache_dir`` when not given), resolved, never inside a DB; made (and
    checked writable) when a page will serve clips."""
    given = args.cache_dir if args.cache_dir is not None else default_cache_dir(environ)
    cache_dir = given.resolve()
    for db in dbs:
        root = db.resolve()
        if cache_dir == root or root in cache_dir.parents:
            raise UserError(f"--cache-dir {given} is inside the DB {db}: put clips outside segment directories")
    return _cache_dir(given) if args.oracle is None else cache_dir


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


def _token(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> str | None:
    """The token from --token (with a warning: ps shows it), --token-file, or the environment."""
    if args.token is not None and args.token_file is not None:
        raise UserError("give the token once: --token or --token-file")
    if args.token is not None:
        return args.token
    if args.token_file is not None:
        try:
            text = read_regular(args.token_file, 4096).decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(
                f"cannot read --token-file {args.token_file}: {getattr(e, 'strerror', None) or e}"
            ) from None
        token = text.splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise UserError(f"--token-file {args.token_file} is empty")
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
