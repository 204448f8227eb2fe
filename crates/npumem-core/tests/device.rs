//! Device-level behaviour: AscendCL rules and a model-based property test over malloc/free/copy.

use npumem_core::backend::SimConfig;
use npumem_core::units::{GIB, KIB, MIB};
use npumem_core::vm::PageSize;
use npumem_core::{AllocatorKind, Device, DeviceConfig, ErrorCode, MemAttr, MemcpyKind, Policy};
use proptest::prelude::*;

fn device(capacity: u64, giant_frames: u64) -> Device {
    let sim = SimConfig { capacity, normal_page: PageSize::Size4K, giant_frames };
    Device::new(DeviceConfig { sim, allocator: AllocatorKind::Direct, ..Default::default() }).unwrap()
}

#[test]
fn policies_pick_page_sizes_and_padding() {
    let mut d = device(4 * GIB, 1);
    let small = d.malloc(MIB, Policy::HugeFirst).unwrap();
    let big = d.malloc(MIB + 1, Policy::HugeFirst).unwrap();
    let only = d.malloc(1024, Policy::HugeOnly).unwrap();
    let giant = d.malloc(GIB - 100, Policy::Huge1gOnly).unwrap();
    let aligned = d.malloc_align32(33, Policy::NormalOnly).unwrap();
    let get = |p| d.allocation(p).unwrap();
    assert_eq!((get(small).page, get(small).booked), (PageSize::Size4K, MIB + 32));
    assert_eq!((get(big).page, get(big).granted), (PageSize::Size2M, 2 * MIB));
    assert_eq!((get(only).page, get(only).granted), (PageSize::Size2M, 2 * MIB));
    assert_eq!((get(giant).page, get(giant).booked), (PageSize::Size1G, GIB - 96));
    assert_eq!(get(aligned).booked, 64);
    for p in [small, big, only, giant, aligned] {
        assert_eq!(p % 64, 0);
        d.translate(p).unwrap();
    }
    assert_eq!(d.mem_info(MemAttr::HbmHuge1g), (0, GIB));
    assert_eq!(d.page_table_stats().unwrap().pages, [1 + MIB / (4 * KIB) + 1, 0, 2, 1]);
}

#[test]
fn errors_carry_acl_codes() {
    let mut d = device(64 * MIB, 0);
    assert_eq!(d.malloc(0, Policy::HugeFirst).unwrap_err().code, ErrorCode::InvalidParam);
    assert_eq!(d.malloc(u64::MAX, Policy::HugeFirst).unwrap_err().code, ErrorCode::InvalidParam);
    let oom = d.malloc(GIB, Policy::HugeFirst).unwrap_err();
    assert_eq!(oom.code, ErrorCode::RtMemoryAllocation);
    assert!(oom.message.contains("free of"), "{}", oom.message);
    assert_eq!(d.malloc(4096, Policy::Huge1gOnly).unwrap_err().code, ErrorCode::RtMemoryAllocation);
    let p = d.malloc(100, Policy::HugeFirst).unwrap();
    assert_eq!(d.free(p + 64).unwrap_err().code, ErrorCode::RtMemoryFree);
    d.free(p).unwrap();
    let double = d.free(p).unwrap_err();
    assert!(double.message.contains("double free"));
    assert_eq!(d.free(0).unwrap_err().code, ErrorCode::InvalidParam);
    assert_eq!(d.free(12345).unwrap_err().code, ErrorCode::RtMemoryFree);
    assert_eq!(d.stats().live_count, 0);
    assert_eq!(d.mem_info(MemAttr::Hbm), (64 * MIB, 64 * MIB));
}

#[test]
fn copies_check_bounds_and_infer_direction() {
    let mut d = device(64 * MIB, 0);
    let a = d.malloc(1000, Policy::HugeFirst).unwrap();
    let b = d.malloc(1000, Policy::HugeFirst).unwrap();
    let h = d.malloc_host(1000).unwrap();
    d.write(h, &[7u8; 1000]).unwrap();
    // Host to device with a "wrong" kind still works (the kind is advisory) but is counted.
    d.memcpy(a, 1000, h, 1000, MemcpyKind::DeviceToHost as u32).unwrap();
    assert_eq!(d.stats().kind_mismatches, 1);
    d.memcpy(b, 1000, a, 1000, MemcpyKind::Default as u32).unwrap();
    let mut out = [0u8; 1000];
    d.read(b, &mut out).unwrap();
    assert_eq!(out, [7u8; 1000]);
    assert_eq!(d.memcpy(b, 10, a, 11, 4).unwrap_err().code, ErrorCode::RtParamInvalid);
    assert_eq!(d.memcpy(b, 2000, a, 1001, 4).unwrap_err().code, ErrorCode::RtParamInvalid);
    assert_eq!(d.memcpy(b, 10, a, 10, 9).unwrap_err().code, ErrorCode::InvalidParam);
    assert_eq!(d.memcpy(b, 10, a, 10, 6).unwrap_err().code, ErrorCode::InvalidParam);
    assert_eq!(d.memcpy(b, 10, 0x1234, 10, 4).unwrap_err().code, ErrorCode::RtParamInvalid);
    d.memcpy(0, 0, 0, 0, 4).unwrap(); // count 0 is a no-op
    d.memset(a, 1000, 0x1FF, 10).unwrap();
    d.read(a, &mut out[..10]).unwrap();
    assert_eq!(out[..10], [0xFF; 10]);
    assert!(d.memset(a, 1000, 0, 1001).is_err());
    d.free(a).unwrap();
    let uaf = d.read(a, &mut out).unwrap_err();
    assert!(uaf.message.contains("use after free"), "{}", uaf.message);
    d.free_host(h).unwrap();
    assert!(d.free_host(h).is_err());
}

#[test]
fn huge_first_falls_back_when_fragmented() {
    let mut d = device(64 * MIB, 0);
    // Fill with 4 KiB allocations, then free all but one in each 2 MiB frame.
    let mut ptrs = Vec::new();
    while let Ok(p) = d.malloc(4000, Policy::NormalOnly) {
        ptrs.push(p);
    }
    for (i, p) in ptrs.iter().enumerate() {
        if i % 512 != 0 {
            d.free(*p).unwrap();
        }
    }
    let (free, _) = d.mem_info(MemAttr::Hbm);
    assert!(free > 60 * MIB);
    assert_eq!(d.mem_info(MemAttr::HbmHuge).0, 0);
    assert_eq!(d.malloc(4 * MIB, Policy::HugeOnly).unwrap_err().code, ErrorCode::RtMemoryAllocation);
    let p = d.malloc(4 * MIB, Policy::HugeFirst).unwrap();
    assert_eq!(d.allocation(p).unwrap().page, PageSize::Size4K);
    assert_eq!(d.stats().huge_fallbacks, 1);
}

#[derive(Clone, Debug)]
enum Op {
    Malloc(u64, u8),
    Free(usize),
    Write(usize, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..6 * MIB, 0u8..3).prop_map(|(s, p)| Op::Malloc(s, p)),
        any::<usize>().prop_map(Op::Free),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Op::Write(i, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn malloc_free_against_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut d = device(64 * MIB, 0);
        let initial = d.frame_stats().unwrap();
        // Model: ptr -> (size, fill byte once written; fresh memory is uninitialised).
        let mut live: Vec<(u64, u64, Option<u8>)> = Vec::new();
        for op in ops {
            match op {
                Op::Malloc(size, p) => {
                    let policy = [Policy::HugeFirst, Policy::HugeOnly, Policy::NormalOnly][p as usize];
                    if let Ok(ptr) = d.malloc(size, policy) {
                        let a = d.allocation(ptr).unwrap();
                        for &(q, qs, _) in &live {
                            let b = d.allocation(q).unwrap();
                            prop_assert!(ptr + a.granted <= q || q + b.granted <= ptr);
                            prop_assert!(qs <= b.granted);
                        }
                        live.push((ptr, size, None));
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (ptr, _, _) = live.swap_remove(i % live.len());
                    d.free(ptr).unwrap();
                }
                Op::Write(i, byte) if !live.is_empty() => {
                    let k = i % live.len();
                    let (ptr, size, _) = live[k];
                    d.memset(ptr, size, byte as i32, size).unwrap();
                    live[k].2 = Some(byte);
                }
                _ => {}
            }
            // Every live allocation still holds its own bytes at both ends.
            for &(ptr, size, byte) in &live {
                let Some(byte) = byte else { continue };
                let mut b = [0u8; 1];
                d.read(ptr, &mut b).unwrap();
                prop_assert_eq!(b[0], byte);
                d.read(ptr + size - 1, &mut b).unwrap();
                prop_assert_eq!(b[0], byte);
            }
            prop_assert_eq!(d.stats().live_count as usize, live.len());
        }
        for (ptr, _, _) in live {
            d.free(ptr).unwrap();
        }
        prop_assert_eq!(d.frame_stats().unwrap(), initial);
        prop_assert_eq!(d.page_table_stats().unwrap().mapped_bytes, 0);
    }
}

#[test]
fn batches_are_all_or_nothing_and_replays_run_in_rust() {
    let mut d = device(64 * MIB, 0);
    let ptrs = d.malloc_many(&[4096, 8192, MIB], Policy::HugeFirst, 0).unwrap();
    assert_eq!(ptrs.len(), 3);
    let err = d.malloc_many(&[4096, 1 << 40], Policy::HugeFirst, 0).unwrap_err();
    assert!(err.message.contains("size #1"), "{}", err.message);
    assert_eq!(d.stats().live_count, 3, "the failed batch left nothing behind");
    let err = d.free_many(&[ptrs[0], ptrs[0]]).unwrap_err();
    assert!(err.message.contains("twice"), "{}", err.message);
    assert!(d.free_many(&[ptrs[0], 12345]).is_err());
    assert_eq!(d.stats().live_count, 3, "nothing was freed");
    d.free_many(&ptrs).unwrap();
    let events = [(true, 1, 1000), (true, 2, 60 * MIB), (true, 3, 2000), (false, 1, 0), (false, 2, 0)];
    let out = d.replay_events(&events, Policy::HugeFirst, false).unwrap();
    assert_eq!((out.allocs, out.ooms, out.peak_live), (3, 0, 60 * MIB + 3000));
    assert_eq!(out.leftover.len(), 1);
    d.free_many(&out.leftover).unwrap();
    let out = d.replay_events(&[(true, 1, 100 * MIB), (true, 2, 10)], Policy::HugeFirst, true).unwrap();
    assert_eq!((out.allocs, out.ooms), (1, 1));
    assert!(out.first_oom.is_some());
}

/// A refused `free_many` puts back exactly what it took, whether a block would have freed at
/// once or in stream order (a recorded stream, its stream busy), and a batch that mixes both
/// frees them all.
#[test]
fn refused_free_batches_restore_every_allocation() {
    for allocator in [AllocatorKind::Npumem, AllocatorKind::Direct] {
        let sim = SimConfig { capacity: GIB, normal_page: PageSize::Size4K, giant_frames: 0 };
        let mut d = Device::new(DeviceConfig { sim, allocator, ..Default::default() }).unwrap();
        let s = d.create_stream().unwrap();
        let mut ptrs = d.malloc_many(&[4096, 100, 3 * MIB + 7, 512], Policy::HugeFirst, 0).unwrap();
        ptrs.extend(d.malloc_many(&[8192, 64 * KIB], Policy::NormalOnly, s).unwrap());
        ptrs.push(d.malloc_align32(33, Policy::HugeOnly).unwrap());
        d.record_stream(ptrs[1], s).unwrap();
        d.launch(s, 1_000_000, &[ptrs[4]], &[]).unwrap();
        let mut before = d.allocations();
        before.sort_by_key(|a| a.ptr);
        for bad in [vec![12345], vec![ptrs[2]], vec![ptrs[5] + 1]] {
            let mut batch = ptrs.clone();
            batch.splice(3..3, bad);
            assert!(d.free_many(&batch).is_err(), "{allocator:?}");
            let mut after = d.allocations();
            after.sort_by_key(|a| a.ptr);
            assert_eq!(after, before, "{allocator:?}: a refused batch changes nothing");
        }
        d.free_many(&ptrs).unwrap();
        d.synchronize_device().unwrap();
        assert_eq!(d.stats().live_count, 0, "{allocator:?}");
        assert!(d.allocations().is_empty(), "{allocator:?}");
    }
}

/// Devices made with `va_slice` share one address space: each hands out addresses only from its
/// own slice, and sees the others' pointers as none of its own.
#[test]
fn va_slices_split_one_address_space() {
    use npumem_core::vm::{VA_WINDOW_END, VA_WINDOW_START, va_slice};
    let make = |index, allocator| {
        let sim = SimConfig { capacity: 8 * GIB, ..SimConfig::default() };
        Device::new(DeviceConfig { sim, allocator, va_slice: Some((index, 4)), ..Default::default() }).unwrap()
    };
    let quarter = (VA_WINDOW_END - VA_WINDOW_START) / 4;
    let mut devices: Vec<Device> =
        (0..4).map(|i| make(i, if i % 2 == 0 { AllocatorKind::Npumem } else { AllocatorKind::Direct })).collect();
    for (i, d) in devices.iter_mut().enumerate() {
        let (start, end) = d.va_window();
        assert_eq!((start, end), va_slice(i as u32, 4).unwrap());
        assert_eq!((start, end - start), (VA_WINDOW_START + i as u64 * quarter, quarter));
        for size in [1, 3 * MIB, 64 * MIB] {
            let p = d.malloc(size, Policy::HugeFirst).unwrap();
            assert!((start..end).contains(&p), "device {i}: {p:#x} outside its slice");
        }
        let va = d.reserve_mem_address(GIB, 0, None, 0).unwrap();
        assert!((start..end).contains(&va));
    }
    // A pointer of device 1 is not device 0's: a copy on device 0 refuses it.
    let p1 = devices[1].malloc(4096, Policy::HugeFirst).unwrap();
    let p0 = devices[0].malloc(4096, Policy::HugeFirst).unwrap();
    assert!(devices[0].memcpy(p0, 4096, p1, 4096, MemcpyKind::Default as u32).is_err());
    // Reservations at an address of another slice fail.
    let other = devices[2].va_window().0;
    assert!(devices[0].reserve_mem_address(GIB, 0, Some(other), 0).is_err());
    // Bad slices are refused.
    for (index, count) in [(4, 4), (0, 0), (0, 65)] {
        let config = DeviceConfig { va_slice: Some((index, count)), ..Default::default() };
        assert_eq!(Device::new(config).err().map(|e| e.code), Some(ErrorCode::InvalidParam));
    }
}

/// `copy_to_peer` moves bytes between two devices of one address space (in chunks, across page
/// boundaries), checks both ranges first and changes nothing when either is wrong.
#[test]
fn copy_to_peer_moves_bytes_between_devices() {
    let make = |index| {
        let sim = SimConfig { capacity: GIB, ..SimConfig::default() };
        Device::new(DeviceConfig { sim, va_slice: Some((index, 2)), ..Default::default() }).unwrap()
    };
    let (mut a, mut b) = (make(0), make(1));
    let n = 3 * MIB + 123;
    let src = a.malloc(n, Policy::HugeFirst).unwrap();
    let dst = b.malloc(n, Policy::HugeFirst).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    a.write(src, &data).unwrap();
    b.write(dst, &vec![0xEE; n as usize]).unwrap();
    a.copy_to_peer(src + 1, &mut b, dst + 5, n - 10).unwrap();
    let mut out = vec![0u8; n as usize];
    b.read(dst, &mut out).unwrap();
    assert_eq!(&out[..5], &[0xEE; 5]);
    assert_eq!(&out[5..(n - 5) as usize], &data[1..(n - 9) as usize]);
    assert_eq!(&out[(n - 5) as usize..], &[0xEE; 5]);
    // Past either allocation, from host memory, or from a freed block: refused, nothing moved.
    assert!(a.copy_to_peer(src, &mut b, dst + 1, n).is_err());
    assert!(a.copy_to_peer(src + 1, &mut b, dst, n).is_err());
    let host = a.malloc_host(64).unwrap();
    assert!(a.copy_to_peer(host, &mut b, dst, 64).is_err());
    a.free(src).unwrap();
    assert!(a.copy_to_peer(src, &mut b, dst, 64).is_err());
    b.read(dst, &mut out).unwrap();
    assert_eq!(&out[5..(n - 5) as usize], &data[1..(n - 9) as usize]);
    a.copy_to_peer(src, &mut b, dst, 0).unwrap();
}

/// `map_alias` maps an allocation's pages a second time (an IPC import): writes through either
/// address are read through the other, the pages outlive the allocation until `unmap_alias`,
/// and the alias is not the program's to unmap or release.
#[test]
fn map_alias_shares_the_pages() {
    for allocator in [AllocatorKind::Npumem, AllocatorKind::Direct, AllocatorKind::PyTorch] {
        let sim = SimConfig { capacity: GIB, ..SimConfig::default() };
        let mut d = Device::new(DeviceConfig { sim, allocator, ..Default::default() }).unwrap();
        let n = 3 * MIB;
        let p = d.malloc(n, Policy::HugeFirst).unwrap();
        let alias = d.map_alias(p + 4096, n - 4096).unwrap();
        assert_ne!(alias, p + 4096);
        assert_eq!(d.translate(alias).unwrap().pa, d.translate(p + 4096).unwrap().pa);
        d.write(alias + 10, b"through the alias").unwrap();
        let mut out = [0u8; 17];
        d.read(p + 4096 + 10, &mut out).unwrap();
        assert_eq!(&out, b"through the alias");
        assert!(d.unmap_mem(alias - (alias % (2 * MIB))).is_err());
        assert!(d.release_mem_address(alias).is_err());
        assert!(d.map_alias(p, n + 1).is_err() && d.map_alias(p, 0).is_err());
        d.free(p).unwrap();
        d.read(alias + 10, &mut out).unwrap(); // the imported pages outlive the free
        assert_eq!(&out, b"through the alias");
        d.unmap_alias(alias + 5).unwrap();
        assert!(d.read(alias, &mut out).is_err());
        assert!(d.unmap_alias(alias).is_err());
        assert!(d.map_alias(p, 64).is_err());
        d.empty_cache().unwrap();
        assert_eq!(d.mem_info(MemAttr::Hbm).0, GIB, "{allocator:?}: every page came back");
    }
}
