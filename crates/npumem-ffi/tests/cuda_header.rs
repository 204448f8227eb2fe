//! npumem's CUDA declarations against the real `cuda.h`: a C program compiled against each
//! header found — 12.x from PyPI's `nvidia-cuda-runtime-cu12` and 13.x from the
//! `nvidia-cuda-runtime` torch brings, both in the project's .venv (requirements-dev.txt), or
//! `NPUMEM_CUDA_INCLUDE` — prints every constant of npumem's tables and the size, alignment and
//! field offsets of every struct, and checks at compile time that each function npumem loads
//! has the prototype npumem declares (written in C below, one line per `PFN_`).
//!
//! - Under `CI=true` a missing header fails the test: the set-up installs it;
//! - only the C compiler (`cc`) is needed: nothing is linked against the driver.

use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use npumem_ffi::cuda::*;

/// npumem's `PFN_` declarations (crates/npumem-ffi/src/cuda.rs) as C function types.
const PROTOTYPES: &[(&str, &str)] = &[
    ("cuInit", "CUresult (*)(unsigned int)"),
    ("cuDriverGetVersion", "CUresult (*)(int *)"),
    ("cuDeviceGetCount", "CUresult (*)(int *)"),
    ("cuDeviceGet", "CUresult (*)(CUdevice *, int)"),
    ("cuDeviceCanAccessPeer", "CUresult (*)(int *, CUdevice, CUdevice)"),
    ("cuDevicePrimaryCtxRetain", "CUresult (*)(CUcontext *, CUdevice)"),
    ("cuDevicePrimaryCtxRelease_v2", "CUresult (*)(CUdevice)"),
    ("cuCtxGetCurrent", "CUresult (*)(CUcontext *)"),
    ("cuCtxSetCurrent", "CUresult (*)(CUcontext)"),
    ("cuCtxSynchronize", "CUresult (*)(void)"),
    ("cuMemAddressReserve", "CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)"),
    ("cuMemAddressFree", "CUresult (*)(CUdeviceptr, size_t)"),
    (
        "cuMemCreate",
        "CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)",
    ),
    ("cuMemRelease", "CUresult (*)(CUmemGenericAllocationHandle)"),
    ("cuMemMap", "CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)"),
    ("cuMemUnmap", "CUresult (*)(CUdeviceptr, size_t)"),
    ("cuMemSetAccess", "CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)"),
    (
        "cuMemGetAllocationGranularity",
        "CUresult (*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)",
    ),
    ("cuMemcpyHtoD_v2", "CUresult (*)(CUdeviceptr, const void *, size_t)"),
    ("cuMemcpyDtoH_v2", "CUresult (*)(void *, CUdeviceptr, size_t)"),
    ("cuMemcpyDtoD_v2", "CUresult (*)(CUdeviceptr, CUdeviceptr, size_t)"),
    ("cuMemcpyHtoDAsync_v2", "CUresult (*)(CUdeviceptr, const void *, size_t, CUstream)"),
    ("cuMemcpyDtoHAsync_v2", "CUresult (*)(void *, CUdeviceptr, size_t, CUstream)"),
    ("cuMemcpyDtoDAsync_v2", "CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream)"),
    ("cuMemcpyAsync", "CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream)"),
    ("cuMemsetD8_v2", "CUresult (*)(CUdeviceptr, unsigned char, size_t)"),
    ("cuMemsetD8Async", "CUresult (*)(CUdeviceptr, unsigned char, size_t, CUstream)"),
    ("cuMemGetInfo_v2", "CUresult (*)(size_t *, size_t *)"),
    ("cuMemAlloc_v2", "CUresult (*)(CUdeviceptr *, size_t)"),
    ("cuMemFree_v2", "CUresult (*)(CUdeviceptr)"),
    ("cuMemAllocHost_v2", "CUresult (*)(void **, size_t)"),
    ("cuMemFreeHost", "CUresult (*)(void *)"),
    ("cuStreamCreate", "CUresult (*)(CUstream *, unsigned int)"),
    ("cuStreamDestroy_v2", "CUresult (*)(CUstream)"),
    ("cuStreamSynchronize", "CUresult (*)(CUstream)"),
    ("cuStreamQuery", "CUresult (*)(CUstream)"),
    ("cuStreamWaitEvent", "CUresult (*)(CUstream, CUevent, unsigned int)"),
    ("cuEventCreate", "CUresult (*)(CUevent *, unsigned int)"),
    ("cuEventDestroy_v2", "CUresult (*)(CUevent)"),
    ("cuEventRecord", "CUresult (*)(CUevent, CUstream)"),
    ("cuEventQuery", "CUresult (*)(CUevent)"),
    ("cuEventSynchronize", "CUresult (*)(CUevent)"),
    ("cuGetErrorName", "CUresult (*)(CUresult, const char **)"),
    ("cuGetErrorString", "CUresult (*)(CUresult, const char **)"),
];

/// The struct fields npumem declares, as (struct, field) pairs the program reports offsets of.
const FIELDS: &[(&str, &str)] = &[
    ("CUmemLocation", "type"),
    ("CUmemLocation", "id"),
    ("CUmemAccessDesc", "location"),
    ("CUmemAccessDesc", "flags"),
    ("CUmemAllocationProp", "type"),
    ("CUmemAllocationProp", "requestedHandleTypes"),
    ("CUmemAllocationProp", "location"),
    ("CUmemAllocationProp", "win32HandleMetaData"),
    ("CUmemAllocationProp", "allocFlags"),
    ("CUmemAllocationProp", "allocFlags.compressionType"),
    ("CUmemAllocationProp", "allocFlags.gpuDirectRDMACapable"),
    ("CUmemAllocationProp", "allocFlags.usage"),
    ("CUmemAllocationProp", "allocFlags.reserved"),
];

/// npumem's values of what the program reports, in its order.
fn ours() -> Vec<(String, u64)> {
    let tables: [&[(u32, &std::ffi::CStr)]; 7] = [
        MEM_ALLOCATION_TYPES,
        MEM_HANDLE_TYPES,
        MEM_LOCATION_TYPES,
        MEM_ACCESS_FLAGS,
        MEM_GRANULARITY_FLAGS,
        STREAM_FLAGS,
        EVENT_FLAGS,
    ];
    let mut out: Vec<(String, u64)> =
        ERRORS.iter().map(|&(v, n)| (n.to_str().unwrap().to_string(), v as u64)).collect();
    for table in tables {
        out.extend(table.iter().map(|&(v, n)| (n.to_str().unwrap().to_string(), u64::from(v))));
    }
    out.push(("CU_STREAM_LEGACY".into(), CU_STREAM_LEGACY as u64));
    out.push(("CU_STREAM_PER_THREAD".into(), CU_STREAM_PER_THREAD as u64));
    let layout = |name: &str, size: usize, align: usize| {
        [(format!("sizeof {name}"), size as u64), (format!("alignof {name}"), align as u64)]
    };
    out.extend(layout("CUmemLocation", size_of::<CUmemLocation>(), align_of::<CUmemLocation>()));
    out.extend(layout("CUmemAccessDesc", size_of::<CUmemAccessDesc>(), align_of::<CUmemAccessDesc>()));
    out.extend(layout("CUmemAllocationProp", size_of::<CUmemAllocationProp>(), align_of::<CUmemAllocationProp>()));
    out.extend(layout("CUdeviceptr", size_of::<CUdeviceptr>(), align_of::<CUdeviceptr>()));
    out.extend(layout("CUresult", size_of::<CUresult>(), align_of::<CUresult>()));
    let flags = offset_of!(CUmemAllocationProp, allocFlags);
    let offsets = [
        offset_of!(CUmemLocation, type_),
        offset_of!(CUmemLocation, id),
        offset_of!(CUmemAccessDesc, location),
        offset_of!(CUmemAccessDesc, flags),
        offset_of!(CUmemAllocationProp, type_),
        offset_of!(CUmemAllocationProp, requestedHandleTypes),
        offset_of!(CUmemAllocationProp, location),
        offset_of!(CUmemAllocationProp, win32HandleMetaData),
        flags,
        flags + offset_of!(CUmemAllocationPropAllocFlags, compressionType),
        flags + offset_of!(CUmemAllocationPropAllocFlags, gpuDirectRDMACapable),
        flags + offset_of!(CUmemAllocationPropAllocFlags, usage),
        flags + offset_of!(CUmemAllocationPropAllocFlags, reserved),
    ];
    for (&(s, f), offset) in FIELDS.iter().zip(offsets) {
        out.push((format!("offsetof {s}.{f}"), offset as u64));
    }
    out
}

/// The C program: the values under the header's names, one `name value` line each.
fn program() -> String {
    let mut c = String::from("#include <cuda.h>\n#include <stddef.h>\n#include <stdio.h>\n\n");
    for (symbol, ty) in PROTOTYPES {
        writeln!(c, "_Static_assert(__builtin_types_compatible_p(__typeof__(&{symbol}), {ty}), \"{symbol}\");")
            .unwrap();
    }
    c.push_str("\nint main(void) {\n");
    for (name, _) in ours() {
        let expr = if let Some(ty) = name.strip_prefix("sizeof ") {
            format!("sizeof({ty})")
        } else if let Some(ty) = name.strip_prefix("alignof ") {
            format!("_Alignof({ty})")
        } else if let Some(field) = name.strip_prefix("offsetof ") {
            let (s, f) = field.split_once('.').unwrap();
            format!("offsetof({s}, {f})")
        } else {
            format!("(size_t){name}")
        };
        writeln!(c, "    printf(\"{name} %llu\\n\", (unsigned long long)({expr}));").unwrap();
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// The include directories with a `cuda.h` to check against.
fn headers() -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("NPUMEM_CUDA_INCLUDE") {
        return std::env::split_paths(&dir).collect();
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    let mut found = Vec::new();
    for python in std::fs::read_dir(&lib).into_iter().flatten().flatten() {
        let nvidia = python.path().join("site-packages/nvidia");
        for package in std::fs::read_dir(&nvidia).into_iter().flatten().flatten() {
            let include = package.path().join("include");
            if include.join("cuda.h").is_file() {
                found.push(include);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn declarations_match_the_real_cuda_h() {
    let dirs = headers();
    if dirs.is_empty() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no cuda.h: `make build` installs requirements-dev.txt (nvidia-cuda-runtime-cu12) into .venv"
        );
        eprintln!("no cuda.h found (install requirements-dev.txt into .venv, or set NPUMEM_CUDA_INCLUDE)");
        return;
    }
    let work = std::env::temp_dir().join(format!("npumem-cuda-header-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let source = work.join("layout.c");
    std::fs::write(&source, program()).unwrap();
    let expected: Vec<String> = ours().iter().map(|(n, v)| format!("{n} {v}")).collect();
    for (i, dir) in dirs.iter().enumerate() {
        let exe = work.join(format!("layout{i}"));
        let build = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-std=c11", "-Wall", "-Werror", "-I"])
            .arg(dir)
            .arg(&source)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("a C compiler (cc)");
        assert!(build.status.success(), "{}: {}", dir.display(), String::from_utf8_lossy(&build.stderr));
        let run = Command::new(&exe).output().unwrap();
        let got: Vec<String> = String::from_utf8(run.stdout).unwrap().lines().map(str::to_string).collect();
        for (want, have) in expected.iter().zip(&got) {
            assert_eq!(want, have, "npumem's declaration against {}/cuda.h", dir.display());
        }
        assert_eq!(got.len(), expected.len());
    }
    let _ = std::fs::remove_dir_all(&work);
}
