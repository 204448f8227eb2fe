//! Loading an accelerator runtime at run time (`libloading`), for the AscendCL and CUDA
//! backends: the search for the library, the symbol table resolved up front, and the cache that
//! keeps each loaded runtime for the life of the process.
//!
//! A runtime is never unloaded: its worker threads and its callbacks would outlive the code, so
//! each library is opened once per path and leaked (`&'static`), as a process keeps its driver.
//!
//! Invariants: a runtime is usable only when every symbol of its table resolved (none is looked
//! up later); a library that cannot be opened or lacks a symbol is an
//! `ACL_ERROR_FEATURE_UNSUPPORTED` (200006) error naming every place searched, why each failed,
//! and every missing symbol; a library is opened at most once per path.

use std::collections::HashMap;
use std::sync::LazyLock;

use libloading::Library;
use parking_lot::Mutex;

use crate::error::{AclError, ErrorCode, Result};

/// One place to look for a library: what it is (for messages) and the name or path to open.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub source: String,
    pub path: String,
}

impl Candidate {
    pub fn new(source: impl Into<String>, path: impl Into<String>) -> Self {
        Candidate { source: source.into(), path: path.into() }
    }
}

/// A library opened and kept for the life of the process, with what it was opened as.
pub struct Opened {
    pub library: &'static Library,
    pub path: String,
}

static OPENED: LazyLock<Mutex<HashMap<String, &'static Library>>> = LazyLock::new(Default::default);

/// Opens the first of `candidates` that loads (once per path; later calls get the same
/// library). `what` names the runtime and `hint` says how to point npumem at it, for the error.
pub fn open(what: &str, candidates: &[Candidate], hint: &str) -> Result<Opened> {
    let mut tried = Vec::new();
    let mut opened = OPENED.lock();
    for c in candidates {
        if let Some(&library) = opened.get(&c.path) {
            return Ok(Opened { library, path: c.path.clone() });
        }
        // SAFETY: loading a library runs its initialisers; the runtimes npumem loads are the
        // vendors' (or the test stand-ins), whose initialisers have no preconditions.
        match unsafe { Library::new(&c.path) } {
            Ok(library) => {
                let library: &'static Library = Box::leak(Box::new(library));
                opened.insert(c.path.clone(), library);
                return Ok(Opened { library, path: c.path.clone() });
            }
            Err(e) => tried.push(format!("{} ({}): {e}", c.path, c.source)),
        }
    }
    Err(AclError::new(
        ErrorCode::FeatureUnsupported,
        format!("cannot load {what}; searched {}. {hint}", tried.join("; ")),
    ))
}

/// Resolves `name` in `library` as a `T` (a function pointer type), or records it as missing.
///
/// # Safety
/// `T` must be the C signature the library's `name` has.
pub unsafe fn symbol<T: Copy>(library: &'static Library, name: &str, missing: &mut Vec<String>) -> Option<T> {
    // SAFETY: the caller vouches for the signature; the library is never unloaded, so the
    // pointer stays valid for the life of the process.
    match unsafe { library.get::<T>(name.as_bytes()) } {
        Ok(s) => Some(*s),
        Err(_) => {
            missing.push(name.to_string());
            None
        }
    }
}

/// The error for a library without some of the symbols npumem needs.
pub fn missing_symbols(what: &str, path: &str, missing: &[String]) -> AclError {
    AclError::new(
        ErrorCode::FeatureUnsupported,
        format!(
            "{path} was loaded as {what} but lacks {} symbol(s) npumem needs: {}; point npumem at a complete {what}",
            missing.len(),
            missing.join(", ")
        ),
    )
}

/// Declares a table of C functions resolved from a library all at once:
/// `api! { pub struct Name { field: PFN_type = "symbol", ... } }` makes `Name` with one
/// function pointer per entry (of its `PFN_` type, the C signature `npumem-ffi` declares) and
/// `Name::resolve(opened, what)`, which fails naming every missing symbol.
macro_rules! api {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident : $ty:ty = $sym:literal,)+ }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        $vis struct $name {
            $(pub $field: $ty,)+
        }

        impl $name {
            /// Resolves every symbol of the table in `opened`.
            #[allow(non_snake_case)]
            pub fn resolve(opened: &$crate::backend::ffi::Opened, what: &str) -> $crate::error::Result<Self> {
                let mut missing = Vec::new();
                // SAFETY: each type is the signature the runtime's header declares.
                $(let $field = unsafe { $crate::backend::ffi::symbol::<$ty>(opened.library, $sym, &mut missing) };)+
                match ($($field,)+) {
                    ($(Some($field),)+) => Ok($name { $($field,)+ }),
                    _ => Err($crate::backend::ffi::missing_symbols(what, &opened.path, &missing)),
                }
            }
        }
    };
}
pub(crate) use api;

/// The value of an environment variable, `None` when unset or empty.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{c_char, c_void};

    api! {
        #[allow(dead_code)] // resolving it must fail
        struct LibcPart {
            malloc: unsafe extern "C" fn(usize) -> *mut c_void = "malloc",
            strlen: unsafe extern "C" fn(*const c_char) -> usize = "strlen",
            npumem_nowhere: unsafe extern "C" fn() -> i32 = "npumem_nowhere",
            npumem_nowhere_either: unsafe extern "C" fn() -> i32 = "npumem_nowhere_either",
        }
    }

    api! {
        struct LibcFine {
            strlen: unsafe extern "C" fn(*const c_char) -> usize = "strlen",
        }
    }

    #[test]
    fn absent_libraries_and_symbols_are_named() {
        let e = open(
            "the test runtime",
            &[
                Candidate::new("TEST_VAR", "/nonexistent/libnothing.so"),
                Candidate::new("the loader path", "libnothing.so"),
            ],
            "Set TEST_VAR.",
        )
        .err()
        .unwrap();
        assert_eq!(e.code, ErrorCode::FeatureUnsupported);
        for needle in ["/nonexistent/libnothing.so (TEST_VAR)", "libnothing.so (the loader path)", "Set TEST_VAR."] {
            assert!(e.message.contains(needle), "{}", e.message);
        }
        let libc = open("libc", &[Candidate::new("the loader path", "libc.so.6")], "").unwrap();
        let again = open("libc", &[Candidate::new("the loader path", "libc.so.6")], "").unwrap();
        assert!(std::ptr::eq(libc.library, again.library), "opened once");
        let e = LibcPart::resolve(&libc, "the test runtime").err().unwrap();
        assert_eq!(e.code, ErrorCode::FeatureUnsupported);
        assert!(e.message.contains("libc.so.6 was loaded as the test runtime"), "{}", e.message);
        assert!(e.message.contains("2 symbol(s) npumem needs: npumem_nowhere, npumem_nowhere_either"), "{}", e.message);
        let fine = LibcFine::resolve(&libc, "libc").unwrap();
        // SAFETY: strlen of a NUL-terminated string.
        assert_eq!(unsafe { (fine.strlen)(c"npumem".as_ptr()) }, 6);
    }
}
