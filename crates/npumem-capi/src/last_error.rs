//! The error channel of the C ABI: every entry point runs through [`guarded`], which clears the
//! calling thread's last error, runs the call with panics caught, and on failure records the
//! error for `npumem_last_error` / `npumem_last_error_code` and returns the call's fallback
//! value (NULL, nothing, or an error code).
//!
//! Invariants: no panic unwinds out of an entry point; after an entry point returns, the thread's
//! last error is set exactly when that call failed; the message is a NUL-terminated string that
//! stays valid until the thread's next npumem call.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use npumem_core::{AclError, Result};

thread_local! {
    /// The last failed call's error on this thread: (AscendCL code, message).
    static LAST: RefCell<Option<(c_int, CString)>> = const { RefCell::new(None) };
}

/// Runs `f` as the body of an entry point: `call` describes the call (built only on failure,
/// to prefix the message), `fallback` is what the entry point returns when `f` fails or panics.
pub(crate) fn guarded<T>(call: impl FnOnce() -> String, fallback: T, f: impl FnOnce() -> Result<T>) -> T {
    clear();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => {
            record(&call(), &e);
            fallback
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            let e = AclError::internal(format!(
                "npumem panicked ({what}); the call did nothing that can be relied on. This is a bug in npumem: \
                 please report it with the call and NPUMEM_* settings"
            ));
            record(&call(), &e);
            fallback
        }
    }
}

fn clear() {
    // A thread being torn down has no last error to clear (try_with never panics).
    let _ = LAST.try_with(|last| {
        if last.borrow().is_some() {
            *last.borrow_mut() = None;
        }
    });
}

fn record(call: &str, e: &AclError) {
    let text = format!("{call}: {e}").replace('\0', "\\0");
    let message = CString::new(text).unwrap_or_default();
    let _ = LAST.try_with(|last| *last.borrow_mut() = Some((e.code.value() as c_int, message)));
}

/// The calling thread's last error message, or NULL when its last npumem call succeeded.
pub(crate) fn message() -> *const c_char {
    LAST.try_with(|last| last.borrow().as_ref().map_or(std::ptr::null(), |(_, m)| m.as_ptr()))
        .unwrap_or(std::ptr::null())
}

/// The calling thread's last error code (an AscendCL `aclError` value), or 0.
pub(crate) fn code() -> c_int {
    LAST.try_with(|last| last.borrow().as_ref().map_or(0, |(c, _)| *c)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn a_failure_is_recorded_and_the_next_success_clears_it() {
        let out = guarded(|| "npumem_test(1)".into(), -1, || Err(AclError::invalid_param("bad \0 value")));
        assert_eq!(out, -1);
        assert_eq!(code(), 100_000);
        // SAFETY: message() points at the thread's live CString until the next guarded call.
        let text = unsafe { CStr::from_ptr(message()) }.to_str().unwrap().to_string();
        assert_eq!(text, "npumem_test(1): ACL_ERROR_INVALID_PARAM (100000): bad \\0 value");
        assert_eq!(guarded(|| unreachable!(), 0, || Ok(7)), 7);
        assert!(message().is_null());
        assert_eq!(code(), 0);
    }

    #[test]
    fn a_panic_becomes_an_internal_error() {
        let out = guarded(|| "npumem_test()".into(), 0u8, || panic!("boom"));
        assert_eq!(out, 0);
        assert_eq!(code(), 507_899);
        // SAFETY: as above.
        let text = unsafe { CStr::from_ptr(message()) }.to_str().unwrap().to_string();
        assert!(text.starts_with("npumem_test(): ACL_ERROR_RT_DRV_INTERNAL_ERROR") && text.contains("boom"), "{text}");
    }
}
