//! npumem-core: the memory system of an Ascend-style NPU, in pure Rust.
//!
//! Layers, each using only the ones before it: [`vm`] (VA window, frames, page table, byte store)
//! → [`backend`] (the driver-level VMM API: reserve, physical allocations, map, byte access) →
//! [`pool`] (allocators that turn `malloc` into backend calls) → [`device`] (AscendCL semantics:
//! policies, padding, bounds-checked copies, host memory). [`plan`] (static memory planning)
//! stands alone. [`error`], [`units`], [`acl`] and [`prefetch`] (a cache hint) are
//! leaves every layer may use.

pub mod error;
pub mod prefetch;
pub mod units;
pub mod vm;

pub use error::{AclError, ErrorCode, Result};
pub mod acl;
pub mod backend;
pub mod device;
pub mod host;
pub mod hostpool;
pub mod kernels;
pub mod plan;
pub mod policy;
pub mod pool;

pub use acl::{MemAttr, MemcpyKind, Policy};
pub use device::{Allocation, AllocatorKind, BackendKind, Device, DeviceConfig, DeviceStats, ReusePolicy};
pub mod sanitizer;
pub mod stream;
