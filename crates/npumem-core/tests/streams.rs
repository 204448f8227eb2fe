//! Streams on the device: async copies land when they complete on the simulated clock.

use npumem_core::backend::SimConfig;
use npumem_core::sanitizer::{FindingKind, HOST};
use npumem_core::stream::DEFAULT_STREAM;
use npumem_core::units::MIB;
use npumem_core::{Device, DeviceConfig, MemcpyKind, Policy};

fn device() -> Device {
    Device::new(DeviceConfig { sim: SimConfig { capacity: 256 * MIB, ..Default::default() }, ..Default::default() })
        .unwrap()
}

#[test]
fn async_copy_lands_at_completion() {
    let mut d = device();
    let n = 8 * MIB;
    let host = d.malloc_host(n).unwrap();
    let dev = d.malloc(n, Policy::HugeFirst).unwrap();
    d.write(host, &vec![5u8; n as usize]).unwrap();
    d.memset(dev, n, 0, n).unwrap();
    let s = d.create_stream().unwrap();
    let (_, end) = d.memcpy_async(dev, n, host, n, MemcpyKind::HostToDevice as u32, s).unwrap();
    let mut out = [9u8; 4];
    d.read(dev, &mut out).unwrap();
    assert_eq!(out, [0; 4], "not landed before the copy completes");
    assert!(d.scheduler().now_ns() < end);
    d.synchronize_stream(s).unwrap();
    assert!(d.scheduler().now_ns() >= end);
    d.read(dev + n - 4, &mut out).unwrap();
    assert_eq!(out, [5; 4]);
}

#[test]
fn events_order_two_streams() {
    let mut d = device();
    let n = MIB;
    let (a, b) = (d.malloc(n, Policy::HugeFirst).unwrap(), d.malloc(n, Policy::HugeFirst).unwrap());
    let host = d.malloc_host(n).unwrap();
    let (compute, copy) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    d.memset_async(a, n, 3, n, compute).unwrap();
    let (_, kernel_end) = d.launch(compute, 1_000_000, &[a], &[a]).unwrap();
    let done = d.create_event().unwrap();
    d.record_event(done, compute).unwrap();
    d.stream_wait_event(copy, done).unwrap();
    let (start, _) = d.memcpy_async(b, n, a, n, MemcpyKind::DeviceToDevice as u32, copy).unwrap();
    assert!(start >= kernel_end, "the copy waits for the kernel");
    d.memcpy_async(host, n, b, n, MemcpyKind::DeviceToHost as u32, copy).unwrap();
    assert!(!d.query_event(done).unwrap());
    d.synchronize_stream(copy).unwrap();
    assert!(d.query_event(done).unwrap());
    let mut out = [0u8; 2];
    d.read(host, &mut out).unwrap();
    assert_eq!(out, [3, 3]);
    let later = d.create_event().unwrap();
    d.record_event(later, DEFAULT_STREAM).unwrap();
    let t = d.scheduler().event_time(later).unwrap();
    assert_eq!(t, d.scheduler().now_ns(), "an idle stream's event completes at once");
    let ms = d.event_elapsed_time(done, later).unwrap();
    assert_eq!(ms, (t - kernel_end) as f64 / 1e6);
}

#[test]
fn freeing_under_another_streams_work_is_a_hazard_but_the_memory_waits() {
    let mut d = device();
    let n = MIB;
    let host = d.malloc_host(n).unwrap();
    let dev = d.malloc(n, Policy::HugeFirst).unwrap();
    let s = d.create_stream().unwrap();
    d.memcpy_async(dev, n, host, n, 1, s).unwrap();
    // aclrtFree would not wait for stream s: a use-after-free hazard. npumem keeps the memory
    // until the copy is done, so nothing else gets it meanwhile and the copy is not lost.
    d.free(dev).unwrap();
    let findings = d.sanitizer_reports();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].kind, FindingKind::UseAfterFree);
    assert_eq!(findings[0].streams, vec![s, HOST]);
    assert_eq!(d.stats().pending_frees, 1);
    let other = d.malloc(n, Policy::HugeFirst).unwrap();
    assert_ne!(other, dev, "not handed out while the copy runs");
    d.synchronize_device().unwrap();
    assert_eq!((d.stats().lost_effects, d.stats().pending_frees), (0, 0));
    // Freeing the pinned source under the queued copy is the same hazard; that copy is lost.
    let dev2 = d.malloc(n, Policy::HugeFirst).unwrap();
    d.memcpy_async(dev2, n, host, n, 1, s).unwrap();
    d.free_host(host).unwrap();
    assert_eq!(d.sanitizer_reports()[1].kind, FindingKind::UseAfterFree);
    d.synchronize_device().unwrap();
    assert_eq!(d.stats().lost_effects, 1);
}

#[test]
fn frees_wait_for_their_streams_then_any_stream_reuses_the_block() {
    let mut d = device();
    let n = 4 * MIB;
    let compute = d.create_stream().unwrap();
    let x = d.malloc_on(n, Policy::HugeFirst, true, compute).unwrap();
    let (_, end) = d.launch(compute, 1_000_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    assert_eq!(d.stats().pending_frees, 1, "the kernel still uses the memory");
    let y = d.malloc(n, Policy::HugeFirst).unwrap();
    assert_ne!(y, x, "not reused while the kernel runs");
    d.synchronize_stream(compute).unwrap();
    assert!(d.scheduler().now_ns() >= end);
    d.free(y).unwrap();
    let z = d.malloc(n, Policy::HugeFirst).unwrap();
    assert_eq!(d.stats().pending_frees, 0);
    assert!(z == x || z == y, "completed blocks are reusable by any stream");
    assert_eq!(d.stats().deferred_frees, 1);
}

#[test]
fn record_stream_and_stream_ordered_free() {
    let mut d = device();
    let n = MIB;
    let (a, b, f) = (d.create_stream().unwrap(), d.create_stream().unwrap(), d.create_stream().unwrap());
    let x = d.malloc_on(n, Policy::HugeFirst, true, a).unwrap();
    d.launch(b, 2_000_000, &[x], &[]).unwrap();
    d.record_stream(x, b).unwrap();
    d.free(x).unwrap();
    d.synchronize_stream(a).unwrap();
    assert_eq!(d.stats().pending_frees, 1, "stream b still reads it");
    d.synchronize_stream(b).unwrap();
    assert_eq!(d.stats().pending_frees, 0);
    // Event-driven free: the free stream waits on an event recorded after the last use.
    let y = d.malloc_on(n, Policy::HugeFirst, true, a).unwrap();
    let (_, used_until) = d.launch(a, 1_000_000, &[y], &[y]).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(e, a).unwrap();
    d.stream_wait_event(f, e).unwrap();
    d.free_on(y, Some(f)).unwrap();
    assert!(d.scheduler().now_ns() < used_until, "the host did not block");
    assert_eq!(d.stats().pending_frees, 1);
    d.synchronize_stream(f).unwrap();
    assert_eq!(d.stats().pending_frees, 0);
    assert!(d.record_stream(y, b).is_err(), "no longer live");
}

#[test]
fn oom_waits_for_pending_frees_and_retries() {
    let mut d = device();
    d.set_reuse_policy(npumem_core::ReusePolicy { allow_internal_dependencies: false, ..Default::default() });
    let s = d.create_stream().unwrap();
    let x = d.malloc_on(200 * MIB, Policy::HugeFirst, true, s).unwrap();
    d.launch(s, 5_000_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    let y = d.malloc(200 * MIB, Policy::HugeFirst).unwrap();
    assert_eq!(d.stats().sync_reclaims, 1);
    assert!(d.scheduler().now_ns() >= 5_000_000);
    d.free(y).unwrap();
}

#[test]
fn the_same_stream_reuses_a_block_at_once() {
    let mut d = device();
    let n = 8 * MIB;
    let s = d.create_stream().unwrap();
    let x = d.malloc_on(n, Policy::HugeFirst, true, s).unwrap();
    d.launch(s, 1_000_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    let y = d.malloc_on(n - 100, Policy::HugeFirst, true, s).unwrap();
    assert_eq!(y, x, "stream order makes the reuse safe");
    assert_eq!((d.stats().same_stream_reuses, d.stats().pending_frees), (1, 0));
    assert_eq!(d.allocation(y).unwrap().size, n - 100);
    // Another policy or a much smaller request does not take it by same-stream reuse.
    d.free(y).unwrap();
    d.malloc_on(n, Policy::NormalOnly, true, s).unwrap();
    d.malloc_on(n / 4, Policy::HugeFirst, true, s).unwrap();
    assert_eq!(d.stats().same_stream_reuses, 1);
    d.synchronize_device().unwrap();
    assert_eq!(d.stats().pending_frees, 0);
}

#[test]
fn reuse_policies() {
    // Follow event dependencies: b waited on an event recorded after a's free point.
    let mut d = device();
    let n = 4 * MIB;
    let (a, b) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let x = d.malloc_on(n, Policy::HugeFirst, true, a).unwrap();
    d.launch(a, 1_000_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(e, a).unwrap();
    d.stream_wait_event(b, e).unwrap();
    let y = d.malloc_on(n, Policy::HugeFirst, true, b).unwrap();
    assert_eq!(y, x);
    assert_eq!(d.stats().event_dependency_reuses, 1);
    d.free(y).unwrap();
    d.synchronize_device().unwrap();

    // Without following event dependencies, b gets fresh memory.
    let mut no_follow = npumem_core::ReusePolicy { follow_event_dependencies: false, ..Default::default() };
    d.set_reuse_policy(no_follow);
    let x = d.malloc_on(n, Policy::HugeFirst, true, a).unwrap();
    d.launch(a, 1_000_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    d.record_event(e, a).unwrap();
    d.stream_wait_event(b, e).unwrap();
    let y = d.malloc_on(n, Policy::HugeFirst, true, b).unwrap();
    assert_ne!(y, x);
    d.free(y).unwrap();
    d.synchronize_device().unwrap();

    // Not opportunistic: a completed free waits until the host synchronises with it.
    no_follow.allow_opportunistic = false;
    d.set_reuse_policy(no_follow);
    let x = d.malloc_on(n, Policy::HugeFirst, true, a).unwrap();
    d.launch(a, 1_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    d.scheduler().advance(10_000_000); // time passes, the kernel is long done
    let y = d.malloc(n, Policy::HugeFirst).unwrap();
    assert_eq!(d.stats().pending_frees, 1, "not reaped without a synchronisation");
    d.synchronize_stream(a).unwrap();
    assert_eq!(d.stats().pending_frees, 0);
    d.free(y).unwrap();
}

#[test]
fn internal_dependency_on_out_of_memory_and_release_threshold() {
    let mut d = device();
    let (a, b) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let x = d.malloc_on(200 * MIB, Policy::HugeFirst, true, a).unwrap();
    let (_, end) = d.launch(a, 5_000_000, &[x], &[x]).unwrap();
    d.free(x).unwrap();
    let y = d.malloc_on(200 * MIB, Policy::HugeFirst, true, b).unwrap();
    assert_eq!(y, x, "b waits for a's free instead of failing");
    assert_eq!((d.stats().internal_dependency_reuses, d.stats().sync_reclaims), (1, 0));
    let (start, _) = d.launch(b, 10, &[y], &[]).unwrap();
    assert!(start >= end, "the inserted dependency orders b after a");
    assert!(d.scheduler().now_ns() < end, "the host did not block");
    d.free(y).unwrap();
    d.set_reuse_policy(npumem_core::ReusePolicy { release_threshold: 0, ..Default::default() });
    d.synchronize_device().unwrap();
    assert_eq!(d.pool_stats().reserved_bytes.all.current, 0, "released down to the threshold");
}
