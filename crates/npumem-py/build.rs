//! Builds libnpumem (crates/npumem-capi, the C ABI) with the same profile as the extension and
//! puts it and its header into the Python package (python/npumem), so that every way of
//! building npumem — `maturin build`, `maturin develop`, `pip install .`, a wheel built from
//! the sdist — ships `libnpumem.so` and `npumem.h` beside `_native` (pyproject.toml's
//! `include` names them for the wheel).
//!
//! - The nested build has a target directory of its own (`<target>/capi`): the outer build
//!   holds the lock of its own directory for as long as this script runs.
//! - The files are replaced by a rename, never rewritten in place: a process may have the old
//!   library loaded.
//! - It passes on PyO3's cfgs of the interpreter (`Py_GIL_DISABLED`) to the crate.
//! - Under `cargo clippy`, or with `NPUMEM_SKIP_CAPI=1`, it does nothing: a lint must not
//!   replace the shipped library with one of its own profile.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Puts a copy of `from` at `to`, unless `to` already holds the same bytes (so that a build
/// that changed nothing leaves the files, and the next build, alone).
fn replace(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display()));
    if std::fs::read(to).is_ok_and(|old| old == bytes) {
        return;
    }
    let staged = to.with_extension("staged");
    std::fs::write(&staged, &bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", staged.display()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if to.extension().is_some_and(|e| e == "so") { 0o755 } else { 0o644 };
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("cannot set the mode of {}: {e}", staged.display()));
    }
    std::fs::rename(&staged, to)
        .unwrap_or_else(|e| panic!("cannot move {} to {}: {e}", staged.display(), to.display()));
}

fn main() {
    // The interpreter's cfgs, for this crate's own `cfg(Py_GIL_DISABLED)`.
    pyo3_build_config::use_pyo3_cfgs();
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    let capi = root.join("crates/npumem-capi");
    let package = root.join("python/npumem");
    println!("cargo:rerun-if-env-changed=NPUMEM_SKIP_CAPI");
    for path in ["crates/npumem-capi", "crates/npumem-core", "crates/npumem-base", "crates/npumem-ffi"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    // (A missing one makes cargo run this again.)
    for file in ["libnpumem.so", "npumem.h"] {
        println!("cargo:rerun-if-changed={}", package.join(file).display());
    }
    let clippy = std::env::var("RUSTC_WORKSPACE_WRAPPER").is_ok_and(|w| w.contains("clippy"));
    if clippy || std::env::var("NPUMEM_SKIP_CAPI").is_ok_and(|v| v == "1") || !capi.exists() {
        return;
    }
    let profile = std::env::var("PROFILE").expect("cargo sets PROFILE");
    // OUT_DIR is <target>/<profile>/build/npumem-py-<hash>/out.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = out.ancestors().nth(4).map_or_else(|| root.join("target"), Path::to_path_buf).join("capi");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-q", "-p", "npumem-capi", "--manifest-path"]).arg(root.join("Cargo.toml"));
    build.arg("--target-dir").arg(&target);
    if profile == "release" {
        build.arg("--release");
    }
    // The outer build's settings for its own crate must not leak into the nested one.
    for var in ["CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR", "CARGO_ENCODED_RUSTFLAGS"] {
        build.env_remove(var);
    }
    let status = build.status().expect("cannot run cargo for libnpumem");
    assert!(status.success(), "building libnpumem (crates/npumem-capi) failed: {status}");
    replace(&target.join(&profile).join("libnpumem.so"), &package.join("libnpumem.so"));
    replace(&capi.join("include/npumem.h"), &package.join("npumem.h"));
}
