//! npumem-base: what every npumem crate shares.
//!
//! Rules:
//! - it depends on no other npumem crate, and holds only what two or more of them need:
//!   [`error`] (the AscendCL-style [`AclError`] every fallible operation returns), [`units`]
//!   (byte sizes: parsing, formatting, alignment) and [`page`] ([`PageSize`], [`Translation`]);
//! - nothing here knows a device, a backend or an allocator.

pub mod error;
pub mod page;
pub mod units;

pub use error::{AclError, ErrorCode, Result};
pub use page::{PageSize, Translation};
