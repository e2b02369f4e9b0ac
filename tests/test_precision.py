"""01_a2c.py --precision: auto picks bf16 only where the hardware computes it, and a run records what it used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib.a2c.run import cpu_has_native_bf16, resolve_precision

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
WITHOUT = (
    "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n"
)
AVX512_BF16 = WITHOUT.replace("avx512_vnni", "avx512_vnni avx512_bf16")
AMX = WITHOUT.replace("avx512_vnni", "amx_bf16 amx_tile")


@pytest.mark.parametrize(("cpuinfo", "native"), [(WITHOUT, False), (AVX512_BF16, True), (AMX, True), ("", False)])
def test_native_bf16_is_read_from_the_cpus_flags(cpuinfo: str, native: bool) -> None:
    assert cpu_has_native_bf16(cpuinfo) is native


def test_a_flag_named_elsewhere_in_cpuinfo_is_no_flag() -> None:
    """Only the ``flags`` lines count (a model name or a bug list that mentions bf16 does not)."""
    assert not cpu_has_native_bf16(WITHOUT + "model name\t: avx512_bf16 capable\nbugs\t\t: amx_bf16\n")


def test_auto_is_fp32_on_a_cpu_without_native_bf16_and_bf16_with_it() -> None:
    assert resolve_precision("auto", CPU, WITHOUT) == "fp32"
    assert resolve_precision("auto", CPU, AVX512_BF16) == "bf16"
    assert resolve_precision("auto", CPU, AMX) == "bf16"
    for given in ("fp32", "bf16"):  # what a user names is what runs
        assert resolve_precision(given, CPU, WITHOUT) == resolve_precision(given, CPU, AMX) == given


def test_a_run_at_auto_records_the_precision_this_machine_has(tmp_path: Path) -> None:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    expected = "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"
    argv = ["-n", "p", "--precision", "auto", "--max-steps", "64", "--envs", "2", "--test-every", "0"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "01_a2c.py"), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    ck = torch.load(tmp_path / "saves" / "p" / "last.pt", weights_only=True)
    assert ck["precision"] == expected
    assert ("bf16 forward passes" in r.stdout) is (expected == "bf16")
