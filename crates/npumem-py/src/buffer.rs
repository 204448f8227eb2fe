//! `npumem._native.DeviceBuffer`: an allocation that owns its block, made by `Device.buffer` in
//! one call and freed when the object is collected (like `HostPool.buffer`, or `np.empty`).
//!
//! The type is written against the C API, not as a PyO3 class: a PyO3 class is always a
//! garbage-collected type (tracked at creation, untracked at deallocation, counted towards the
//! collector's generations), and its slots go through PyO3's trampolines. This object holds no
//! Python object at all — a holder of the core device (`SharedDevice`), its pointer and length — so it can form no
//! reference cycle and needs no collector: it is a plain object (`PyObject_Malloc`,
//! `PyObject_Free`), as `np.empty`'s array is.
//!
//! Invariants: while the object lives, its allocation is held in the device (a plain `free` of
//! its pointer is refused), so the block is freed exactly once, by the object's deallocation, and
//! never after its address was reused; the object shares ownership of the core device, so the
//! device outlives it even when the `Device` object that made it is gone. Its fields never change
//! after creation. It converts to its pointer (`int(buf)`, `operator.index`), so it goes wherever
//! a pointer does; on a backend whose memory is this process's (`backend="host"`) it exports its
//! bytes through the buffer protocol (each export pins the block too). No callback lets a panic
//! cross into Python.
//!
//! `Device.buffer(nbytes)` with one exact int is a C-API method too (`device::fast`). The memory
//! of deallocated objects is kept for the next ones (`FreeList`, at most `FREE_MAX` blocks,
//! reached only by a thread that holds the GIL), as CPython keeps its floats and tuples: a
//! program that makes and drops buffers in a loop skips the object allocator.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use npumem_core::AclError;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::errors::{catch_panics, to_py};
use crate::export::fill_buffer;
use crate::shared::SharedDevice;

/// The object's layout: a plain (untracked) Python object and the block it owns.
#[repr(C)]
struct RawBuffer {
    ob_base: ffi::PyObject,
    /// A holder of the device, given up by the deallocation.
    device: SharedDevice,
    ptr: u64,
    len: u64,
}

/// The type object, made once at module initialisation and kept for the life of the process.
static TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(ptr::null_mut());

/// Objects kept for reuse at most.
const FREE_MAX: usize = 64;

/// The memory of deallocated objects (each `size_of::<RawBuffer>()` bytes from
/// `PyObject_Malloc`, holding nothing), kept for `new_buffer`.
struct FreeList {
    blocks: std::cell::UnsafeCell<([*mut c_void; FREE_MAX], usize)>,
}

// SAFETY: the list is reached only by `pop` and `push`, whose callers hold the GIL (the slots
// and methods of this module run attached, and on a build with the GIL attached means holding
// it); a build without the GIL has no list (`FREE_LIST` is `None` there).
unsafe impl Sync for FreeList {}

#[cfg(not(Py_GIL_DISABLED))]
static FREE_LIST: Option<FreeList> =
    Some(FreeList { blocks: std::cell::UnsafeCell::new(([ptr::null_mut(); FREE_MAX], 0)) });
#[cfg(Py_GIL_DISABLED)]
static FREE_LIST: Option<FreeList> = None;

impl FreeList {
    /// A kept block, or `None`.
    ///
    /// # Safety
    /// The calling thread holds the GIL.
    unsafe fn pop(&self) -> Option<*mut c_void> {
        // SAFETY: the GIL, held by the caller, excludes every other access to the list.
        let (blocks, len) = unsafe { &mut *self.blocks.get() };
        *len = len.checked_sub(1)?;
        Some(blocks[*len])
    }

    /// Keeps `obj` (the memory of a deallocated object) unless the list is full; whether kept.
    ///
    /// # Safety
    /// The calling thread holds the GIL; `obj` came from `PyObject_Malloc` with this object's
    /// size and is used by nobody.
    unsafe fn push(&self, obj: *mut c_void) -> bool {
        // SAFETY: as `pop`.
        let (blocks, len) = unsafe { &mut *self.blocks.get() };
        if *len == FREE_MAX {
            return false;
        }
        blocks[*len] = obj;
        *len += 1;
        true
    }
}

/// The getters' table; CPython keeps a pointer to it for the life of the type.
struct GetSets([ffi::PyGetSetDef; 3]);
// SAFETY: the table is immutable data (static C strings and function pointers), never written.
unsafe impl Sync for GetSets {}

static GETSETS: GetSets = GetSets([
    ffi::PyGetSetDef {
        name: c"ptr".as_ptr(),
        get: Some(get_ptr),
        set: None,
        doc: c"The block's device pointer.".as_ptr(),
        closure: ptr::null_mut(),
    },
    ffi::PyGetSetDef {
        name: c"nbytes".as_ptr(),
        get: Some(get_nbytes),
        set: None,
        doc: c"Bytes asked for.".as_ptr(),
        closure: ptr::null_mut(),
    },
    ffi::PyGetSetDef { name: ptr::null(), get: None, set: None, doc: ptr::null(), closure: ptr::null_mut() },
]);

/// Creates the `DeviceBuffer` type (once, at module initialisation).
pub fn create_type(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let slot = |slot: c_int, pfunc: *mut c_void| ffi::PyType_Slot { slot, pfunc };
    let mut slots = [
        slot(ffi::Py_tp_dealloc, dealloc as *mut c_void),
        slot(ffi::Py_nb_index, to_int as *mut c_void),
        slot(ffi::Py_nb_int, to_int as *mut c_void),
        slot(ffi::Py_mp_length, length as *mut c_void),
        slot(ffi::Py_tp_repr, repr as *mut c_void),
        slot(ffi::Py_tp_getset, GETSETS.0.as_ptr() as *mut c_void),
        slot(ffi::Py_bf_getbuffer, get_buffer as *mut c_void),
        slot(ffi::Py_bf_releasebuffer, release_buffer as *mut c_void),
        slot(
            ffi::Py_tp_doc,
            c"An allocation that owns its block (Device.buffer): freed when collected; converts to its \
              pointer; exports its bytes through the buffer protocol on the host backend."
                .as_ptr() as *mut c_void,
        ),
        slot(0, ptr::null_mut()),
    ];
    let mut spec = ffi::PyType_Spec {
        // A static string: CPython 3.11 keeps this pointer as the type's tp_name.
        name: c"npumem._native.DeviceBuffer".as_ptr(),
        basicsize: std::mem::size_of::<RawBuffer>() as c_int,
        itemsize: 0,
        flags: (ffi::Py_TPFLAGS_DEFAULT | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION | ffi::Py_TPFLAGS_IMMUTABLETYPE) as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec is complete (slots end with a zero entry; the name, doc and getset table
    // are static); the call returns a new reference or NULL with an exception set.
    let ty = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_FromSpec(&mut spec))? };
    let ty = ty.cast_into::<PyType>()?;
    // The type lives for the rest of the process: this reference is never released.
    let raw = ty.clone().into_ptr().cast::<ffi::PyTypeObject>();
    TYPE.store(raw, Ordering::Release);
    Ok(ty)
}

/// A `DeviceBuffer` owning the live allocation of `len` bytes at `ptr`, already held in
/// `device` (`Device::malloc_held`), for `device`, a holder of it. Should the object not be
/// made, the block is freed.
pub fn new_buffer<'py>(py: Python<'py>, device: SharedDevice, ptr: u64, len: u64) -> PyResult<Bound<'py, PyAny>> {
    let ty = TYPE.load(Ordering::Acquire);
    let obj = if ty.is_null() {
        ptr::null_mut()
    } else {
        // SAFETY: the caller is attached (it holds `py`): with the GIL, it holds the GIL.
        // `PyObject_Malloc` may be called on an attached thread (any size; NULL on failure).
        unsafe { FREE_LIST.as_ref().and_then(|l| l.pop()) }
            .unwrap_or_else(|| unsafe { ffi::PyObject_Malloc(size_of::<RawBuffer>()) })
    };
    if obj.is_null() {
        let _ = device.release_with(|d| d.free_held(ptr));
        return Err(if ty.is_null() {
            PyRuntimeError::new_err("npumem._native is not initialised")
        } else {
            PyMemoryError::new_err("no memory for a DeviceBuffer object")
        });
    }
    // SAFETY: `ty` is the type made by `create_type`, alive for the process; `obj` is a block of
    // its basic size, initialised as an object of that type (which takes a reference to the
    // heap type), and its fields are written before it is shared; the result is a new reference.
    unsafe {
        let obj = ffi::PyObject_Init(obj.cast(), ty).cast::<RawBuffer>();
        (&raw mut (*obj).device).write(device);
        (&raw mut (*obj).ptr).write(ptr);
        (&raw mut (*obj).len).write(len);
        Ok(Bound::from_owned_ptr(py, obj.cast()))
    }
}

/// The object's fields.
///
/// # Safety
/// `obj` is a live `DeviceBuffer`.
unsafe fn fields<'a>(obj: *mut ffi::PyObject) -> &'a RawBuffer {
    // SAFETY: the caller passes a live object of this type; its fields are never written after
    // creation, so a shared reference for the call's duration is sound.
    unsafe { &*obj.cast::<RawBuffer>() }
}

/// The object's device, borrowed for the object's life.
///
/// # Safety
/// `obj` is a live `DeviceBuffer`.
unsafe fn device<'a>(obj: *mut ffi::PyObject) -> &'a SharedDevice {
    // SAFETY: as `fields`.
    unsafe { &fields(obj).device }
}

/// Raises `err` in Python (the caller returns its C API failure value).
fn raise(err: PyErr) {
    // SAFETY: every slot below is called by the interpreter on an attached thread.
    err.restore(unsafe { Python::assume_attached() });
}

/// The internal error a panic becomes.
fn panicked() -> PyErr {
    PyRuntimeError::new_err("npumem hit an internal error in DeviceBuffer; please report it")
}

unsafe extern "C" fn dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: called once, when the last reference is gone, on an attached thread; the fields
    // are read before the memory goes back (to the free list, which holds nothing of them, or
    // to the allocator), and the device count taken at creation is released here.
    unsafe {
        let ptr = fields(obj).ptr;
        let device = ptr::read(&raw const (*obj.cast::<RawBuffer>()).device);
        // One critical section frees the block and gives up the holder. A deallocation cannot
        // raise: a free the driver refuses leaves the block to the device's leak report (the
        // device counts it live).
        let _ = device.release_with(|d| d.free_held(ptr));
        let ty = ffi::Py_TYPE(obj);
        if !FREE_LIST.as_ref().is_some_and(|l| l.push(obj.cast())) {
            ffi::PyObject_Free(obj.cast());
        }
        // Instances of a heap type hold a reference to it (taken by `PyObject_Init`).
        ffi::Py_DECREF(ty.cast());
    }
}

unsafe extern "C" fn to_int(obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: the interpreter passes a live object of this type.
    unsafe { ffi::PyLong_FromUnsignedLongLong(fields(obj).ptr) }
}

unsafe extern "C" fn get_ptr(obj: *mut ffi::PyObject, _closure: *mut c_void) -> *mut ffi::PyObject {
    // SAFETY: as `to_int`.
    unsafe { to_int(obj) }
}

unsafe extern "C" fn get_nbytes(obj: *mut ffi::PyObject, _closure: *mut c_void) -> *mut ffi::PyObject {
    // SAFETY: the interpreter passes a live object of this type.
    unsafe { ffi::PyLong_FromUnsignedLongLong(fields(obj).len) }
}

unsafe extern "C" fn length(obj: *mut ffi::PyObject) -> ffi::Py_ssize_t {
    // SAFETY: the interpreter passes a live object of this type.
    let len = unsafe { fields(obj).len };
    ffi::Py_ssize_t::try_from(len).unwrap_or(ffi::Py_ssize_t::MAX)
}

unsafe extern "C" fn repr(obj: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: the interpreter passes a live object of this type.
    let (ptr, len) = unsafe { (fields(obj).ptr, fields(obj).len) };
    // No `{:#x}` in PyUnicode_FromFormat: the text is formatted here.
    let text = format!("DeviceBuffer(ptr={ptr:#x}, nbytes={len})\0");
    // SAFETY: `text` is a NUL-terminated string without `%`, used as a plain format.
    unsafe { ffi::PyUnicode_FromString(text.as_ptr().cast::<c_char>()) }
}

unsafe extern "C" fn get_buffer(obj: *mut ffi::PyObject, view: *mut ffi::Py_buffer, flags: c_int) -> c_int {
    // SAFETY: the interpreter passes a live object of this type, on an attached thread.
    let (this, device, py) = unsafe { (fields(obj), device(obj), Python::assume_attached()) };
    let (ptr, len) = (this.ptr, this.len);
    let export = || -> PyResult<()> {
        let size =
            usize::try_from(len).map_err(|_| to_py(py, AclError::invalid_param("the buffer is larger than memory")))?;
        // Refused (with the reason) where the memory is not this process's (the simulator).
        catch_panics(|| device.lock().pin(ptr, len)).map_err(|e| to_py(py, e))?;
        // SAFETY: `obj` is alive for this call; `size` bytes at `ptr` are a live allocation of
        // the host backend, mapped read-write in this process while the export (which
        // references this object) holds its pin.
        let filled = unsafe { fill_buffer(&Bound::from_borrowed_ptr(py, obj), view, ptr as *mut c_void, size, flags) };
        if filled.is_err() {
            device.lock().unpin(ptr);
        }
        filled
    };
    match catch_unwind(AssertUnwindSafe(export)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            raise(e);
            -1
        }
        Err(_) => {
            raise(panicked());
            -1
        }
    }
}

unsafe extern "C" fn release_buffer(obj: *mut ffi::PyObject, _view: *mut ffi::Py_buffer) {
    // SAFETY: the interpreter passes the live exporter (the view still references it).
    let (ptr, device) = unsafe { (fields(obj).ptr, device(obj)) };
    let _ = catch_unwind(AssertUnwindSafe(|| device.lock().unpin(ptr)));
}
