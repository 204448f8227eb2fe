//! npumem-core: the memory system of an Ascend-style NPU, in pure Rust.
//!
//! Layering rules (each module uses only those listed for it; `device` is the top):
//! - [`error`] and [`units`] are npumem-base's; [`plan`], [`hostpool`] and [`vm::tlb`] are the
//!   crates npumem-plan, npumem-hostpool and npumem-tlb. They are re-exported for the crates
//!   above; they cannot use this crate (Cargo refuses the cycle), and no module here uses
//!   [`plan`] or [`hostpool`];
//! - every module but [`prefetch`] (a cache hint) and [`snapshot_pickle`] (the admission scan
//!   of PyTorch snapshot pickles) uses [`error`]; both are leaves;
//! - [`acl`], [`stream`] (queues and events) and [`kernels`] (measurement kernels over host
//!   slices) use [`error`] only;
//! - [`vm`] (VA window, frames, page table, byte store) uses [`units`];
//! - [`policy`] uses [`acl`], [`units`], [`vm`]; [`sanitizer`] uses [`stream`];
//! - [`backend`] (the driver-level VMM API) uses [`acl`], [`stream`], [`units`], [`vm`];
//!   [`host`] (page-locked host memory) uses [`backend`], [`units`];
//! - [`pool`] (allocators over a backend) uses [`acl`], [`backend`], [`policy`], [`units`],
//!   [`vm`];
//! - [`device`] (AscendCL semantics) uses all of the above except [`kernels`], [`plan`] and
//!   [`hostpool`].

pub use npumem_base::{error, units};
pub use npumem_hostpool as hostpool;
pub use npumem_plan as plan;

pub mod prefetch;
pub mod vm;

pub use error::{AclError, ErrorCode, Result};
pub mod acl;
pub mod backend;
pub mod device;
pub mod host;
pub mod kernels;
pub mod policy;
pub mod pool;

pub use acl::{MemAttr, MemcpyKind, Policy};
pub use device::{Allocation, AllocatorKind, BackendKind, Device, DeviceConfig, DeviceStats, ReusePolicy};
pub mod sanitizer;
pub mod snapshot_pickle;
pub mod stream;
