"""H.264 MP4s, the one place they are written: gameplay videos (``Mp4Writer``, streamed frame by
frame in constant memory, with an optional GIF and the reward strip under the frame) and the label
page's clips (``encode_mp4``). Every MP4 comes from the ffmpeg binary inside the imageio-ffmpeg
wheel, in yuv420p (what every browser decodes) with ``+faststart`` (playback starts before the whole
file arrives), at 15 fps (game speed), the frame scaled 2x with nearest neighbour (sharp pixels, no
chroma smear on single-pixel objects)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import cv2
import numpy as np

from lib.core.errors import UserError
from lib.core.files import atomic_write, install, new_temp_beside

GAME_FPS = 15  # 60 Hz Atari / frame skip 4
SCALE = 2  # game pixels -> video pixels (nearest neighbour), for videos and the label page's clips
CRF = 18  # H.264 quality of every MP4 we write (lower = better; 18 keeps Atari's flat colours clean)
NICENESS = 10  # clip encodes are background work: the browser and the label page go first


def _ffmpeg() -> Any:
    """imageio_ffmpeg, imported when a video is written: its wheel (an ffmpeg binary) is needed only
    for video, so training and labeling run where it is missing."""
    try:
        import imageio_ffmpeg
    except ImportError:
        raise UserError("writing video needs imageio-ffmpeg: pip install imageio-ffmpeg") from None
    return imageio_ffmpeg


def h264_options(crf: int = CRF) -> list[str]:
    """The ffmpeg options every MP4 here is written with (videos of games and the label page's clips)."""
    return ["-preset", "veryfast", "-crf", str(crf), "-movflags", "+faststart"]


STRIP_HEIGHT = 92  # 420 + 92 = 512: frame with strip is a multiple of 16 (H.264 macroblocks)

# Colours of the reward view (RGB).
_BG = (24, 24, 32)
_GRID = (70, 70, 84)
_TEXT = (220, 220, 220)
_PRED = (255, 150, 40)
_TRUE = (80, 220, 100)
_NEG = (230, 70, 70)
_FONT = cv2.FONT_HERSHEY_PLAIN


def upscale(frame: np.ndarray, scale: int = SCALE) -> np.ndarray:
    """(H, W, 3) uint8 -> (H*scale, W*scale, 3) uint8, nearest neighbour (sharp Atari pixels)."""
    return np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)


def compose(frame: np.ndarray, strip: np.ndarray | None = None) -> np.ndarray:
    """The video frame: the game frame (210, 160, 3) scaled up, with the reward strip below. Returns
    (210*SCALE [+ strip height], 160*SCALE, 3) uint8."""
    big = upscale(frame)
    if strip is None:
        return big
    if strip.shape[1] != big.shape[1]:
        raise ValueError(f"strip is {strip.shape[1]} px wide, the frame {big.shape[1]} px")
    return np.concatenate([big, strip], axis=0)


class RewardStrip:
    """The reward view drawn under each video frame: the model's normalised prediction (orange,
    -clip to +clip, values beyond drawn at the edge) over the true reward of each step (green bars
    up, red down, scaled to the episode's largest), under a line with step, score and current
    prediction. It keeps the whole episode's history and draws the last ``window`` steps, the newest
    at the right edge."""

    def __init__(
        self, clip: float, name: str = "", width: int = 160 * SCALE, height: int = STRIP_HEIGHT, step_px: int = 2
    ):
        """``clip``: the lane's edge; ``name``: the reward's path, written in the lower lane (what
        the line shows: 'norm window 25, clip sign, scale 1')."""
        if height < 60:
            raise ValueError(f"reward strip needs at least 60 px height, got {height}")
        self.width = width
        self.height = height
        self.step_px = step_px
        self.clip = clip
        self.name = name
        self.window = width // step_px
        self.pred: list[float] = []
        self.true: list[float] = []
        self.score = 0.0
        self._max_abs_true = 0.0

    def add(self, pred_norm: float, true_reward: float) -> None:
        """Append one agent step: normalised predicted reward and the true game reward."""
        self.pred.append(float(pred_norm))
        self.true.append(float(true_reward))
        self.score += float(true_reward)
        self._max_abs_true = max(self._max_abs_true, abs(float(true_reward)))

    def render(self) -> np.ndarray:
        """(height, width, 3) uint8 RGB image of the last ``window`` steps."""
        img = np.empty((self.height, self.width, 3), dtype=np.uint8)
        img[:] = _BG
        n = len(self.pred)
        header = 13
        pred_top, pred_bot = header + 2, int(self.height * 0.66)  # upper lane
        true_top, true_bot = pred_bot + 4, self.height - 3  # lower lane
        mid = (pred_top + pred_bot) // 2

        # Grid: zero line and +-clip edges of the prediction lane, base line of the true lane.
        cv2.line(img, (0, mid), (self.width - 1, mid), _GRID, 1)
        for y in (pred_top, pred_bot):
            cv2.line(img, (0, y), (self.width - 1, y), (44, 44, 56), 1)
        cv2.line(img, (0, true_bot), (self.width - 1, true_bot), _GRID, 1)
        cv2.putText(img, f"+{self.clip:g}", (2, pred_top + 9), _FONT, 0.7, _GRID, 1, cv2.LINE_AA)
        cv2.putText(img, f"-{self.clip:g}", (2, pred_bot - 2), _FONT, 0.7, _GRID, 1, cv2.LINE_AA)

        cur = self.pred[-1] if n else 0.0
        cv2.putText(img, "pred", (3, 10), _FONT, 0.8, _PRED, 1, cv2.LINE_AA)
        cv2.putText(img, f"{cur:+.2f}", (36, 10), _FONT, 0.8, _PRED, 1, cv2.LINE_AA)
        cv2.putText(img, "true reward", (92, 10), _FONT, 0.8, _TRUE, 1, cv2.LINE_AA)
        text = f"step {n}  score {self.score:g}"
        (tw, _), _ = cv2.getTextSize(text, _FONT, 0.8, 1)
        cv2.putText(img, text, (self.width - tw - 3, 10), _FONT, 0.8, _TEXT, 1, cv2.LINE_AA)
        if self.name:
            cv2.putText(img, self.name, (3, true_top + 9), _FONT, 0.7, _GRID, 1, cv2.LINE_AA)
        if n == 0:
            return img

        lo = max(0, n - self.window)
        pred = np.clip(np.asarray(self.pred[lo:], dtype=np.float32), -self.clip, self.clip)
        true = np.asarray(self.true[lo:], dtype=np.float32)
        xs = np.arange(len(pred)) * self.step_px + self.step_px // 2

        # True rewards: one bar per rewarded step.
        if self._max_abs_true > 0:
            lane = true_bot - true_top
            for x, r in zip(xs[true != 0], true[true != 0], strict=True):
                h = max(2, int(round(abs(r) / self._max_abs_true * lane)))
                colour = _TRUE if r > 0 else _NEG
                cv2.rectangle(img, (int(x) - 1, true_bot - h), (int(x), true_bot), colour, -1)

        # Prediction: a polyline over the lane.
        half = (pred_bot - pred_top) / 2
        ys = np.round(mid - pred / self.clip * half).astype(np.int32)
        pts = np.stack([xs, ys], axis=1).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(img, [pts], False, _PRED, 2, cv2.LINE_AA)  # 2 px: survives yuv420p chroma
        cv2.circle(img, (int(xs[-1]), int(ys[-1])), 2, _PRED, -1)  # the current step
        return img


def _encoder(w: int, h: int, fps: float, out: str, options: list[str], crf: int = CRF) -> list[str]:
    """The ffmpeg command that reads raw RGB frames (h, w, 3) from stdin and writes an H.264 yuv420p
    MP4 to ``out``; ``options`` (filters, tuning) go before the codec's."""
    return [
        _ffmpeg().get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", f"{fps:g}", "-i", "pipe:0",
        *options, "-c:v", "libx264", *h264_options(crf), "-pix_fmt", "yuv420p", "-an", "-f", "mp4", "-y", out,
    ]  # fmt: skip


def _fd_path(fd: int) -> str:
    """How a child that inherited ``fd`` names it: ffmpeg's open() of ``/dev/fd/N`` reopens that very
    file (Linux), whatever the name it was created under points to by then, and it can be reopened
    for reading (``+faststart`` reads the MP4 back to move its index to the front)."""
    return f"/dev/fd/{fd}"


class Mp4Writer:
    """Streams RGB frames (H, W, 3) uint8 into an H.264 yuv420p MP4 at game speed. ffmpeg writes to
    the descriptor of a new unique temp file beside ``path`` (``lib.core.files.new_temp_beside``), never
    to a name, so a planted link is never followed; ``close()`` renames it to ``path``, so an
    interrupted run leaves no truncated file there. Height and width must be even (yuv420p)."""

    def __init__(self, path: str | os.PathLike, width: int, height: int, fps: float = GAME_FPS, crf: int = CRF):
        if width % 2 or height % 2:
            raise ValueError(f"yuv420p needs even frame sizes, got {width}x{height}")
        self.path = Path(path)
        self.size = (width, height)
        self.frames = 0
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 -- closed with the video; a file, unlike a pipe, never fills
        self._fd, self._tmp = -1, ""
        try:
            self._fd, self._tmp = new_temp_beside(self.path)
            cmd = _encoder(width, height, fps, _fd_path(self._fd), [], crf)
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=self._err, pass_fds=(self._fd,))
        except BaseException:
            self._discard()
            raise

    def add(self, frame: np.ndarray) -> None:
        """Append one frame (height, width, 3) uint8 RGB."""
        if frame.shape != (self.size[1], self.size[0], 3) or frame.dtype != np.uint8:
            raise ValueError(f"frame must be {(self.size[1], self.size[0], 3)} uint8, got {frame.shape} {frame.dtype}")
        try:
            self._proc.stdin.write(np.ascontiguousarray(frame).tobytes())
        except OSError:
            why = self._finish()
            self._discard()
            raise UserError(f"could not write video {self.path}: {why}") from None
        self.frames += 1

    def close(self) -> Path:
        """Finish the file (ffmpeg flushes and writes the index) and move it to its final name."""
        why = self._finish()
        if why or self.frames == 0 or os.fstat(self._fd).st_size == 0:
            self._discard()
            raise UserError(f"ffmpeg wrote no video to {self.path}: {why or 'disk full?'}")
        os.close(self._fd)
        self._fd = -1
        self._err.close()
        install(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Stop ffmpeg and remove the partial file (nothing to do once closed or aborted)."""
        if self._fd < 0:
            return
        try:
            self._proc.kill()
            self._finish()
        finally:
            self._discard()

    def _finish(self) -> str:
        """Close ffmpeg's input and wait for it; '' when it ended well, else its last error line."""
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        if self._proc.wait() == 0:
            return ""
        self._err.seek(0)
        err = self._err.read().decode(errors="replace").strip()
        return (err.splitlines() or [f"ffmpeg exited with {self._proc.returncode}"])[-1][:160]

    def _discard(self) -> None:
        self._err.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def mp4_to_gif(mp4: str | os.PathLike, gif: str | os.PathLike) -> Path:
    """Make an animated GIF of an MP4 with ffmpeg's two-pass palette, in constant memory for any
    game length. GIF delays are in 10 ms units, so 15 fps plays 5% slow. Written like the MP4."""
    mp4, gif = Path(mp4), Path(gif)
    exe = _ffmpeg().get_ffmpeg_exe()
    base = [exe, "-y", "-v", "error", "-i", str(mp4)]
    with tempfile.TemporaryDirectory(dir=gif.parent, prefix=".palette-") as d:  # a new directory of ours
        palette = str(Path(d) / "palette.png")
        _run_ffmpeg([*base, "-vf", "palettegen=stats_mode=full", palette], gif)

        def paletteuse(f: BinaryIO) -> None:
            out = ["-i", palette, "-lavfi", "paletteuse=dither=none", "-f", "gif", _fd_path(f.fileno())]
            _run_ffmpeg([*base, *out], gif, pass_fds=(f.fileno(),))

        atomic_write(gif, paletteuse)
    return gif


def _run_ffmpeg(cmd: list[str], gif: Path, pass_fds: tuple[int, ...] = ()) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, pass_fds=pass_fds)
    if res.returncode != 0:
        msg = (res.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise UserError(f"could not make GIF {gif}: ffmpeg: {msg[:160]}")


def encode_mp4(frames: np.ndarray, fps: float, out: Path, scale: int = SCALE) -> None:
    """Encode (T, H, W, 3) uint8 RGB frames to an H.264 MP4 at ``fps``, every frame shown, the index
    at the front. RuntimeError with ffmpeg's message when encoding fails."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(f"frames must be (T, H, W, 3) uint8 with T > 0, got {frames.shape} {frames.dtype}")
    _, h, w, _ = frames.shape
    scaled = ["-vf", f"scale={w * scale}:{h * scale}:flags=neighbor", "-tune", "animation", "-threads", "1"]
    cmd = _encoder(w, h, fps, str(out), scaled)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with contextlib.suppress(OSError):  # encoding is background work: the browser and the UI go first
        os.setpriority(os.PRIO_PROCESS, proc.pid, NICENESS)
    _, stderr = proc.communicate(np.ascontiguousarray(frames).tobytes())
    if proc.returncode != 0:
        raise RuntimeError(f"ffmpeg failed ({proc.returncode}): {stderr.decode(errors='replace').strip()[-300:]}")
