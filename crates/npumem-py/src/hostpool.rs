//! `npumem._native.HostPool` / `HostBlock`: the core's `HostPool` for Python.
//!
//! - A `HostBlock` exports its memory through the buffer protocol (memoryviews view it and keep
//!   it alive) and gives it back to the pool when the last view goes.
//! - The pool's NEP 49 `PyDataMem_Handler` (one capsule per pool, made on first use) serves
//!   NumPy's own data allocations once `set_numpy_handler` installs it, and owns the data of the
//!   arrays `empty`/`zeros`/`array` make: they are built as NumPy builds its own (`OWNDATA`, the
//!   handler in `mem_handler`), so NumPy frees them into the pool with no object in between, and
//!   `get_handler_name` names the pool for them.
//! - The handler keeps the last freed block of each class up to 1 KiB for the next allocation
//!   of that class (Note [The small-array stash]).
//! - Zero-filled memory comes from `HostPool::alloc_zeroed` (large blocks: pages dropped where
//!   unused, written where in use).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use npumem_core::AclError;
use npumem_core::hostpool::{HostPool, HugePages, class_of};
use numpy::npyffi::{
    NPY_ARRAY_CARRAY, NPY_ARRAY_FARRAY, NPY_ARRAY_OWNDATA, NpyTypes, PY_ARRAY_API, PyArray_Descr, PyArrayObject_fields,
    get_type_object,
};
use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyType};

use crate::args::{DType, Shape, Size, Uint, name};
use crate::errors::{catch_panics, guard, to_py};
use crate::export::{Exported, buffer_exporter};
use crate::fastcall::{self, FastMethod, entry, exact_u64};

/// The most alloc+free pairs one `churn` call runs.
const MAX_CHURN: u64 = 1 << 32;

#[pyclass(name = "HostPool", module = "npumem._native", frozen, subclass)]
pub struct PyHostPool {
    pool: HostPool,
    /// The NEP 49 handler capsule, made on first use.
    handler: PyOnceLock<Py<PyAny>>,
}

/// Memory of one pool block; freed into the pool when dropped.
#[pyclass(name = "HostBlock", module = "npumem._native", frozen)]
pub struct HostBlock {
    pool: HostPool,
    ptr: usize,
    len: usize,
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `pool.alloc` and this block is its only owner; every view of
        // it holds a reference to this object, so none outlives it. (`try_free`: a drop must
        // not panic.)
        unsafe { self.pool.try_free(self.ptr as *mut u8) };
    }
}

// SAFETY: the block is `len` writable bytes of the pool, freed only when this object drops.
unsafe impl Exported for HostBlock {
    fn memory(&self) -> (*mut c_void, usize) {
        (self.ptr as *mut c_void, self.len)
    }
}

buffer_exporter!(HostBlock);

#[pymethods]
impl HostBlock {
    /// The block's address (for ctypes and native code).
    #[getter]
    fn address(&self) -> usize {
        self.ptr
    }

    /// Bytes the block really has (its size class).
    #[getter]
    fn capacity(&self) -> u64 {
        self.pool.block_size(self.ptr as *const u8).unwrap_or(self.len as u64)
    }
}

#[pymethods]
impl PyHostPool {
    #[new]
    #[pyo3(signature = (capacity = None, *, huge_pages = "transparent"))]
    fn new(py: Python<'_>, capacity: Option<Size<name::capacity>>, huge_pages: &str) -> PyResult<Self> {
        let capacity = capacity.map_or(64 << 30, |c| c.0);
        let pool = guard(py, || HostPool::new(capacity, HugePages::parse(huge_pages)?))?;
        Ok(PyHostPool { pool, handler: PyOnceLock::new() })
    }

    /// A block of `nbytes` (zero-filled when `zero`); the GIL is released while it is cleared.
    #[pyo3(signature = (nbytes, zero = false))]
    fn block(&self, py: Python<'_>, nbytes: Size<name::nbytes>, zero: bool) -> PyResult<HostBlock> {
        self.new_block(py, nbytes.0, zero)
    }

    /// A writable memoryview of `nbytes` (zero-filled when `zero`); the block returns to the
    /// pool when the last view of it is gone.
    #[pyo3(signature = (nbytes, zero = false))]
    fn buffer<'py>(&self, py: Python<'py>, nbytes: Size<name::nbytes>, zero: bool) -> PyResult<Bound<'py, PyAny>> {
        let block = Bound::new(py, self.new_block(py, nbytes.0, zero)?)?;
        // SAFETY: a new memoryview over an object that exports the buffer protocol; returns a
        // new reference or NULL with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyMemoryView_FromObject(block.as_ptr())) }
    }

    /// Like `np.empty`: contents are whatever the block last held.
    #[pyo3(signature = (shape, dtype = None, order = "C"))]
    fn empty<'py>(
        &self,
        py: Python<'py>,
        shape: Shape,
        dtype: Option<DType<'py>>,
        order: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.array(py, shape, dtype, order, false)
    }

    /// Like `np.zeros` (cleared with the GIL released for blocks of 1 MiB and more).
    #[pyo3(signature = (shape, dtype = None, order = "C"))]
    fn zeros<'py>(
        &self,
        py: Python<'py>,
        shape: Shape,
        dtype: Option<DType<'py>>,
        order: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.array(py, shape, dtype, order, true)
    }

    /// A numpy array of `shape` (an int or a sequence) and `dtype` (anything `np.dtype` takes;
    /// None is float64, as for NumPy) in `order` "C" or "F", viewing a pool block (zero-filled
    /// when `zero`); the block returns to the pool when the array and its views are gone.
    #[pyo3(signature = (shape, dtype, order = "C", zero = false))]
    fn array<'py>(
        &self,
        py: Python<'py>,
        shape: Shape,
        dtype: Option<DType<'py>>,
        order: &str,
        zero: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fortran = match order {
            "C" => false,
            "F" => true,
            _ => return Err(to_py(py, AclError::invalid_param(format!("order {order:?} must be 'C' or 'F'")))),
        };
        let Shape(mut shape) = shape;
        let dtype = dtype.map_or_else(|| numpy::dtype::<f64>(py), |d| d.0);
        self.make_array(py, &mut shape, dtype, fortran, zero)
    }

    /// Allocates and frees one block of `nbytes` `n` times (the pool's own cost, for benchmarks);
    /// `n` is at most 2**32 (about a minute: the loop runs without the GIL and cannot be
    /// interrupted).
    fn churn(&self, py: Python<'_>, nbytes: Size<name::nbytes>, n: Uint<name::n>) -> PyResult<()> {
        let (nbytes, n) = (nbytes.0, n.0);
        if n > MAX_CHURN {
            return Err(to_py(py, AclError::invalid_param(format!("n must be an int from 0 to 2**32, got {n}"))));
        }
        py.detach(|| {
            for _ in 0..n {
                let p = self.pool.alloc(nbytes)?;
                // SAFETY: just allocated, freed once.
                unsafe { self.pool.free(std::hint::black_box(p)) };
            }
            Ok(())
        })
        .map_err(|e: AclError| to_py(py, e))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.stats();
        let d = PyDict::new(py);
        d.set_item("capacity", s.capacity)?;
        d.set_item("base", self.pool.address_range().0)?;
        d.set_item("carved", s.carved)?;
        d.set_item("shared_free_blocks", s.shared_free_blocks)?;
        d.set_item("carves", s.carves)?;
        d.set_item("trimmed", s.trimmed)?;
        d.set_item("huge_pages", self.pool.huge_pages().name())?;
        Ok(d)
    }

    /// Gives the pages of free blocks of at least `min_block` bytes back to the system.
    #[pyo3(signature = (min_block = None))]
    fn trim(&self, py: Python<'_>, min_block: Option<Size<name::min_block>>) -> PyResult<u64> {
        let min_block = min_block.map_or(1 << 20, |m| m.0);
        Ok(py.detach(|| self.pool.trim(min_block)))
    }

    /// Moves this thread's cached free blocks to the shared lists.
    fn flush_thread_cache(&self) {
        self.pool.flush_thread_cache();
    }

    #[getter]
    fn huge_pages(&self) -> &'static str {
        self.pool.huge_pages().name()
    }

    /// Installs this pool as NumPy's data allocator (NEP 49) in the current context; returns
    /// the previous handler, to give to `restore_numpy_handler`.
    fn set_numpy_handler(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        set_handler(py, self.handler(py)?.bind(py))
    }

    /// Reinstalls a handler returned by `set_numpy_handler`.
    #[staticmethod]
    fn restore_numpy_handler(py: Python<'_>, previous: Bound<'_, PyAny>) -> PyResult<()> {
        set_handler(py, &previous).map(drop)
    }
}

impl PyHostPool {
    /// The array of `array` with its arguments converted (`shape` is `npy_intp`s: `isize`).
    fn make_array<'py>(
        &self,
        py: Python<'py>,
        shape: &mut [isize],
        dtype: Bound<'py, PyArrayDescr>,
        fortran: bool,
        zero: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if dtype.has_object() {
            return Err(to_py(
                py,
                AclError::invalid_param("dtypes that hold Python objects cannot live in pool memory"),
            ));
        }
        let mut count: u64 = 1;
        for &d in shape.iter() {
            count = u64::try_from(d).ok().and_then(|d| count.checked_mul(d)).ok_or_else(|| {
                to_py(
                    py,
                    AclError::invalid_param(format!("shape {:?} must be non-negative and fit in memory", &*shape)),
                )
            })?;
        }
        let nbytes = count.checked_mul(dtype.itemsize() as u64).ok_or_else(|| {
            to_py(
                py,
                AclError::invalid_param(format!("shape {:?} of {}-byte items overflows", &*shape, dtype.itemsize())),
            )
        })?;
        let handler = self.handler(py)?;
        let data = if class_of(nbytes.max(1)) < STASH_CLASSES {
            // Small: as NumPy's own allocations under the handler, the class's stashed block first.
            let ptr = stash_of(handler.bind(py))?.alloc(nbytes as usize);
            if ptr.is_null() {
                return Err(to_py(py, AclError::oom(format!("host pool: no block of {nbytes} bytes left"))));
            }
            if zero {
                // SAFETY: a block of at least `nbytes` bytes handed to nobody yet.
                unsafe { std::ptr::write_bytes(ptr, 0, nbytes as usize) };
            }
            ptr
        } else {
            self.alloc(py, nbytes, zero)?
        }
        .cast::<c_void>();
        let flags = if fortran { NPY_ARRAY_FARRAY } else { NPY_ARRAY_CARRAY };
        // SAFETY: NewFromDescr steals the new dtype reference and views `data`, a block of at
        // least count * itemsize bytes, 64-byte aligned, handed to nobody else. The array then
        // owns it as NumPy's own arrays own their data: OWNDATA set and the handler (a new
        // reference) in `mem_handler`, so that NumPy's dealloc frees it through `h_free`.
        unsafe {
            let arr = PY_ARRAY_API.PyArray_NewFromDescr(
                py,
                get_type_object(py, NpyTypes::PyArray_Type),
                dtype.into_ptr().cast::<PyArray_Descr>(),
                shape.len() as c_int,
                shape.as_mut_ptr(),
                std::ptr::null_mut(),
                data,
                flags,
                std::ptr::null_mut(),
            );
            if arr.is_null() {
                self.pool.try_free(data.cast());
                return Err(PyErr::fetch(py));
            }
            let fields = arr.cast::<ArrayFields>();
            (*fields).mem_handler = handler.clone_ref(py).into_ptr();
            (*fields).fields.flags |= NPY_ARRAY_OWNDATA;
            Ok(Bound::from_owned_ptr(py, arr))
        }
    }

    /// The pool's NEP 49 handler capsule.
    fn handler(&self, py: Python<'_>) -> PyResult<&Py<PyAny>> {
        self.handler.get_or_try_init(py, || handler_capsule(py, self.pool.clone()))
    }

    /// `len` bytes of the pool (zero-filled when `zero`); the GIL is released while a block of
    /// 1 MiB or more is cleared.
    fn alloc(&self, py: Python<'_>, len: u64, zero: bool) -> PyResult<*mut u8> {
        let take = || if zero { self.pool.alloc_zeroed(len) } else { self.pool.alloc(len) }.map(|p| p as usize);
        let ptr = if zero && len >= 1 << 20 { py.detach(|| catch_panics(take)) } else { catch_panics(take) };
        ptr.map(|p| p as *mut u8).map_err(|e| to_py(py, e))
    }

    /// A block of `len` bytes (zero-filled when `zero`).
    fn new_block(&self, py: Python<'_>, len: u64, zero: bool) -> PyResult<HostBlock> {
        let ptr = self.alloc(py, len, zero)?;
        Ok(HostBlock { pool: self.pool.clone(), ptr: ptr as usize, len: len as usize })
    }
}

/// NumPy's `PyArrayObject_fields` through `mem_handler` (numpy/ndarraytypes.h, NumPy >= 1.22;
/// the numpy crate declares the fields up to `weakreflist`).
#[repr(C)]
struct ArrayFields {
    ob_base: ffi::PyObject,
    fields: PyArrayObject_fields,
    buffer_info: *mut c_void,
    mem_handler: *mut ffi::PyObject,
}

// --- `empty` / `zeros` as C-API methods (`fastcall`) ---------------------------------------

/// `empty(n)` / `empty(n, dtype)` with `n` an exact int and `dtype` a dtype, a type or None:
/// served here; any other call (and a dtype NumPy refuses) goes to PyO3's method.
fn serve_array<'py>(
    py: Python<'py>,
    slf: &Bound<'py, PyAny>,
    args: &[*mut ffi::PyObject],
    zero: bool,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let (n, dtype) = match args {
        [n] => (*n, None),
        [n, dtype] => (*n, Some(*dtype)),
        _ => return None,
    };
    let n = isize::try_from(exact_u64(n)?).ok()?;
    // SAFETY: None is a static object; reading its address is all this does.
    let none = unsafe { ffi::Py_None() };
    let dtype = match dtype {
        Some(d) if d != none => {
            // SAFETY: a live argument of the call, borrowed for it.
            let d = unsafe { Bound::from_borrowed_ptr(py, d) };
            match d.cast_into::<PyArrayDescr>() {
                Ok(descr) => descr,
                Err(e) => PyArrayDescr::new(py, e.into_inner()).ok()?,
            }
        }
        _ => numpy::dtype::<f64>(py),
    };
    // SAFETY: `slf` is a `HostPool` (see `fastcall::Serve`).
    let pool = unsafe { slf.cast_unchecked::<PyHostPool>() }.get();
    Some(pool.make_array(py, &mut [n], dtype, false, zero))
}

static EMPTY: FastMethod = FastMethod::new(c"empty", |py, slf, args| serve_array(py, slf, args, false));
static ZEROS: FastMethod = FastMethod::new(c"zeros", |py, slf, args| serve_array(py, slf, args, true));
entry!(empty_entry, EMPTY);
entry!(zeros_entry, ZEROS);

/// Installs `empty` and `zeros` over PyO3's methods of `HostPool`.
pub fn install_fast(ty: &Bound<'_, PyType>) -> PyResult<()> {
    fastcall::install(ty, &EMPTY, empty_entry)?;
    fastcall::install(ty, &ZEROS, zeros_entry)
}

// --- NEP 49 -----------------------------------------------------------------------------------

/// NumPy's `PyDataMemAllocator` (numpy/ndarraytypes.h, NumPy >= 1.22).
#[repr(C)]
struct PyDataMemAllocator {
    ctx: *mut c_void,
    malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize),
}

/// NumPy's `PyDataMem_Handler`.
#[repr(C)]
struct PyDataMemHandler {
    name: [u8; 127],
    version: u8,
    allocator: PyDataMemAllocator,
}

// SAFETY: `ctx` points at a `HandlerCtx` (a `HostPool` and atomic slots: Send + Sync) owned by
// the capsule; the functions are thread-safe.
unsafe impl Send for PyDataMemHandler {}

/// The handler's name, as `np.core.multiarray.get_handler_name()` reports it.
pub const HANDLER_NAME: &str = "npumem_host_pool";

/// What the handler's `ctx` points at: the pool, and one block of each small class kept back
/// from the last free.
///
/// Note [The small-array stash]
/// NumPy's default handler serves arrays under 1 KiB from its own cache of a few blocks per
/// size, a handful of instructions; the pool's thread cache costs two thread-local look-ups and
/// the class arithmetic on each side. A program that makes and drops small arrays in a loop
/// frees a block and asks for one of the same class next: each small class keeps the last block
/// freed in an atomic slot (taken and given by one swap, so any thread may use it), and the
/// next allocation of that class takes it back without the pool. The class of a freed block is
/// the pool's (its chunk table), never the size NumPy passes. Blocks still in the slots go back
/// to the pool when the capsule is released.
struct HandlerCtx {
    pool: HostPool,
    stash: [AtomicPtr<u8>; STASH_CLASSES],
}

/// Classes up to 1 KiB (`class_of(1024)` is 11) are stashed.
const STASH_CLASSES: usize = 12;

impl HandlerCtx {
    fn new(pool: HostPool) -> Self {
        HandlerCtx { pool, stash: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())) }
    }

    /// A block of at least `size` bytes: the stashed one of its class, else the pool's.
    fn alloc(&self, size: usize) -> *mut u8 {
        let size = size.max(1) as u64;
        let class = class_of(size);
        if class < STASH_CLASSES {
            let ptr = self.stash[class].swap(std::ptr::null_mut(), Ordering::Acquire);
            if !ptr.is_null() {
                return ptr;
            }
        }
        self.pool.alloc(size).unwrap_or(std::ptr::null_mut())
    }

    /// Gives a block back: into its class's slot (the block there before goes to the pool).
    ///
    /// # Safety
    /// `ptr` came from this handler (or is foreign: ignored) and is not used afterwards.
    unsafe fn free(&self, ptr: *mut u8) {
        match self.pool.block_class(ptr) {
            Some(class) if class < STASH_CLASSES => {
                let old = self.stash[class].swap(ptr, Ordering::AcqRel);
                if !old.is_null() {
                    // SAFETY: a block of this pool that the slot owned.
                    unsafe { self.pool.try_free(old) };
                }
            }
            // SAFETY: the caller's contract.
            _ => unsafe {
                self.pool.try_free(ptr);
            },
        }
    }
}

impl Drop for HandlerCtx {
    fn drop(&mut self) {
        for slot in &self.stash {
            let ptr = slot.swap(std::ptr::null_mut(), Ordering::Acquire);
            if !ptr.is_null() {
                // SAFETY: a block of this pool that the slot owned; no array uses it.
                unsafe { self.pool.try_free(ptr) };
            }
        }
    }
}

/// The `HandlerCtx` of one of this module's handler capsules.
fn stash_of<'a>(capsule: &'a Bound<'_, PyAny>) -> PyResult<&'a HandlerCtx> {
    let capsule = capsule.cast::<PyCapsule>()?;
    let handler = capsule.pointer_checked(Some(c"mem_handler"))?.as_ptr().cast::<PyDataMemHandler>();
    // SAFETY: the capsules named "mem_handler" that a `PyHostPool` keeps are `handler_capsule`'s,
    // whose value is a `PyDataMemHandler` with a `HandlerCtx` as `ctx`, alive with the capsule.
    Ok(ctx_of(unsafe { (*handler).allocator.ctx }))
}

fn ctx_of<'a>(ctx: *mut c_void) -> &'a HandlerCtx {
    // SAFETY: `ctx` is the `Box<HandlerCtx>` made in `handler_capsule`, alive while the capsule
    // is (every array allocated through the handler holds a reference to the capsule).
    unsafe { &*(ctx as *const HandlerCtx) }
}

/// Runs a hook body; a panic (which must not unwind into C) becomes `fallback`.
fn no_unwind<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(fallback)
}

unsafe extern "C" fn h_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    no_unwind(std::ptr::null_mut(), || ctx_of(ctx).alloc(size).cast())
}

unsafe extern "C" fn h_calloc(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    no_unwind(std::ptr::null_mut(), || {
        let Some(size) = nelem.checked_mul(elsize) else { return std::ptr::null_mut() };
        let h = ctx_of(ctx);
        if class_of(size.max(1) as u64) < STASH_CLASSES {
            let ptr = h.alloc(size);
            if !ptr.is_null() {
                // SAFETY: a block of at least `size` bytes handed to nobody yet.
                unsafe { std::ptr::write_bytes(ptr, 0, size) };
            }
            return ptr.cast();
        }
        h.pool.alloc_zeroed(size as u64).map_or(std::ptr::null_mut(), |p| p.cast())
    })
}

unsafe extern "C" fn h_realloc(ctx: *mut c_void, ptr: *mut c_void, new_size: usize) -> *mut c_void {
    no_unwind(std::ptr::null_mut(), || {
        let h = ctx_of(ctx);
        if ptr.is_null() {
            return h.alloc(new_size).cast();
        }
        let Some(old) = h.pool.block_size(ptr.cast()) else { return std::ptr::null_mut() };
        if new_size as u64 <= old && new_size as u64 * 2 > old {
            return ptr; // fits and not wastefully large
        }
        let p = h.alloc(new_size);
        if !p.is_null() {
            // SAFETY: both blocks are ours; copy what both hold, then free the old one.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), p, (old as usize).min(new_size));
                h.free(ptr.cast());
            }
        }
        p.cast()
    })
}

unsafe extern "C" fn h_free(ctx: *mut c_void, ptr: *mut c_void, _size: usize) {
    if !ptr.is_null() {
        // SAFETY: NumPy frees what this handler allocated, once; a foreign pointer is ignored.
        no_unwind((), || unsafe { ctx_of(ctx).free(ptr.cast()) });
    }
}

/// `NPY_1_22_API_VERSION`: the C ABI with `mem_handler` in arrays and the handler API.
const NUMPY_1_22: u32 = 0x0f;

fn handler_capsule(py: Python<'_>, pool: HostPool) -> PyResult<Py<PyAny>> {
    // SAFETY: a plain query of the loaded NumPy's C ABI level.
    let level = unsafe { PY_ARRAY_API.PyArray_GetNDArrayCFeatureVersion(py) };
    if level < NUMPY_1_22 {
        return Err(to_py(
            py,
            AclError::invalid_param(format!("the host pool needs NumPy >= 1.22 (C API level {level})")),
        ));
    }
    let mut name = [0u8; 127];
    name[..HANDLER_NAME.len()].copy_from_slice(HANDLER_NAME.as_bytes());
    let handler = PyDataMemHandler {
        name,
        version: 1,
        allocator: PyDataMemAllocator {
            ctx: Box::into_raw(Box::new(HandlerCtx::new(pool))).cast(),
            malloc: h_malloc,
            calloc: h_calloc,
            realloc: h_realloc,
            free: h_free,
        },
    };
    let capsule = PyCapsule::new_with_value_and_destructor(py, handler, c"mem_handler", |h, _| {
        // SAFETY: the box made above, released once, when the last array using it is gone.
        drop(unsafe { Box::from_raw(h.allocator.ctx as *mut HandlerCtx) });
    })?;
    Ok(capsule.into_any().unbind())
}

/// Calls NumPy's `PyDataMem_SetHandler` (C API slot 304); returns the previous handler.
fn set_handler(py: Python<'_>, handler: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let module = py.import("numpy._core.multiarray").or_else(|_| py.import("numpy.core.multiarray"))?;
    let api = module.getattr("_ARRAY_API")?.cast_into::<PyCapsule>()?;
    let table = api.pointer_checked(None)?.as_ptr() as *const *const c_void;
    // SAFETY: slot 304 of the NumPy C API table (NumPy >= 1.22, required by the package) is
    // `PyObject *PyDataMem_SetHandler(PyObject *handler)`.
    let set: unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject =
        unsafe { std::mem::transmute(*table.add(304)) };
    // SAFETY: `handler` is a live "mem_handler" capsule (or NULL-safe None as NumPy accepts);
    // the result is a new reference or NULL with an exception set.
    let previous = unsafe { set(handler.as_ptr()) };
    if previous.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference returned by NumPy.
    Ok(unsafe { Bound::from_owned_ptr(py, previous) }.unbind())
}
