"""npumem installed the way Python users install it: a wheel built by plain `maturin build`
(what `pip install .` runs too) into a fresh virtual environment carries libnpumem.so and
npumem.h, and the C ABI loads and allocates from there; the sdist carries the sources they are
built from (crates/npumem-capi and the build script that builds it).

The wheel is built from the release artifacts `make build` left (for the same interpreter, so
nothing is compiled again: a few seconds); the fresh environment gets numpy from pip (its
cache, or the index).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

USE_THE_LIBRARY = r"""
import ctypes, json, os, sys
import npumem.capi as capi
lib = capi.load()
lib.npumem_init(1)
p = lib.npumem_malloc(1 << 20, 0, None)
ctypes.memset(p, 7, 1 << 20)
lib.npumem_free(p, 1 << 20, 0, None)
stats = capi.device_stats(lib, 0)
print(json.dumps({
    "library": capi.library_path(), "header": capi.header_path(), "prefix": sys.prefix,
    "error": lib.npumem_last_error(), "allocated": stats["allocation.all.allocated"],
}))
"""


def maturin(*args: str, out: Path) -> Path:
    command = [sys.executable, "-m", "maturin", *args, "-o", str(out)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.iterdir()
    return built


def test_a_wheel_installed_in_a_fresh_environment_carries_the_c_abi(tmp_path):
    wheel = maturin("build", "--release", "-q", "-i", sys.executable, out=tmp_path / "wheels")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NPUMEM_", "VIRTUAL_ENV", "PYTHON"))}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        env=clean,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    # Run away from the source tree, so that `import npumem` is the installed package.
    proc = subprocess.run(
        [str(python), "-c", USE_THE_LIBRARY], capture_output=True, text=True, env=clean, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    site = Path(out["prefix"]).resolve()
    assert site == env_dir.resolve()
    for key in ("library", "header"):
        assert Path(out[key]).resolve().is_relative_to(site), f"{key} {out[key]} is not the installed one"
    assert Path(out["header"]).read_text().startswith("/*\n * npumem.h")
    assert out["error"] is None and out["allocated"] == 1
    # The wheel's library is the one the extension's build script built (target/capi), which is
    # what puts it into the package in a tree `make build` never ran in.
    built = ROOT / "target" / "capi" / "release" / "libnpumem.so"
    assert Path(out["library"]).read_bytes() == built.read_bytes()


def test_the_sdist_carries_what_builds_the_c_abi(tmp_path):
    sdist = maturin("sdist", out=tmp_path)
    with tarfile.open(sdist) as tar:
        names = {Path(n).relative_to(Path(n).parts[0]).as_posix() for n in tar.getnames() if len(Path(n).parts) > 1}
        manifest = tar.extractfile(next(n for n in tar.getnames() if n.endswith("/Cargo.toml") and n.count("/") == 1))
        workspace = manifest.read().decode() if manifest else ""
    for name in (
        "crates/npumem-py/build.rs",
        "crates/npumem-capi/Cargo.toml",
        "crates/npumem-capi/src/lib.rs",
        "crates/npumem-capi/include/npumem.h",
    ):
        assert name in names, f"the sdist lacks {name}"
    assert '"crates/npumem-capi"' in workspace, "the sdist's workspace does not build npumem-capi"
