//! What the replay tests share: a small simulated device of each allocator family.

use npumem_core::backend::SimConfig;
use npumem_core::vm::PageSize;
use npumem_core::{AllocatorKind, Device, DeviceConfig};
use proptest::prelude::*;

/// A simulated device of `capacity` bytes with 4 KiB normal pages (and, with `faults`, a
/// backend that can be told to fail driver calls).
pub fn device(allocator: AllocatorKind, capacity: u64, faults: bool) -> Device {
    let sim = SimConfig { capacity, normal_page: PageSize::Size4K, giant_frames: 0 };
    Device::new(DeviceConfig { sim, allocator, faults, ..Default::default() }).unwrap()
}

/// Every allocator family.
pub fn family() -> impl Strategy<Value = AllocatorKind> {
    prop_oneof![
        Just(AllocatorKind::Npumem),
        Just(AllocatorKind::PyTorch),
        Just(AllocatorKind::TorchNpu),
        Just(AllocatorKind::Direct)
    ]
}
