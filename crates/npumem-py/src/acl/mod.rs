//! `npumem._native.AclTables`: npumem.acl's records of the program's memory (live allocations,
//! `malloc_host` blocks, the call sites of memory just freed), and its hot calls (`acl.rt.malloc`,
//! `free`, `malloc_host`, `free_host`, `memcpy`, `memset`) served without the interpreter.
//!
//! - One set of records serves the native calls and the Python runtime (`RT.allocs`,
//!   `RT.host_blocks`, `RT.freed_sites` are views of them).
//! - A native call serves only a plain call: positional exact ints in range; a live current
//!   context where the call needs one; memory of one created device or inside its
//!   `malloc_host` blocks, in bounds; for a free, no IPC key open. Every other call goes, as it
//!   came, to the checked Python call (`set_checked_calls`), which words each error: codes,
//!   messages and bytes are the same on both paths (tests/test_pyacl_fast.py holds them so).
//! - Both paths hold `LOCK` (the `ReentrantLock` the tables are made with) for their whole run.
//! - A thread's current context is mirrored here (`set_current`) and trusted only under the
//!   epoch it was set in: `context_dropped` and `reset` move the epoch, so a context destroyed
//!   by any thread sends the next call of every thread to the checked path, which sets it anew.
//! - The records are reached only with `LOCK` held (a `Held` proves it), borrowed for a step at
//!   a time: never across a call into Python or into a device.

mod lock;
mod records;

use std::cell::{Cell, RefCell, RefMut};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use npumem_core::{AclError, Policy};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};
use rustc_hash::FxHashMap;

use self::lock::Held;
pub use self::lock::ReentrantLock;
pub use self::records::{AclAlloc, AclHostBlock, FREED_SITES};
use self::records::{AllocRec, Api, FreedSites, HostRec, Site};
use crate::device::{DETACH_BYTES, PyDevice};
use crate::fastcall::{self, FastMethod, entry, exact_i32, exact_u64};

/// Epochs of every table: distinct across instances, so a thread's mirror of one never
/// validates against another.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

fn next_epoch() -> u64 {
    NEXT_EPOCH.fetch_add(1, Ordering::Relaxed)
}

/// This thread's current context as the runtime last set it.
#[derive(Clone, Copy)]
struct Current {
    epoch: u64,
    /// 0: none.
    handle: u64,
    device: u32,
}

thread_local! {
    static CURRENT: Cell<Current> = const { Cell::new(Current { epoch: 0, handle: 0, device: 0 }) };
}

/// The six checked calls, in `CHECKED` order.
const CHECKED: [&str; 6] = ["malloc", "free", "memcpy", "memset", "malloc_host", "free_host"];

struct State {
    allocs: FxHashMap<u64, AllocRec>,
    hosts: BTreeMap<u64, HostRec>,
    freed: FreedSites,
    /// `RT.system.devices` (None until the system is made), and each device's slice of the
    /// simulated device window (0: the devices are asked where an address lives).
    devices: Option<Py<PyList>>,
    slice: u64,
    /// `RT.ipc`: a free takes the checked path while a key is open.
    ipc: Option<Py<PyDict>>,
    /// `RT.fail(code, message)`: records an error for `acl.get_recent_err_msg`.
    fail: Option<Py<PyAny>>,
    checked: [Option<Py<PyAny>>; 6],
    /// Whether each device's sanitizer is on, as its last allocation said (None: not asked).
    sanitizes: Vec<Option<bool>>,
}

/// The state, reached only while the tables' `ReentrantLock` is held.
struct Guarded(RefCell<State>);

// SAFETY: the cell is only borrowed through `AclTables::state`, which takes a `Held` of the
// tables' lock: one thread at a time reaches it (the lock is reentrant, and `RefCell` refuses a
// second borrow on that thread); `State` itself is `Send`.
unsafe impl Sync for Guarded {}

#[pyclass(module = "npumem._native", frozen)]
pub struct AclTables {
    lock: Py<ReentrantLock>,
    state: Guarded,
    epoch: AtomicU64,
    kind_mismatches: AtomicU64,
}

/// A copy's direction as its kind names it: (source on a device, destination on a device).
fn named_direction(kind: u64) -> Option<(bool, bool)> {
    match kind {
        0 => Some((false, false)),
        1 | 5 => Some((false, true)),
        2 => Some((true, false)),
        3 => Some((true, true)),
        _ => None,
    }
}

impl AclTables {
    /// The records, borrowed while `held` (this table's lock) is.
    fn state<'a>(&'a self, held: &'a Held<'_>) -> RefMut<'a, State> {
        debug_assert!(held.of(self.lock.get()));
        self.state.0.borrow_mut()
    }

    /// This thread's current context (its device), if the runtime set it in this epoch.
    fn current_device(&self) -> Option<u32> {
        let c = CURRENT.with(Cell::get);
        (c.handle != 0 && c.epoch == self.epoch.load(Ordering::Relaxed)).then_some(c.device)
    }

    /// Created device `index` of the bound system.
    fn device<'py>(&self, py: Python<'py>, held: &Held<'_>, index: u32) -> Option<Bound<'py, PyDevice>> {
        let list = self.state(held).devices.as_ref()?.clone_ref(py);
        let item = list.bind(py).get_item(index as usize).ok()?;
        item.cast_into::<PyDevice>().ok()
    }

    /// (device, on the device rather than in its malloc_host block) of `count` bytes at `addr`,
    /// or None where the checked path decides.
    fn place(&self, py: Python<'_>, st: &State, addr: u64, count: u64) -> Option<(u32, bool)> {
        let devices = st.devices.as_ref()?.bind(py);
        let end = addr.checked_add(count)?;
        if let Some(d) = addr.checked_sub(npumem_core::vm::VA_WINDOW_START).and_then(|off| off.checked_div(st.slice)) {
            if d < devices.len() as u64 {
                return (!devices.get_item(d as usize).ok()?.is_none()).then_some((d as u32, true));
            }
        } else if st.slice == 0 {
            for (i, item) in devices.iter().enumerate() {
                if let Ok(dev) = item.cast::<PyDevice>()
                    && dev.get().lock_inner().holds(addr)
                {
                    return Some((i as u32, true));
                }
            }
        }
        let (start, block) = st.hosts.range(..=addr).next_back()?;
        (end <= start + block.size).then_some((block.owner, false))
    }

    /// Records `e` as the thread's recent error (`RT.fail`) and gives its code.
    fn fail(&self, py: Python<'_>, e: AclError) -> PyResult<u32> {
        let held = self.lock.get().hold(py);
        let fail = self.state(&held).fail.as_ref().map(|f| f.clone_ref(py));
        let fail = fail.ok_or_else(|| PyRuntimeError::new_err("npumem.acl's tables are not bound"))?;
        fail.call1(py, (e.code.value(), e.message))?;
        Ok(e.code.value())
    }

    fn checked(&self, py: Python<'_>, which: usize) -> PyResult<Py<PyAny>> {
        let held = self.lock.get().hold(py);
        self.state(&held).checked[which]
            .as_ref()
            .map(|f| f.clone_ref(py))
            .ok_or_else(|| PyRuntimeError::new_err(format!("acl.rt.{}: npumem.acl is not loaded", CHECKED[which])))
    }

    fn forward(
        &self,
        py: Python<'_>,
        which: usize,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.checked(py, which)?.call(py, args, kwargs)
    }
}

/// `(value, 0)`, or `(0, code)` of a failure: pyACL's shape of a call that makes a value.
fn value_and_ret<'py>(py: Python<'py>, t: &AclTables, r: Result<u64, AclError>) -> PyResult<Bound<'py, PyAny>> {
    let (value, ret) = match r {
        Ok(v) => (v, 0),
        Err(e) => (0, t.fail(py, e)?),
    };
    Ok((value, ret).into_pyobject(py)?.into_any())
}

fn ret<'py>(py: Python<'py>, t: &AclTables, r: Result<(), AclError>) -> PyResult<Bound<'py, PyAny>> {
    let code = match r {
        Ok(()) => 0,
        Err(e) => t.fail(py, e)?,
    };
    Ok(code.into_pyobject(py)?.into_any())
}

/// The tables of a fast method's `self` (the method descriptor checked its type).
fn tables<'a, 'py>(slf: &'a Bound<'py, PyAny>) -> &'a AclTables {
    // SAFETY: `slf` is an `AclTables` (see `fastcall::Serve`).
    unsafe { slf.cast_unchecked::<AclTables>() }.get()
}

static MALLOC: FastMethod = FastMethod::new(c"malloc", |py, slf, args| {
    let [size, policy] = args else { return None };
    let size = exact_u64(*size).filter(|&s| s > 0)?;
    let policy = Policy::from_raw(u32::try_from(exact_u64(*policy).filter(|&p| p <= 7)?).ok()?).ok()?;
    let t = tables(slf);
    let held = t.lock.get().hold(py);
    let device = t.current_device()?;
    let dev = t.device(py, &held, device)?;
    let dev = dev.get();
    let site = Site::caller(py);
    // Only the sanitizer's findings read a tag: its text is made where the device has one on.
    let mut tag = None;
    if t.state(&held).sanitizes.get(device as usize) == Some(&Some(true)) {
        let mut text = String::with_capacity(96);
        if let Err(e) = site.write_text(py, &mut text) {
            return Some(Err(e));
        }
        tag = Some(text);
    }
    let made = dev.call(py, false, |d| {
        let ptr = d.malloc_on(size, policy, true, 0)?;
        let on = d.sanitizing();
        if let (true, Some(tag)) = (on, &tag) {
            d.set_tag(ptr, tag)?;
        }
        Ok((ptr, on))
    });
    let made = match made {
        Ok((ptr, true)) if tag.is_none() => {
            let mut text = String::with_capacity(96);
            if let Err(e) = site.write_text(py, &mut text) {
                return Some(Err(e));
            }
            dev.call(py, false, |d| d.set_tag(ptr, &text)).map(|()| (ptr, true))
        }
        made => made,
    };
    let made = made.map(|(ptr, on)| {
        let mut st = t.state(&held);
        if let Some(known) = st.sanitizes.get_mut(device as usize) {
            *known = Some(on);
        }
        st.allocs.insert(ptr, AllocRec { device, size, site, api: Api::Malloc, base: 0 });
        ptr
    });
    Some(value_and_ret(py, t, made))
});

static FREE: FastMethod = FastMethod::new(c"free", |py, slf, args| {
    let [ptr] = args else { return None };
    let ptr = exact_u64(*ptr).filter(|&p| p != 0)?;
    let t = tables(slf);
    let held = t.lock.get().hold(py);
    let device = {
        let st = t.state(&held);
        if st.ipc.as_ref().is_some_and(|ipc| !ipc.bind(py).is_empty()) {
            return None;
        }
        let rec = st.allocs.get(&ptr).filter(|a| a.api != Api::Dvpp)?;
        rec.device
    };
    let dev = t.device(py, &held, device)?;
    let freed = dev.get().call(py, false, |d| d.free_on(ptr, None));
    if freed.is_ok() {
        let mut st = t.state(&held);
        if let Some(rec) = st.allocs.remove(&ptr) {
            st.freed.insert(ptr, rec.site);
        }
    }
    Some(ret(py, t, freed))
});

static MALLOC_HOST: FastMethod = FastMethod::new(c"malloc_host", |py, slf, args| {
    let [size] = args else { return None };
    let size = exact_u64(*size).filter(|&s| s > 0)?;
    let t = tables(slf);
    let held = t.lock.get().hold(py);
    let owner = t.current_device()?;
    let dev = t.device(py, &held, owner)?;
    let made = dev.get().call(py, false, |d| d.malloc_host(size));
    if let Ok(ptr) = made {
        t.state(&held).hosts.insert(ptr, HostRec { owner, size, site: Site::caller(py) });
    }
    Some(value_and_ret(py, t, made))
});

static FREE_HOST: FastMethod = FastMethod::new(c"free_host", |py, slf, args| {
    let [ptr] = args else { return None };
    let ptr = exact_u64(*ptr).filter(|&p| p != 0)?;
    let t = tables(slf);
    let held = t.lock.get().hold(py);
    let owner = t.state(&held).hosts.get(&ptr)?.owner;
    let dev = t.device(py, &held, owner)?;
    let freed = dev.get().call(py, false, |d| d.free_host(ptr));
    if freed.is_ok() {
        let mut st = t.state(&held);
        if let Some(rec) = st.hosts.remove(&ptr) {
            st.freed.insert(ptr, rec.site);
        }
    }
    Some(ret(py, t, freed))
});

static MEMCPY: FastMethod = FastMethod::new(c"memcpy", |py, slf, args| {
    let [dst, dst_max, src, count, kind] = args else { return None };
    let (dst, dst_max, src) = (exact_u64(*dst)?, exact_u64(*dst_max)?, exact_u64(*src)?);
    let count = exact_u64(*count).filter(|&c| 0 < c && c <= dst_max)?;
    let kind = exact_u64(*kind).filter(|&k| k <= 5)?;
    if dst == src {
        return None;
    }
    let t = tables(slf);
    let held = t.lock.get().hold(py);
    let device = {
        let st = t.state(&held);
        let (d, dst_on_device) = t.place(py, &st, dst, count)?;
        let (s, src_on_device) = t.place(py, &st, src, count)?;
        if d != s {
            return None;
        }
        if named_direction(kind).is_some_and(|named| named != (src_on_device, dst_on_device)) {
            t.kind_mismatches.fetch_add(1, Ordering::Relaxed);
        }
        d
    };
    let dev = t.device(py, &held, device)?;
    let detach = count >= DETACH_BYTES as u64;
    Some(ret(py, t, dev.get().call(py, detach, |d| d.memcpy(dst, dst_max, src, count, kind as u32))))
});

static MEMSET: FastMethod = FastMethod::new(c"memset", |py, slf, args| {
    let [ptr, max_count, value, count] = args else { return None };
    let (ptr, max_count, value) = (exact_u64(*ptr)?, exact_u64(*max_count)?, exact_i32(*value)?);
    let count = exact_u64(*count).filter(|&c| 0 < c && c <= max_count)?;
    let t = tables(slf);
    let held = t.lock.get().hold(py);
    let device = t.place(py, &t.state(&held), ptr, count)?.0;
    let dev = t.device(py, &held, device)?;
    Some(ret(py, t, dev.get().call(py, false, |d| d.memset(ptr, max_count, value, count))))
});

entry!(malloc_entry, MALLOC);
entry!(free_entry, FREE);
entry!(malloc_host_entry, MALLOC_HOST);
entry!(free_host_entry, FREE_HOST);
entry!(memcpy_entry, MEMCPY);
entry!(memset_entry, MEMSET);

/// Installs the six fast methods over the forwarding ones of `AclTables`.
pub fn install(ty: &Bound<'_, PyType>) -> PyResult<()> {
    fastcall::install(ty, &MALLOC, malloc_entry)?;
    fastcall::install(ty, &FREE, free_entry)?;
    fastcall::install(ty, &MALLOC_HOST, malloc_host_entry)?;
    fastcall::install(ty, &FREE_HOST, free_host_entry)?;
    fastcall::install(ty, &MEMCPY, memcpy_entry)?;
    fastcall::install(ty, &MEMSET, memset_entry)
}

/// A pointer key as the Python mappings take it: None for anything no pointer can be.
fn key(obj: &Bound<'_, PyAny>) -> Option<u64> {
    obj.extract::<u64>().ok()
}

#[pymethods]
impl AclTables {
    #[new]
    fn new(lock: Py<ReentrantLock>) -> Self {
        AclTables {
            lock,
            state: Guarded(RefCell::new(State {
                allocs: FxHashMap::default(),
                hosts: BTreeMap::new(),
                freed: FreedSites::default(),
                devices: None,
                slice: 0,
                ipc: None,
                fail: None,
                checked: Default::default(),
                sanitizes: Vec::new(),
            })),
            epoch: AtomicU64::new(next_epoch()),
            kind_mismatches: AtomicU64::new(0),
        }
    }

    // ----- the hot calls (each served natively when plain; see the module's rules) -----

    /// ``aclrtMalloc`` on the current device: ``(dev_ptr, ret)``.
    #[pyo3(signature = (*args, **kwargs), text_signature = "(size, policy)")]
    fn malloc(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.forward(py, 0, args, kwargs)
    }

    /// ``aclrtFree``: immediate; memory that queued work still uses goes back once that work is
    /// done, and the sanitizer reports the hazard.
    #[pyo3(signature = (*args, **kwargs), text_signature = "(dev_ptr)")]
    fn free(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.forward(py, 1, args, kwargs)
    }

    /// ``aclrtMemcpy``: copies now; the direction comes from the addresses (the kind is
    /// checked, 0-5, then advisory).
    #[pyo3(signature = (*args, **kwargs), text_signature = "(dst, dest_max, src, count, kind)")]
    fn memcpy(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.forward(py, 2, args, kwargs)
    }

    /// ``aclrtMemset``: a byte fill of device or host memory (found from the address).
    #[pyo3(signature = (*args, **kwargs), text_signature = "(dev_ptr, max_count, value, count)")]
    fn memset(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.forward(py, 3, args, kwargs)
    }

    /// ``aclrtMallocHost``: real, 64-byte aligned process memory: ``(host_ptr, ret)``.
    #[pyo3(signature = (*args, **kwargs), text_signature = "(size)")]
    fn malloc_host(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.forward(py, 4, args, kwargs)
    }

    /// ``aclrtFreeHost``: gives a ``malloc_host`` block back.
    #[pyo3(signature = (*args, **kwargs), text_signature = "(host_ptr)")]
    fn free_host(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        self.forward(py, 5, args, kwargs)
    }

    // ----- binding to the runtime -----

    /// The checked calls the plain-call paths hand every other call to.
    #[allow(clippy::too_many_arguments)] // the six calls, by name
    fn set_checked_calls(
        &self,
        py: Python<'_>,
        malloc: Py<PyAny>,
        free: Py<PyAny>,
        memcpy: Py<PyAny>,
        memset: Py<PyAny>,
        malloc_host: Py<PyAny>,
        free_host: Py<PyAny>,
    ) {
        let held = self.lock.get().hold(py);
        self.state(&held).checked =
            [Some(malloc), Some(free), Some(memcpy), Some(memset), Some(malloc_host), Some(free_host)];
    }

    /// The system's device list (None: no system) and each device's slice of the simulated
    /// device window (0: another backend, whose devices say which addresses are theirs).
    #[pyo3(signature = (devices, slice))]
    fn bind_system(&self, py: Python<'_>, devices: Option<Py<PyList>>, slice: u64) {
        let held = self.lock.get().hold(py);
        let mut st = self.state(&held);
        st.sanitizes = vec![None; devices.as_ref().map_or(0, |d| d.bind(py).len())];
        st.devices = devices;
        st.slice = slice;
    }

    /// `RT.ipc` (open keys send frees to the checked path) and `RT.fail`.
    fn bind(&self, py: Python<'_>, ipc: Py<PyDict>, fail: Py<PyAny>) {
        let held = self.lock.get().hold(py);
        let mut st = self.state(&held);
        st.ipc = Some(ipc);
        st.fail = Some(fail);
    }

    /// This thread's current context (`handle` 0: none) on `device`.
    fn set_current(&self, handle: u64, device: u32) {
        let epoch = self.epoch.load(Ordering::Relaxed);
        CURRENT.with(|c| c.set(Current { epoch, handle, device }));
    }

    /// A context was destroyed: every thread's mirror is checked again.
    fn context_dropped(&self) {
        self.epoch.store(next_epoch(), Ordering::Relaxed);
    }

    /// Forgets every record and every thread's context (acl.finalize).
    fn reset(&self, py: Python<'_>) {
        {
            let held = self.lock.get().hold(py);
            let mut st = self.state(&held);
            st.allocs.clear();
            st.hosts.clear();
            st.freed.clear();
        }
        self.kind_mismatches.store(0, Ordering::Relaxed);
        self.context_dropped();
    }

    /// Copies whose kind named another direction than their addresses (the kind is advisory).
    #[getter]
    fn get_kind_mismatches(&self) -> u64 {
        self.kind_mismatches.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_kind_mismatches(&self, value: u64) {
        self.kind_mismatches.store(value, Ordering::Relaxed);
    }

    // ----- the records, for the Python runtime's mappings -----

    fn alloc(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>) -> Option<AclAlloc> {
        let held = self.lock.get().hold(py);
        let st = self.state(&held);
        st.allocs.get(&key(ptr)?).map(|a| AclAlloc::copy(py, a))
    }

    fn set_alloc(&self, py: Python<'_>, ptr: u64, alloc: Bound<'_, AclAlloc>) {
        let rec = AclAlloc::copy(py, &alloc.get().0).0;
        let held = self.lock.get().hold(py);
        self.state(&held).allocs.insert(ptr, rec);
    }

    /// Removes the record of `ptr`: whether there was one.
    fn del_alloc(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>) -> bool {
        let held = self.lock.get().hold(py);
        key(ptr).is_some_and(|p| self.state(&held).allocs.remove(&p).is_some())
    }

    fn alloc_keys(&self, py: Python<'_>) -> Vec<u64> {
        let held = self.lock.get().hold(py);
        self.state(&held).allocs.keys().copied().collect()
    }

    fn alloc_count(&self, py: Python<'_>) -> usize {
        let held = self.lock.get().hold(py);
        self.state(&held).allocs.len()
    }

    fn host_block(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>) -> Option<AclHostBlock> {
        let held = self.lock.get().hold(py);
        let st = self.state(&held);
        st.hosts.get(&key(ptr)?).map(|b| AclHostBlock::copy(py, b))
    }

    fn set_host_block(&self, py: Python<'_>, ptr: u64, block: Bound<'_, AclHostBlock>) {
        let rec = AclHostBlock::copy(py, &block.get().0).0;
        let held = self.lock.get().hold(py);
        self.state(&held).hosts.insert(ptr, rec);
    }

    fn del_host_block(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>) -> bool {
        let held = self.lock.get().hold(py);
        key(ptr).is_some_and(|p| self.state(&held).hosts.remove(&p).is_some())
    }

    /// The live blocks' addresses, in address order.
    fn host_block_keys(&self, py: Python<'_>) -> Vec<u64> {
        let held = self.lock.get().hold(py);
        self.state(&held).hosts.keys().copied().collect()
    }

    fn host_block_count(&self, py: Python<'_>) -> usize {
        let held = self.lock.get().hold(py);
        self.state(&held).hosts.len()
    }

    /// `(start, block)` of the live malloc_host block holding `addr`, or None.
    fn host_block_of(&self, py: Python<'_>, addr: u64) -> Option<(u64, AclHostBlock)> {
        let held = self.lock.get().hold(py);
        let st = self.state(&held);
        let (start, b) = st.hosts.range(..=addr).next_back()?;
        (addr - start < b.size).then(|| (*start, AclHostBlock::copy(py, b)))
    }

    /// Keeps the call site of memory just freed (the last `FREED_SITES` pointers').
    fn forget_site(&self, py: Python<'_>, ptr: u64, site: Bound<'_, PyString>) {
        let held = self.lock.get().hold(py);
        self.state(&held).freed.insert(ptr, Site::Text(site.unbind()));
    }

    fn freed_site<'py>(&self, py: Python<'py>, ptr: &Bound<'_, PyAny>) -> PyResult<Option<Bound<'py, PyString>>> {
        let site = {
            let held = self.lock.get().hold(py);
            let st = self.state(&held);
            match key(ptr).and_then(|p| st.freed.get(p)) {
                Some(site) => site.clone_ref(py),
                None => return Ok(None),
            }
        };
        site.text(py).map(Some)
    }

    /// The freed pointers whose sites are kept, oldest free first.
    fn freed_site_keys(&self, py: Python<'_>) -> Vec<u64> {
        let held = self.lock.get().hold(py);
        self.state(&held).freed.keys()
    }

    fn freed_site_count(&self, py: Python<'_>) -> usize {
        let held = self.lock.get().hold(py);
        self.state(&held).freed.len()
    }

    /// Raises ValueError if a record invariant does not hold (the tests call it).
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let held = self.lock.get().hold(py);
        let st = self.state(&held);
        st.freed.check_invariants().map_err(PyValueError::new_err)?;
        let mut end = 0;
        for (&start, b) in &st.hosts {
            if start < end || b.size == 0 {
                return Err(PyValueError::new_err(format!("malloc_host block {start:#x} overlaps the one before")));
            }
            end = start.saturating_add(b.size);
        }
        Ok(())
    }
}
