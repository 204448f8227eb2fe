//! Streams on the device: async copies land when they complete on the simulated clock.

use npumem_core::backend::SimConfig;
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
    let s = d.scheduler().create_stream();
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
    let (compute, copy) = (d.scheduler().create_stream(), d.scheduler().create_stream());
    d.memset_async(a, n, 3, n, compute).unwrap();
    let (_, kernel_end) = d.launch(compute, 1_000_000, &[a], &[a]).unwrap();
    let done = d.scheduler().create_event();
    d.scheduler().record_event(done, compute).unwrap();
    d.scheduler().stream_wait_event(copy, done).unwrap();
    let (start, _) = d.memcpy_async(b, n, a, n, MemcpyKind::DeviceToDevice as u32, copy).unwrap();
    assert!(start >= kernel_end, "the copy waits for the kernel");
    d.memcpy_async(host, n, b, n, MemcpyKind::DeviceToHost as u32, copy).unwrap();
    assert!(!d.query_event(done).unwrap());
    d.synchronize_stream(copy).unwrap();
    assert!(d.query_event(done).unwrap());
    let mut out = [0u8; 2];
    d.read(host, &mut out).unwrap();
    assert_eq!(out, [3, 3]);
    let later = d.scheduler().create_event();
    d.scheduler().record_event(later, DEFAULT_STREAM).unwrap();
    let t = d.scheduler().event_time(later).unwrap();
    assert_eq!(t, d.scheduler().now_ns(), "an idle stream's event completes at once");
    let ms = d.event_elapsed_time(done, later).unwrap();
    assert_eq!(ms, (t - kernel_end) as f64 / 1e6);
}

#[test]
fn freeing_under_pending_work_loses_the_effect() {
    let mut d = device();
    let n = MIB;
    let host = d.malloc_host(n).unwrap();
    let dev = d.malloc(n, Policy::HugeFirst).unwrap();
    let s = d.scheduler().create_stream();
    d.memcpy_async(dev, n, host, n, 1, s).unwrap();
    d.free(dev).unwrap(); // aclrtFree does not wait
    d.synchronize_device();
    assert_eq!(d.stats().lost_effects, 1);
}
