//! libnpumem: npumem's allocators behind a C ABI, in the shape PyTorch's
//! `CUDAPluggableAllocator` and torch_npu's `NPUPluggableAllocator` load
//! (`void* npumem_malloc(ssize_t size, int device, void* stream)`,
//! `void npumem_free(void* ptr, ssize_t size, int device, void* stream)`), plus the hooks those
//! loaders can also take (init, empty cache / reset, memory fraction, record_stream, device
//! stats, reset peak) and `npumem_last_error`. The prototypes and their documentation are in
//! include/npumem.h.
//!
//! Each device index is one `npumem_core::Device`, configured from the environment
//! (`config.rs`), created on first use and guarded by its own mutex (`registry.rs`).
//!
//! Invariants: no entry point panics across the boundary or aborts the process; every entry
//! point checks its arguments before acting, and a failed call changes nothing and leaves the
//! reason in the calling thread's last error (`last_error.rs`); `npumem_free` frees only a live
//! allocation of the named device whose size is the one it was allocated with.

mod config;
mod last_error;
mod registry;
mod stats;

use std::ffi::{c_char, c_int, c_void};
use std::panic::catch_unwind;

use npumem_core::{AclError, ErrorCode, Policy};

use last_error::guarded;
use registry::{MAX_DEVICES, each_device, owner_of, with_device};
use stats::CDeviceStats;

/// Every block is requested as torch_npu's allocator requests device memory
/// (`aclrtMallocAlign32` with HUGE_FIRST): no padding, huge pages where the block is large.
const POLICY: Policy = Policy::HugeFirst;

fn size_arg(size: isize, what: &str) -> Result<u64, AclError> {
    u64::try_from(size).map_err(|_| {
        AclError::invalid_param(format!(
            "size {size} is negative (or a size_t above SSIZE_MAX); {what} takes a byte count of 0 or more"
        ))
    })
}

/// Allocates `size` bytes on `device` for work on `stream` (NULL: the default stream); the block
/// is aligned to 64 bytes. Returns NULL for `size` 0 (without an error) and on failure.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guarded(
        || format!("npumem_malloc(size={size}, device={device}, stream={stream:p})"),
        std::ptr::null_mut(),
        || {
            let bytes = size_arg(size, "npumem_malloc")?;
            if bytes == 0 {
                registry::index(device)?;
                return Ok(std::ptr::null_mut());
            }
            with_device(device, |slot| {
                let stream = slot.stream(stream)?;
                let ptr = slot.device.malloc_on(bytes, POLICY, false, stream)?;
                // The address of memory the backend mapped (exposed when it was mapped).
                Ok(std::ptr::with_exposed_provenance_mut(ptr as usize))
            })
        },
    )
}

/// Frees `ptr` (allocated on `device` with `size` bytes) in the order of `stream`. NULL is a
/// no-op. A size that differs from the allocation's frees nothing and is an error.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    guarded(
        || format!("npumem_free(ptr={ptr:p}, size={size}, device={device}, stream={stream:p})"),
        (),
        || {
            let bytes = size_arg(size, "npumem_free")?;
            if ptr.is_null() {
                return Ok(());
            }
            let addr = ptr.addr() as u64;
            let freed = with_device(device, |slot| {
                let Some(a) = slot.device.allocation(addr) else {
                    // Not live here: the device's free explains why (double free, interior
                    // pointer, never allocated) and frees nothing.
                    return slot.device.free_on(addr, None);
                };
                if a.size != bytes {
                    return Err(AclError::rt_param(format!(
                        "{addr:#x} was allocated with size {} but is freed with size {bytes}; nothing was freed \
                         (pass the size given to npumem_malloc)",
                        a.size
                    )));
                }
                let stream = slot.stream(stream)?;
                slot.device.free_on(addr, Some(stream))
            });
            freed.map_err(|e| {
                // A pointer this device does not know may be another device's.
                let other = (e.code == ErrorCode::RtMemoryFree).then(|| owner_of(addr, usize::try_from(device).ok()));
                match other.flatten() {
                    Some(owner) => AclError::bad_free(format!(
                        "{addr:#x} is a live allocation of device {owner}, not of device {device}: pass device={owner}"
                    )),
                    None => e,
                }
            })
        },
    )
}

/// Records that `stream` also uses the live allocation `ptr` (PyTorch's `record_stream`).
/// NULL is a no-op.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guarded(
        || format!("npumem_record_stream(ptr={ptr:p}, stream={stream:p})"),
        (),
        || {
            if ptr.is_null() {
                return Ok(());
            }
            let addr = ptr.addr() as u64;
            let Some(owner) = owner_of(addr, None) else {
                return Err(AclError::rt_param(format!(
                    "{addr:#x} is not a live allocation of any device; record_stream takes a pointer npumem_malloc \
                     returned and that is not freed yet"
                )));
            };
            with_device(owner as c_int, |slot| {
                let stream = slot.stream(stream)?;
                slot.device.record_stream(addr, stream)
            })
        },
    )
}

/// Reads the configuration and creates devices `0..device_count` (PyTorch's init hook passes
/// the device count). Without it, each device is created on first use.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_init(device_count: c_int) {
    guarded(
        || format!("npumem_init(device_count={device_count})"),
        (),
        || {
            let count = usize::try_from(device_count).ok().filter(|&n| n <= MAX_DEVICES).ok_or_else(|| {
                AclError::invalid_param(format!(
                    "device_count {device_count} is out of range: npumem serves 0 to {MAX_DEVICES} devices"
                ))
            })?;
            registry::config()?;
            (0..count).try_for_each(|i| with_device(i as c_int, |_| Ok(())))
        },
    )
}

/// Returns every device's cached, unused memory to the system (PyTorch's `empty_cache`).
#[unsafe(no_mangle)]
pub extern "C" fn npumem_empty_cache() {
    guarded(|| "npumem_empty_cache()".into(), (), empty_caches)
}

/// torch_npu's reset hook (`void(bool check_error)`): the same as `npumem_empty_cache`; errors
/// are recorded whatever `check_error` says.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_reset(check_error: bool) {
    guarded(|| format!("npumem_reset(check_error={check_error})"), (), empty_caches)
}

fn empty_caches() -> Result<(), AclError> {
    each_device(|i, slot| {
        slot.device.empty_cache().map_err(|e| AclError::new(e.code, format!("device {i}: {}", e.message)))
    })
}

/// Caps what `device`'s allocator may reserve at `fraction` (in [0, 1]) of its capacity.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_set_memory_fraction(fraction: f64, device: c_int) {
    guarded(
        || format!("npumem_set_memory_fraction(fraction={fraction}, device={device})"),
        (),
        || with_device(device, |slot| slot.device.set_memory_fraction(fraction)),
    )
}

/// Fills `*out` (of `out_size` bytes, which must be `sizeof(npumem_device_stats_t)`) with
/// `device`'s statistics. Returns 0, or the error code (also left in the last error).
///
/// # Safety
/// `out` is NULL (an error) or points to `out_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npumem_get_device_stats(device: c_int, out: *mut CDeviceStats, out_size: usize) -> c_int {
    let code = guarded(
        || format!("npumem_get_device_stats(device={device}, out={out:p}, out_size={out_size})"),
        -1,
        || {
            if out.is_null() {
                return Err(AclError::invalid_param("out is NULL; pass a pointer to an npumem_device_stats_t"));
            }
            let expected = std::mem::size_of::<CDeviceStats>();
            if out_size != expected {
                return Err(AclError::invalid_param(format!(
                    "out_size is {out_size} but this library's npumem_device_stats_t has {expected} bytes: pass \
                     sizeof(npumem_device_stats_t) from the npumem.h shipped with this library"
                )));
            }
            let stats = with_device(device, |slot| Ok(CDeviceStats::from(slot.device.pool_stats())))?;
            // SAFETY: `out` is non-NULL and the caller guarantees it points to `out_size` writable
            // bytes, which we checked is the struct's size; unaligned writes are allowed.
            unsafe { out.write_unaligned(stats) };
            Ok(0)
        },
    );
    if code == 0 { 0 } else { last_error::code() }
}

/// Resets the peaks of `device`'s statistics to their current values (`void(int8_t)`: torch_npu's
/// `set_reset_peak_status_fn` takes a `void(c10::DeviceIndex)`, an `int8_t`; AAPCS64 leaves the
/// upper bits of a narrower argument unspecified, so the width must be the caller's).
#[unsafe(no_mangle)]
pub extern "C" fn npumem_reset_peak_stats(device: i8) {
    guarded(
        || format!("npumem_reset_peak_stats(device={device})"),
        (),
        || {
            with_device(c_int::from(device), |slot| {
                slot.device.reset_peak_stats();
                Ok(())
            })
        },
    )
}

/// Why the calling thread's last npumem call failed, or NULL if it succeeded. The string stays
/// valid until the thread's next npumem call (other than these two readers).
#[unsafe(no_mangle)]
pub extern "C" fn npumem_last_error() -> *const c_char {
    catch_unwind(last_error::message).unwrap_or(std::ptr::null())
}

/// The AscendCL code (`aclError`) of the calling thread's last failed call, or 0.
#[unsafe(no_mangle)]
pub extern "C" fn npumem_last_error_code() -> c_int {
    catch_unwind(last_error::code).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last_error() -> Option<String> {
        let p = npumem_last_error();
        // SAFETY: a non-NULL last error is a live NUL-terminated string until our next call.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    fn stats(device: c_int) -> CDeviceStats {
        let mut s = CDeviceStats::default();
        // SAFETY: `s` is a live, writable CDeviceStats.
        assert_eq!(unsafe { npumem_get_device_stats(device, &mut s, std::mem::size_of::<CDeviceStats>()) }, 0);
        s
    }

    #[test]
    fn the_exports_have_the_header_prototypes() {
        let _: extern "C" fn(isize, c_int, *mut c_void) -> *mut c_void = npumem_malloc;
        let _: extern "C" fn(*mut c_void, isize, c_int, *mut c_void) = npumem_free;
        let _: extern "C" fn(*mut c_void, *mut c_void) = npumem_record_stream;
        let _: extern "C" fn(c_int) = npumem_init;
        let _: extern "C" fn() = npumem_empty_cache;
        let _: extern "C" fn(bool) = npumem_reset;
        let _: extern "C" fn(f64, c_int) = npumem_set_memory_fraction;
        let _: unsafe extern "C" fn(c_int, *mut CDeviceStats, usize) -> c_int = npumem_get_device_stats;
        let _: extern "C" fn(i8) = npumem_reset_peak_stats;
        let _: extern "C" fn() -> *const c_char = npumem_last_error;
        let _: extern "C" fn() -> c_int = npumem_last_error_code;
    }

    // Each test uses its own device index: the tests share the process's devices.

    #[test]
    fn malloc_writes_and_free_on_streams() {
        let dev = 1;
        let stream = 0x1000 as *mut c_void;
        let p = npumem_malloc(4096, dev, stream);
        assert!(!p.is_null(), "{:?}", last_error());
        assert_eq!(p as usize % 64, 0);
        // SAFETY: `p` is a live 4096-byte block of real host memory (the default backend).
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xab, 4096) };
        let q = npumem_malloc(100, dev, std::ptr::null_mut());
        npumem_record_stream(q, stream);
        assert_eq!(last_error(), None);
        assert_eq!(stats(dev).allocation[0].current, 2);
        npumem_free(p, 4096, dev, stream);
        npumem_free(q, 100, dev, std::ptr::null_mut());
        assert_eq!(last_error(), None);
        assert_eq!(stats(dev).allocated_bytes[0].current, 0);
    }

    #[test]
    fn bad_calls_are_errors_that_change_nothing() {
        let dev = 2;
        assert!(npumem_malloc(-1, dev, std::ptr::null_mut()).is_null());
        assert_eq!(npumem_last_error_code(), 100_000);
        assert!(last_error().unwrap().contains("size -1 is negative"));
        assert!(npumem_malloc(1, 64, std::ptr::null_mut()).is_null());
        assert!(last_error().unwrap().contains("device 64 is out of range"));
        assert!(npumem_malloc(0, dev, std::ptr::null_mut()).is_null());
        assert_eq!(last_error(), None);

        let p = npumem_malloc(1000, dev, std::ptr::null_mut());
        npumem_free(p, 999, dev, std::ptr::null_mut());
        assert!(last_error().unwrap().contains("allocated with size 1000 but is freed with size 999"));
        npumem_free(p, 1000, 3, std::ptr::null_mut());
        assert!(last_error().unwrap().contains("is a live allocation of device 2, not of device 3"));
        assert_eq!(stats(dev).allocation[0].current, 1);
        npumem_free(p, 1000, dev, std::ptr::null_mut());
        assert_eq!(last_error(), None);
        npumem_free(p, 1000, dev, std::ptr::null_mut());
        assert!(last_error().unwrap().contains("double free"));
        npumem_record_stream(p, std::ptr::null_mut());
        assert!(last_error().unwrap().contains("not a live allocation of any device"));
        npumem_set_memory_fraction(f64::NAN, dev);
        assert_eq!(npumem_last_error_code(), 100_000);
        // SAFETY: NULL is refused before any write.
        assert_eq!(unsafe { npumem_get_device_stats(dev, std::ptr::null_mut(), 0) }, 100_000);
        let mut s = CDeviceStats::default();
        // SAFETY: `s` is writable; the wrong size is refused before any write.
        assert_eq!(unsafe { npumem_get_device_stats(dev, &mut s, 8) }, 100_000);
        npumem_init(65);
        assert!(last_error().unwrap().contains("device_count 65 is out of range"));
        npumem_free(std::ptr::null_mut(), 0, dev, std::ptr::null_mut());
        assert_eq!(last_error(), None);
    }
}
