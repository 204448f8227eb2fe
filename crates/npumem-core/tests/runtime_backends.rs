//! The AscendCL and CUDA backends against the stand-in runtimes (crates/npumem-fake-acl and
//! crates/npumem-fake-cuda, built by `make test-rust` before these tests; `NPUMEM_STAND_INS`
//! names their directory, target/debug by default): the loaded-library wrappers call by call
//! with their error codes, the streams and events really asynchronous, and random VMM programs
//! — with faults injected by the stand-in's switch — against a simple model, after which the
//! stand-in holds nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex, MutexGuard};

use libloading::Library;
use npumem_core::acl::{MemAttr, MemcpyKind};
use npumem_core::backend::ffi::Candidate;
use npumem_core::backend::{AclBackend, AclDriver, AclRuntime, Backend, CudaBackend, CudaDriver, CudaRuntime, Driver};
use npumem_core::stream::RuntimeStreams;
use npumem_core::units::{GIB, KIB, MIB};
use npumem_core::vm::{PageKind, PageSize};
use npumem_core::{AclError, ErrorCode};
use proptest::prelude::*;

/// The stand-ins' live counts (`npumem_fake_live_counts`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LiveCounts {
    handles: u64,
    mappings: u64,
    reservations: u64,
    streams: u64,
    events: u64,
    host_blocks: u64,
    physical_bytes: u64,
    faults_fired: u64,
}

impl LiveCounts {
    /// Everything but the faults fired.
    fn held(self) -> [u64; 7] {
        [
            self.handles,
            self.mappings,
            self.reservations,
            self.streams,
            self.events,
            self.host_blocks,
            self.physical_bytes,
        ]
    }
}

/// A stand-in library and its test-only calls; the lock keeps one test at a time on it.
struct StandIn {
    path: String,
    library: Library,
    lock: Mutex<()>,
}

impl StandIn {
    fn new(file: &str) -> StandIn {
        let dir = std::env::var("NPUMEM_STAND_INS")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/debug").to_string());
        let path = format!("{dir}/{file}");
        assert!(
            std::path::Path::new(&path).exists(),
            "{path} is missing: build the stand-ins first (cargo build -p npumem-fake-acl -p npumem-fake-cuda)"
        );
        // SAFETY: the stand-in's initialisers have no preconditions.
        let library = unsafe { Library::new(&path) }.unwrap();
        StandIn { path, library, lock: Mutex::new(()) }
    }

    fn candidate(&self) -> Vec<Candidate> {
        vec![Candidate::new("the test", self.path.clone())]
    }

    fn hold(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn counts(&self) -> LiveCounts {
        let mut c = LiveCounts::default();
        // SAFETY: the stand-in's signature; a valid out-pointer.
        unsafe {
            let f =
                self.library.get::<unsafe extern "C" fn(*mut LiveCounts) -> i32>(b"npumem_fake_live_counts").unwrap();
            assert_eq!(f(&mut c), 0);
        }
        c
    }

    fn fail_next(&self, kind: u32, n: u64) {
        // SAFETY: the stand-in's signature.
        unsafe {
            let f = self.library.get::<unsafe extern "C" fn(u32, u64) -> i32>(b"npumem_fake_fail_next").unwrap();
            assert_eq!(f(kind, n), 0);
        }
    }

    /// Makes the `n`th call of `kind` from now and every later one fail (0 disarms).
    fn fail_from(&self, kind: u32, n: u64) {
        // SAFETY: the stand-in's signature.
        unsafe {
            let f = self.library.get::<unsafe extern "C" fn(u32, u64) -> i32>(b"npumem_fake_fail_from").unwrap();
            assert_eq!(f(kind, n), 0);
        }
    }

    fn set_delay_us(&self, us: u64) {
        // SAFETY: the stand-in's signature.
        unsafe {
            let f = self.library.get::<unsafe extern "C" fn(u64)>(b"npumem_fake_set_delay_us").unwrap();
            f(us);
        }
    }
}

static ACL: LazyLock<StandIn> = LazyLock::new(|| StandIn::new("libascendcl.so"));
static CUDA: LazyLock<StandIn> = LazyLock::new(|| StandIn::new("libcuda.so"));

// Fault kinds of the switch.
const PHYSICAL: u32 = 0;
const MAP: u32 = 1;
const RESERVE: u32 = 2;
const MEMCPY: u32 = 4;
const RELEASE: u32 = 6;
const FREE_PHYSICAL: u32 = 7;
const STREAM: u32 = 8;
const HOST: u32 = 11;

fn acl() -> &'static AclRuntime {
    AclRuntime::load_from(&ACL.candidate()).unwrap()
}

fn cuda() -> &'static CudaRuntime {
    CudaRuntime::load_from(&CUDA.candidate()).unwrap()
}

fn expect_code<T>(r: Result<T, AclError>, code: ErrorCode, needles: &[&str]) {
    let Err(e) = r else { panic!("expected {code:?} with {needles:?}, got success") };
    assert_eq!(e.code, code, "{e}");
    for n in needles {
        assert!(e.message.contains(n), "{n:?} not in {e}");
    }
}

#[test]
fn acl_calls_codes_and_async_streams() {
    let _g = ACL.hold();
    let before = ACL.counts();
    let rt = acl();
    rt.use_device(0).unwrap();
    expect_code(
        rt.use_device(7),
        ErrorCode::InvalidParam,
        &["aclrtSetDevice(7)", "107001 (ACL_ERROR_RT_INVALID_DEVICEID)"],
    );
    assert_eq!(rt.granularity(MemAttr::MemNormal, 0).unwrap(), 4 * KIB);
    assert_eq!(rt.granularity(MemAttr::HbmNormal, 0).unwrap(), 2 * MIB, "ACL_HBM_MEM_NORMAL is allocated as huge");
    assert_eq!(rt.granularity(MemAttr::MemHuge1g, 0).unwrap(), GIB);
    expect_code(rt.granularity(MemAttr::Hbm, 0), ErrorCode::InvalidParam, &["100000 (ACL_ERROR_INVALID_PARAM)"]);
    // The documented rules, each with its code.
    expect_code(rt.reserve(0, None), ErrorCode::InvalidParam, &["aclrtReserveMemAddress"]);
    expect_code(rt.reserve(MIB, Some(0x1000)), ErrorCode::InvalidParam, &["expectPtr=0x1000"]);
    let va = rt.reserve(4 * MIB, None).unwrap();
    assert!((0x1000_0000_0000..0x1800_0000_0000).contains(&va) && va % (4 * MIB) == 0, "{va:#x}");
    expect_code(rt.malloc_physical(3 * KIB, MemAttr::MemNormal, 0), ErrorCode::InvalidParam, &["aclrtMallocPhysical"]);
    expect_code(rt.malloc_physical(128 * GIB, MemAttr::MemHuge, 0), ErrorCode::RtMemoryAllocation, &["207001"]);
    let h = rt.malloc_physical(2 * MIB, MemAttr::MemHuge, 0).unwrap();
    expect_code(rt.map(va, MIB, h), ErrorCode::InvalidParam, &["aclrtMapMem"]);
    expect_code(rt.map(va + 4096, 2 * MIB, h), ErrorCode::RtAddrUnaligned, &["107008"]);
    expect_code(rt.map(va, 2 * MIB, 0x77), ErrorCode::RtInvalidHandle, &["107017"]);
    rt.map(va, 2 * MIB, h).unwrap();
    rt.map(va + 2 * MIB, 2 * MIB, h).unwrap();
    expect_code(rt.release(va), ErrorCode::RtParamInvalid, &["aclrtReleaseMemAddress", "107000"]);
    // Copies and memsets, with count > destMax refused; two mappings of one handle alias.
    let data = b"npumem!";
    // SAFETY: host buffers valid for their lengths.
    unsafe {
        rt.memcpy(va + 8, 7, data.as_ptr() as u64, 7, MemcpyKind::HostToDevice).unwrap();
        let mut out = [0u8; 7];
        rt.memcpy(out.as_mut_ptr() as u64, 7, va + 2 * MIB + 8, 7, MemcpyKind::Default).unwrap();
        assert_eq!(&out, data);
        expect_code(
            rt.memcpy(out.as_mut_ptr() as u64, 6, va, 7, MemcpyKind::DeviceToHost),
            ErrorCode::RtParamInvalid,
            &["107000"],
        );
        expect_code(
            rt.memcpy(out.as_mut_ptr() as u64, 7, va + 4 * MIB - 4, 7, MemcpyKind::DeviceToHost),
            ErrorCode::RtParamInvalid,
            &[],
        );
        rt.memset(va + 9, 2, 0xAB, 2).unwrap();
        rt.memcpy(out.as_mut_ptr() as u64, 7, va + 8, 7, MemcpyKind::DeviceToHost).unwrap();
        assert_eq!(&out, b"n\xab\xabmem!");
    }
    expect_code(rt.memset(va, 1, 0, 2), ErrorCode::RtParamInvalid, &["aclrtMemset"]);
    let (free, total) = rt.mem_info(MemAttr::Hbm).unwrap();
    assert_eq!(total - free, 2 * MIB);
    assert_eq!(rt.mem_info(MemAttr::Ddr).unwrap(), (0, 0));
    // A copy of nothing is refused, as the runtime's checks refuse it.
    // SAFETY: no byte is copied.
    expect_code(unsafe { rt.memcpy(va, 8, va, 0, MemcpyKind::DeviceToDevice) }, ErrorCode::RtParamInvalid, &["107000"]);
    // Freeing a mapped handle is refused: unmapping first is aclrtFreePhysical's precondition.
    expect_code(rt.free_physical(h), ErrorCode::RtParamInvalid, &["aclrtFreePhysical", "107000"]);
    rt.unmap(va).unwrap();
    rt.unmap(va + 2 * MIB).unwrap();
    assert_eq!(ACL.counts().handles, before.handles + 1);
    rt.free_physical(h).unwrap();
    expect_code(rt.free_physical(h), ErrorCode::RtInvalidHandle, &[]);
    assert_eq!(ACL.counts().handles, before.handles);
    rt.release(va).unwrap();
    let p = rt.malloc_host(100).unwrap();
    assert_eq!(p % 64, 0);
    rt.free_host(p).unwrap();
    expect_code(rt.free_host(p), ErrorCode::RtParamInvalid, &["aclrtFreeHost"]);

    // Streams: work queued behind a delay is not done when the call returns; an event recorded
    // after it completes later; a stream made to wait for it runs after it.
    ACL.set_delay_us(3000);
    let (s1, s2) = (rt.create_stream().unwrap(), rt.create_stream().unwrap());
    let e = rt.create_event().unwrap();
    assert!(!rt.query_event(e).unwrap(), "never recorded: not ready (AscendCL's initial state)");
    let va = rt.reserve(64 * KIB, None).unwrap();
    let h = rt.malloc_physical(64 * KIB, MemAttr::MemNormal, 0).unwrap();
    rt.map(va, 64 * KIB, h).unwrap();
    let src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    // SAFETY: both host buffers outlive the stream synchronisations below.
    unsafe {
        rt.memcpy_async(va, src.as_ptr() as u64, 4096, s1).unwrap();
        rt.record_event(e, s1).unwrap();
        assert!(!rt.query_event(e).unwrap(), "recorded behind a delayed copy");
        rt.stream_wait_event(s2, e).unwrap();
        rt.memcpy_async(dst.as_mut_ptr() as u64, va, 4096, s2).unwrap();
    }
    rt.synchronize_stream(s2).unwrap();
    assert!(dst.iter().all(|&b| b == 7), "the second stream's copy ran after the first's");
    assert!(rt.query_event(e).unwrap());
    rt.synchronize_event(e).unwrap();
    ACL.set_delay_us(0);
    ACL.fail_next(STREAM, 1);
    expect_code(rt.create_stream(), ErrorCode::RtMemoryAllocation, &["207008 (ACL_ERROR_RT_NO_STREAM_RESOURCE)"]);
    expect_code(rt.destroy_stream(0x99), ErrorCode::RtInvalidHandle, &[]);
    for s in [s1, s2] {
        rt.destroy_stream(s).unwrap();
    }
    rt.destroy_event(e).unwrap();
    rt.unmap(va).unwrap();
    rt.free_physical(h).unwrap();
    rt.release(va).unwrap();
    rt.synchronize_device().unwrap();
    assert_eq!(ACL.counts().held(), before.held(), "every object given back");
}

#[test]
fn acl_calls_need_a_current_device_on_each_thread() {
    let _g = ACL.hold();
    let driver = AclDriver::new(acl(), 0).unwrap();
    std::thread::spawn(move || {
        // A fresh thread has no current device: the driver makes it current before each call.
        let rt = driver.runtime();
        expect_code(rt.reserve(MIB, None), ErrorCode::RtDrvInternal, &["107002 (ACL_ERROR_RT_CONTEXT_NULL)"]);
        let va = driver.reserve(MIB, 0, None).unwrap();
        driver.release(va, MIB).unwrap();
        // AscendCL cannot clear a thread's device without releasing it: it stays current.
        assert_eq!(rt.current_device(), Some(0));
    })
    .join()
    .unwrap();
}

#[test]
fn cuda_calls_leave_the_threads_context_as_they_found_it() {
    let _g = CUDA.hold();
    let driver = CudaDriver::new(cuda(), 0, Some(64 * MIB)).unwrap();
    let context = cuda().primary_context(0).unwrap();
    std::thread::spawn(move || {
        let mut driver = driver;
        let rt = driver.runtime();
        assert_eq!(rt.current_context(), None);
        let h = driver.create(2 * MIB, PageKind::Normal).unwrap();
        driver.free(h).unwrap();
        assert_eq!(rt.current_context(), None, "a thread with no context has none after a call");
        rt.use_context(context).unwrap();
        let e = driver.create_event().unwrap();
        assert!(driver.query_event(e).unwrap(), "a never-recorded CUDA event is complete");
        driver.destroy_event(e).unwrap();
        assert_eq!(rt.current_context(), Some(context));
    })
    .join()
    .unwrap();
}

#[test]
fn cuda_calls_codes_and_async_streams() {
    let _g = CUDA.hold();
    let before = CUDA.counts();
    let rt = cuda();
    let ctx = rt.primary_context(0).unwrap();
    rt.use_context(ctx).unwrap();
    expect_code(rt.primary_context(3), ErrorCode::InvalidParam, &["cuDeviceGet(3)", "CUDA_ERROR_INVALID_DEVICE (101)"]);
    assert_eq!(rt.granularity(0).unwrap(), 2 * MIB, "one granularity, 2 MiB as on current GPUs");
    expect_code(
        rt.reserve(MIB, 0, None),
        ErrorCode::RtParamInvalid,
        &["cuMemAddressReserve", "CUDA_ERROR_INVALID_VALUE (1)"],
    );
    let va = rt.reserve(8 * MIB, 4 * MIB, None).unwrap();
    assert_eq!(va % (4 * MIB), 0);
    expect_code(rt.create(MIB, 0), ErrorCode::RtParamInvalid, &["cuMemCreate"]);
    expect_code(rt.create(4 * 1024 * GIB, 0), ErrorCode::RtMemoryAllocation, &["CUDA_ERROR_OUT_OF_MEMORY (2)"]);
    let h = rt.create(2 * MIB, 0).unwrap();
    rt.map(va, 2 * MIB, h, &[0]).unwrap();
    rt.map(va + 4 * MIB, 2 * MIB, h, &[0]).unwrap();
    rt.write(va + 5, b"cuda").unwrap();
    let mut out = [0u8; 4];
    rt.read(va + 4 * MIB + 5, &mut out).unwrap();
    assert_eq!(&out, b"cuda");
    expect_code(rt.read(va + 2 * MIB, &mut out), ErrorCode::RtParamInvalid, &["cuMemcpyDtoH"]);
    rt.memset(va, 1, 2 * MIB).unwrap();
    rt.copy(va + 4 * MIB, va, 16).unwrap();
    expect_code(rt.release(va, 8 * MIB), ErrorCode::RtParamInvalid, &["cuMemAddressFree"]);
    rt.release_handle(h).unwrap();
    expect_code(rt.release_handle(h), ErrorCode::RtParamInvalid, &["cuMemRelease"]);
    rt.unmap(va, 2 * MIB).unwrap();
    rt.unmap(va + 4 * MIB, 2 * MIB).unwrap();
    rt.release(va, 8 * MIB).unwrap();
    let (free, total) = rt.mem_info().unwrap();
    assert_eq!(free, total - (CUDA.counts().physical_bytes));
    assert_eq!(rt.error_name(700), "CUDA_ERROR_ILLEGAL_ADDRESS");

    CUDA.set_delay_us(3000);
    let (s1, s2) = (rt.create_stream().unwrap(), rt.create_stream().unwrap());
    let e = rt.create_event().unwrap();
    let va = rt.reserve(2 * MIB, 0, None).unwrap();
    let h = rt.create(2 * MIB, 0).unwrap();
    rt.map(va, 2 * MIB, h, &[0]).unwrap();
    let src = vec![9u8; 4096];
    let mut dst = vec![0u8; 4096];
    // SAFETY: both host buffers outlive the synchronisations below.
    unsafe {
        rt.memcpy_async(va, src.as_ptr() as u64, 4096, s1).unwrap();
        rt.record_event(e, s1).unwrap();
        assert!(!rt.query_event(e).unwrap(), "CUDA_ERROR_NOT_READY behind a delayed copy");
        rt.stream_wait_event(s2, e).unwrap();
        rt.memcpy_async(dst.as_mut_ptr() as u64, va, 4096, s2).unwrap();
    }
    rt.synchronize_stream(s2).unwrap();
    assert!(dst.iter().all(|&b| b == 9));
    assert!(rt.query_event(e).unwrap());
    CUDA.set_delay_us(0);
    rt.synchronize_context().unwrap();
    for s in [s1, s2] {
        rt.destroy_stream(s).unwrap();
    }
    rt.destroy_event(e).unwrap();
    rt.unmap(va, 2 * MIB).unwrap();
    rt.release_handle(h).unwrap();
    rt.release(va, 2 * MIB).unwrap();
    assert_eq!(CUDA.counts().held(), before.held());
}

#[test]
fn backends_have_the_runtimes_pages_and_refuse_what_they_cannot_hold() {
    let _g = (ACL.hold(), CUDA.hold());
    let acl = AclBackend::with_driver(AclDriver::new(acl(), 0).unwrap(), Some(64 * MIB)).unwrap();
    assert_eq!(
        [PageKind::Normal, PageKind::Huge, PageKind::Giant].map(|k| acl.page_size(k)),
        [PageSize::Size4K, PageSize::Size2M, PageSize::Size1G]
    );
    assert_eq!(acl.name(), "acl");
    assert!(acl.owns(0x1000_0000_0000) && !acl.owns(0x1000), "AscendCL's window is the device's");
    let cuda = CudaBackend::with_driver(CudaDriver::new(cuda(), 0, None).unwrap(), None).unwrap();
    assert_eq!(cuda.page_size(PageKind::Normal), PageSize::Size2M, "normal pages are the GPU's granularity");
    assert_eq!(cuda.capacity(), 80 * GIB, "the whole device by default");
    expect_code(
        CudaBackend::with_driver(CudaDriver::new(self::cuda(), 0, Some(100 * GIB)).unwrap(), Some(100 * GIB)),
        ErrorCode::InvalidParam,
        &["capacity 100 GiB is out of range"],
    );
    let mut cuda = cuda;
    expect_code(cuda.create_physical(64 * KIB, PageKind::Normal), ErrorCode::InvalidParam, &["2MiB granularity"]);
}

/// A physical free (and, where the runtime holds reservations, a release) the runtime keeps
/// refusing: the call succeeds for the allocators, and the refusal is counted, warned about
/// once, kept against the capacity and retried — `reclaim_stranded` is 207002 while it lasts.
fn refusals_are_reported(b: &mut dyn Backend, stand_in: &StandIn, runtime_releases: bool) {
    let h = b.create_physical(2 * MIB, PageKind::Huge).unwrap();
    let va = b.reserve(2 * MIB, 2 * MIB, None).unwrap();
    b.map(va, h).unwrap();
    b.unmap(va).unwrap();
    stand_in.fail_from(FREE_PHYSICAL, 1);
    stand_in.fail_from(RELEASE, 1);
    b.free_physical(h).unwrap();
    b.release(va).unwrap();
    let kept = if runtime_releases { 2 } else { 1 };
    assert_eq!((b.counters().refused_frees, b.stranded()), (kept, (kept, 2 * MIB)));
    let warnings = b.take_warnings();
    assert_eq!(warnings.len() as u64, kept, "{warnings:?}");
    assert!(warnings[0].contains("refused to free physical allocation"), "{warnings:?}");
    assert!(!runtime_releases || warnings[1].contains("address reservation"), "{warnings:?}");
    assert!(b.take_warnings().is_empty(), "each warning is taken once");
    expect_code(b.create_physical(16 * MIB, PageKind::Huge), ErrorCode::RtMemoryAllocation, &["2 MiB"]);
    expect_code(b.reclaim_stranded(), ErrorCode::RtMemoryFree, &["still refuses to take back", "object(s)"]);
    assert_eq!(b.counters().refused_frees, kept, "retries are not new refusals");
    assert!(b.take_warnings().is_empty());
    stand_in.fail_from(FREE_PHYSICAL, 0);
    stand_in.fail_from(RELEASE, 0);
    b.reclaim_stranded().unwrap();
    let c = b.counters();
    assert_eq!((b.stranded(), c.physical_frees, c.releases), ((0, 0), 1, 1));
    b.create_physical(16 * MIB, PageKind::Huge).map(|h| b.free_physical(h)).unwrap().unwrap();
}

/// `malloc_host` is the runtime's page-locked memory: counted by the stand-in, checked on free,
/// failures with the runtime's code, and what is left live freed with the backend.
/// (`zero`: the runtime's code for a size of 0.)
fn host_memory_is_the_runtimes(b: &mut dyn Backend, stand_in: &StandIn, call: &str, zero: ErrorCode) {
    let before = stand_in.counts().host_blocks;
    let a = b.malloc_host(1000).expect("a runtime's host memory").unwrap();
    assert_eq!((stand_in.counts().host_blocks, a % 64), (before + 1, 0));
    expect_code(b.free_host(a + 8), ErrorCode::RtMemoryFree, &["not a block"]);
    b.free_host(a).unwrap();
    expect_code(b.free_host(a), ErrorCode::RtMemoryFree, &["not a block"]);
    stand_in.fail_next(HOST, 1);
    expect_code(b.malloc_host(64).unwrap(), ErrorCode::RtMemoryAllocation, &[call]);
    expect_code(b.malloc_host(0).unwrap(), zero, &[call]);
    assert_eq!(stand_in.counts().host_blocks, before);
    b.malloc_host(MIB).unwrap().unwrap(); // left live: freed when the backend goes
}

#[test]
fn refused_frees_and_runtime_host_memory_on_acl() {
    let _g = ACL.hold();
    let before = ACL.counts();
    {
        let mut b = AclBackend::with_driver(AclDriver::new(acl(), 0).unwrap(), Some(16 * MIB)).unwrap();
        refusals_are_reported(&mut b, &ACL, true);
        host_memory_is_the_runtimes(&mut b, &ACL, "aclrtMallocHost", ErrorCode::InvalidParam);
    }
    assert_eq!(ACL.counts().held(), before.held());
}

#[test]
fn refused_frees_and_runtime_host_memory_on_cuda() {
    let _g = CUDA.hold();
    let before = CUDA.counts();
    {
        let mut b =
            CudaBackend::with_driver(CudaDriver::new(cuda(), 0, Some(16 * MIB)).unwrap(), Some(16 * MIB)).unwrap();
        refusals_are_reported(&mut b, &CUDA, false);
        host_memory_is_the_runtimes(&mut b, &CUDA, "cuMemAllocHost", ErrorCode::RtParamInvalid);
    }
    assert_eq!(CUDA.counts().held(), before.held());
}

#[test]
fn overlapping_copies_go_through_host_memory_in_order() {
    let _g = ACL.hold();
    let mut b = AclBackend::with_driver(AclDriver::new(acl(), 0).unwrap(), Some(64 * MIB)).unwrap();
    let h = b.create_physical(8 * MIB, PageKind::Huge).unwrap();
    let va = b.reserve(8 * MIB, 2 * MIB, None).unwrap();
    b.map(va, h).unwrap();
    let data: Vec<u8> = (0..3 * MIB as usize + 5).map(|i| (i * 7 % 251) as u8).collect();
    for (dst, src) in [(va + 1000, va), (va, va + 1000), (va + 2 * MIB, va + MIB)] {
        b.write(src, &data).unwrap();
        b.copy(dst, src, data.len() as u64).unwrap();
        let mut out = vec![0u8; data.len()];
        b.read(dst, &mut out).unwrap();
        assert!(out == data, "memmove from {src:#x} to {dst:#x}");
    }
}

/// One step of a random VMM program (indices pick among what is live).
#[derive(Clone, Debug)]
enum Op {
    Reserve(u64),
    Create(u64, bool),
    Map(usize, usize, u64),
    Unmap(usize),
    Free(usize),
    Release(usize),
    Write(usize, u64, u8),
    Read(usize, u64),
    Fail(u32, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..6).prop_map(Op::Reserve),
        (1u64..4, any::<bool>()).prop_map(|(n, huge)| Op::Create(n, huge)),
        (any::<usize>(), any::<usize>(), 0u64..4).prop_map(|(r, h, slot)| Op::Map(r, h, slot)),
        any::<usize>().prop_map(Op::Unmap),
        any::<usize>().prop_map(Op::Free),
        any::<usize>().prop_map(Op::Release),
        (any::<usize>(), any::<u64>(), any::<u8>()).prop_map(|(m, off, v)| Op::Write(m, off, v)),
        (any::<usize>(), any::<u64>()).prop_map(|(m, off)| Op::Read(m, off)),
        (prop_oneof![Just(PHYSICAL), Just(MAP), Just(RESERVE), Just(MEMCPY)], 1u64..4)
            .prop_map(|(k, n)| Op::Fail(k, n)),
    ]
}

/// What the program holds, as the model sees it.
#[derive(Default)]
struct Model {
    /// Reservations: start → size.
    reservations: BTreeMap<u64, u64>,
    /// Physical allocations: id → (size, page, freed).
    handles: Vec<(u64, u64, u64, bool)>,
    /// Mappings: start → (handle id, size).
    mappings: BTreeMap<u64, (u64, u64)>,
    /// Bytes written, by (handle id, offset).
    bytes: HashMap<(u64, u64), u8>,
    held: u64,
}

fn pick<T: Copy>(items: &[T], i: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[i % items.len()])
}

/// Runs `ops` on `backend`; every outcome matches the model unless the stand-in's fault switch
/// fired during the call (then the call failed and changed nothing). The caller drops the
/// backend and checks the stand-in holds nothing more than before.
fn run_program(
    backend: &mut dyn Backend,
    stand_in: &StandIn,
    capacity: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut m = Model::default();
    let normal = backend.page_size(PageKind::Normal).bytes();
    let huge = backend.page_size(PageKind::Huge).bytes();
    for op in ops {
        let fired = stand_in.counts().faults_fired;
        let outcome: Result<Option<bool>, AclError> = match op.clone() {
            Op::Fail(kind, n) => {
                stand_in.fail_next(kind, n);
                continue;
            }
            Op::Reserve(pages) => backend.reserve(pages * huge, huge, None).map(|va| {
                m.reservations.insert(va, pages * huge);
                None
            }),
            Op::Create(n, big) => {
                let (kind, page) = if big { (PageKind::Huge, huge) } else { (PageKind::Normal, normal) };
                let size = n * page;
                let expect = m.held + size <= capacity;
                let r = backend.create_physical(size, kind).map(|h| {
                    m.handles.push((h, size, page, false));
                    m.held += size;
                    None
                });
                if stand_in.counts().faults_fired == fired {
                    prop_assert_eq!(r.is_ok(), expect, "create {} -> {:?}", size, r);
                }
                r
            }
            Op::Map(r, h, slot) => {
                let (Some(start), Some((id, size, page, freed))) =
                    (pick(&m.reservations.keys().copied().collect::<Vec<_>>(), r), pick(&m.handles, h))
                else {
                    continue;
                };
                let va = start + slot * page;
                let overlaps = m.mappings.range(..va + size).next_back().is_some_and(|(&s, &(_, l))| s + l > va);
                // Inside one reservation (maybe the next one, placed right after).
                let inside = m.reservations.range(..=va).next_back().is_some_and(|(&s, &l)| va + size <= s + l);
                let expect = !freed && inside && !overlaps;
                let r = backend.map(va, id).map(|()| {
                    m.mappings.insert(va, (id, size));
                    None
                });
                if stand_in.counts().faults_fired == fired {
                    prop_assert_eq!(r.is_ok(), expect, "map {:#x} -> {:?}", va, r);
                }
                r
            }
            Op::Unmap(i) => {
                let Some(va) = pick(&m.mappings.keys().copied().collect::<Vec<_>>(), i) else { continue };
                backend.unmap(va).map(|()| {
                    let (id, size) = m.mappings.remove(&va).unwrap();
                    let still = m.mappings.values().any(|&(h, _)| h == id);
                    if !still && m.handles.iter().any(|&(h, _, _, f)| h == id && f) {
                        m.handles.retain(|&(h, ..)| h != id);
                        m.held -= size;
                    }
                    None
                })
            }
            Op::Free(i) => {
                let Some((id, size, _, freed)) = pick(&m.handles, i) else { continue };
                let r = backend.free_physical(id).map(|()| {
                    if m.mappings.values().any(|&(h, _)| h == id) {
                        m.handles.iter_mut().find(|x| x.0 == id).unwrap().3 = true;
                    } else {
                        m.handles.retain(|&(h, ..)| h != id);
                        m.held -= size;
                    }
                    None
                });
                prop_assert_eq!(r.is_ok(), !freed, "free {} -> {:?}", id, r);
                r
            }
            Op::Release(i) => {
                let Some(va) = pick(&m.reservations.keys().copied().collect::<Vec<_>>(), i) else { continue };
                let len = m.reservations[&va];
                let expect = m.mappings.range(va..va + len).next().is_none();
                let r = backend.release(va).map(|()| {
                    m.reservations.remove(&va);
                    None
                });
                prop_assert_eq!(r.is_ok(), expect, "release {:#x} -> {:?}", va, r);
                r
            }
            Op::Write(i, off, v) => {
                let Some((va, (id, size))) = pick(&m.mappings.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>(), i)
                else {
                    continue;
                };
                let off = off % size;
                backend.write(va + off, &[v]).map(|()| {
                    m.bytes.insert((id, off), v);
                    None
                })
            }
            Op::Read(i, off) => {
                let Some((va, (id, size))) = pick(&m.mappings.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>(), i)
                else {
                    continue;
                };
                let off = off % size;
                let mut out = [0u8];
                backend.read(va + off, &mut out).map(|()| {
                    // Never-written memory of the stand-in reads as zero.
                    Some(out[0] == m.bytes.get(&(id, off)).copied().unwrap_or(0))
                })
            }
        };
        match outcome {
            Ok(Some(same)) => prop_assert!(same, "{:?} read back something else", op),
            Ok(None) => {}
            Err(e) => {
                if stand_in.counts().faults_fired > fired {
                    prop_assert!(matches!(
                        op,
                        Op::Create(..) | Op::Map(..) | Op::Reserve(_) | Op::Write(..) | Op::Read(..)
                    ));
                } else {
                    prop_assert!(
                        matches!(op, Op::Create(..) | Op::Map(..) | Op::Free(_) | Op::Release(_)),
                        "{:?}: {}",
                        op,
                        e
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random programs of reserves, physical allocations, maps, unmaps, frees, releases and
    /// byte accesses (aliased through several mappings), with the stand-in failing random
    /// physical allocations, maps, reservations and copies: each outcome is the model's, and
    /// once the backend is dropped the stand-in holds nothing it did not hold before.
    #[test]
    fn acl_programs_match_the_model_and_leak_nothing(ops in proptest::collection::vec(op(), 1..60)) {
        let _g = ACL.hold();
        let before = ACL.counts();
        {
            let mut b = AclBackend::with_driver(AclDriver::new(acl(), 0).unwrap(), Some(16 * MIB)).unwrap();
            let r = run_program(&mut b, &ACL, 16 * MIB, ops);
            for k in [PHYSICAL, MAP, RESERVE, MEMCPY] {
                ACL.fail_next(k, 0);
            }
            r?;
        }
        prop_assert_eq!(ACL.counts().held(), before.held());
    }

    #[test]
    fn cuda_programs_match_the_model_and_leak_nothing(ops in proptest::collection::vec(op(), 1..60)) {
        let _g = CUDA.hold();
        let before = CUDA.counts();
        {
            let mut b = CudaBackend::with_driver(CudaDriver::new(cuda(), 0, Some(24 * MIB)).unwrap(), Some(24 * MIB)).unwrap();
            let r = run_program(&mut b, &CUDA, 24 * MIB, ops);
            for k in [PHYSICAL, MAP, RESERVE, MEMCPY] {
                CUDA.fail_next(k, 0);
            }
            r?;
        }
        prop_assert_eq!(CUDA.counts().held(), before.held());
    }
}
