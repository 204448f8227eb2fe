//! The C declarations npumem shares between the backends that load a runtime
//! (`npumem-core`'s `backend::acl` and `backend::cuda`) and the stand-ins that export one
//! (`npumem-fake-acl`, `npumem-fake-cuda`): one definition of each struct, enum value, error
//! code and function signature, so that both sides cannot drift apart.
//!
//! Rules:
//! - names, field names and values are the headers' (`acl_rt.h`, `acl_base_rt.h` and
//!   `rt_error_codes.h` of AscendCL, as in `hicann/runtime`; `cuda.h` of CUDA 12), spelled as
//!   bindgen would spell them (`type_` for a field named `type`);
//! - a C enum is a type alias of its integer with one constant per value ([`c_enum!`]), and a
//!   table of every value with its name, so that a value the header does not define is only an
//!   integer, never undefined behaviour;
//! - every struct is `#[repr(C)]` and has a layout test (size, alignment, offsets) against the
//!   header;
//! - a `PFN_name` is the C signature of the runtime's function `name` (as `cudaTypedefs.h`
//!   names them): the backend loads the symbol as that type, and the stand-in checks at compile
//!   time that its export has it;
//! - nothing here calls anything: this crate has no dependencies and no `unsafe`.

#![forbid(unsafe_code)]
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::CStr;

/// Declares a C enum (or a family of `#define`d codes): `pub type $ty = $repr;`, one `pub
/// const` per value, and `$table`, every value with its name.
#[macro_export]
macro_rules! c_enum {
    ($(#[$meta:meta])* $ty:ident = $repr:ty, $table:ident { $($(#[$vmeta:meta])* $name:ident = $value:expr,)+ }) => {
        $(#[$meta])*
        pub type $ty = $repr;
        $($(#[$vmeta])* pub const $name: $ty = $value;)+
        /// Every value of the enum with its name in the header.
        pub const $table: &[($ty, &::std::ffi::CStr)] = &[$(($name, $crate::cstr(concat!(stringify!($name), "\0"))),)+];
    };
}

/// `s` (which ends in its only NUL) as a C string, at compile time.
#[doc(hidden)]
pub const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a C name must end in its only NUL"),
    }
}

/// The name of `value` in `table` (a [`c_enum!`] table), if the header defines it.
pub fn name_of<T: Copy + PartialEq>(table: &[(T, &'static CStr)], value: T) -> Option<&'static CStr> {
    table.iter().find(|(v, _)| *v == value).map(|&(_, name)| name)
}

pub mod acl;
pub mod cuda;
