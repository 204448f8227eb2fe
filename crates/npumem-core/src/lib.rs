//! npumem-core: the memory system of an Ascend-style NPU, in pure Rust.
//!
//! Layering rules (each module uses only those listed for it; `device` is the top):
//! - leaves: [`error`], [`prefetch`] (a cache hint);
//! - [`units`], [`acl`], [`stream`] (queues and events), [`plan`] (static memory planning) use
//!   [`error`] only; [`hostpool`] uses [`error`] and [`units`];
//! - [`vm`] (VA window, frames, page table, byte store, TLB model) uses [`error`], [`units`];
//! - [`policy`] uses [`acl`], [`units`], [`vm`]; [`sanitizer`] uses [`stream`];
//! - [`backend`] (the driver-level VMM API) uses [`acl`], [`stream`], [`units`], [`vm`];
//!   [`host`] (page-locked host memory) uses [`backend`], [`units`];
//! - [`pool`] (allocators over a backend) uses [`acl`], [`backend`], [`policy`], [`units`],
//!   [`vm`];
//! - [`device`] (AscendCL semantics) uses all of the above except [`plan`] and [`hostpool`].

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
