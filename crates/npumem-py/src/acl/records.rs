//! What npumem.acl keeps of each live allocation and `malloc_host` block, and of the call sites
//! of memory just freed.
//!
//! - A call site is the program's `file:line`; the native calls keep the caller's code object
//!   and instruction offset and make the text only when it is read (see Note [Call sites]).
//! - `FreedSites` holds the sites of the last `FREED_SITES` distinct pointers freed, the latest
//!   free of each; older ones are forgotten first.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Write;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;
use rustc_hash::FxHashMap;

/// How many freed pointers' call sites are kept.
pub const FREED_SITES: usize = 4096;

// Note [Call sites]
// The leak report and the sanitizer's findings name the line of the program that made each
// allocation. Formatting `file:line` on every call would be most of a native call's cost (the
// line number is decoded from the code object's location table), so a native call keeps the
// calling frame's code object (a reference: code objects live as long as their functions) and
// its instruction offset; `PyCode_Addr2Line` gives the same line `frame.f_lineno` gave, when
// the text is asked for.

/// The site this thread made the text of last: its code object, file name, offset and line.
struct LastSite {
    code: Py<PyAny>,
    file: String,
    lasti: i32,
    line: i32,
}

thread_local! {
    static LAST_SITE: RefCell<Option<LastSite>> = const { RefCell::new(None) };
}

/// Where the program made a call: `file:line` text, or a frame's code and offset.
pub enum Site {
    Text(Py<PyString>),
    Code { code: Py<PyAny>, lasti: i32 },
}

impl Site {
    /// The Python frame that called the native function running now.
    pub fn caller(py: Python<'_>) -> Site {
        // SAFETY: attached; the frame is borrowed for this call, and `PyFrame_GetCode` gives a
        // new reference that the `Py` takes over.
        unsafe {
            let frame = ffi::PyEval_GetFrame();
            if frame.is_null() {
                return Site::Text(PyString::new(py, "<unknown>").unbind());
            }
            let code = ffi::PyFrame_GetCode(frame);
            let lasti = ffi::PyFrame_GetLasti(frame);
            Site::Code { code: Bound::from_owned_ptr(py, code.cast()).unbind(), lasti }
        }
    }

    /// The `file:line` text (`file:None` where the offset has no line, as `f_lineno` says).
    pub fn text<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        match self {
            Site::Text(s) => Ok(s.bind(py).clone()),
            Site::Code { .. } => {
                let mut text = String::new();
                self.write_text(py, &mut text)?;
                Ok(PyString::new(py, &text))
            }
        }
    }

    /// Appends the `file:line` text to `out` (the tag a device keeps for its sanitizer: made on
    /// the hot path, so the last site's file name and line are kept per thread).
    pub fn write_text(&self, py: Python<'_>, out: &mut String) -> PyResult<()> {
        let (code, lasti) = match self {
            Site::Text(s) => {
                out.push_str(&s.bind(py).to_cow()?);
                return Ok(());
            }
            Site::Code { code, lasti } => (code, *lasti),
        };
        // A loop allocates from one line over and over: its line is kept with the file name.
        let known = LAST_SITE.with_borrow(|last| match last {
            Some(l) if l.code.is(code) => {
                out.push_str(&l.file);
                Some((l.lasti == lasti).then_some(l.line))
            }
            _ => None,
        });
        let line = match known {
            Some(Some(line)) => line,
            _ => {
                // SAFETY: `code` is a code object (from `PyFrame_GetCode`), held.
                let line = unsafe { ffi::PyCode_Addr2Line(code.as_ptr().cast(), lasti) };
                let file = match known {
                    Some(None) => None,
                    _ => {
                        let file = code.bind(py).getattr("co_filename")?.str()?.to_cow()?.into_owned();
                        out.push_str(&file);
                        Some(file)
                    }
                };
                // The code object last named is dropped outside the borrow (its dealloc may
                // run Python code that makes a site again).
                let old = LAST_SITE.with_borrow_mut(|last| match (file, last.as_mut()) {
                    (None, Some(l)) => {
                        (l.lasti, l.line) = (lasti, line);
                        None
                    }
                    (file, _) => {
                        last.replace(LastSite { code: code.clone_ref(py), file: file.unwrap_or_default(), lasti, line })
                    }
                });
                drop(old);
                line
            }
        };
        if line < 0 {
            out.push_str(":None");
        } else {
            write!(out, ":{line}").expect("writing to a String does not fail");
        }
        Ok(())
    }

    /// Whether the two name the same `file:line`.
    pub fn same(&self, py: Python<'_>, other: &Site) -> PyResult<bool> {
        let (a, b) = (self.text(py)?, other.text(py)?);
        Ok(a.to_cow()? == b.to_cow()?)
    }

    pub fn clone_ref(&self, py: Python<'_>) -> Site {
        match self {
            Site::Text(s) => Site::Text(s.clone_ref(py)),
            Site::Code { code, lasti } => Site::Code { code: code.clone_ref(py), lasti: *lasti },
        }
    }
}

/// The call that made a device allocation (each is freed with its own call).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Malloc,
    MallocAlign32,
    MallocCached,
    Dvpp,
}

impl Api {
    const ALL: [(Api, &'static str); 4] = [
        (Api::Malloc, "malloc"),
        (Api::MallocAlign32, "malloc_align32"),
        (Api::MallocCached, "malloc_cached"),
        (Api::Dvpp, "dvpp"),
    ];

    fn name(self) -> &'static str {
        Self::ALL.iter().find(|(a, _)| *a == self).map_or("malloc", |(_, n)| n)
    }

    fn from_name(name: &str) -> PyResult<Api> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(a, _)| *a).ok_or_else(|| {
            PyValueError::new_err(format!("api={name:?}: use one of malloc, malloc_align32, malloc_cached, dvpp"))
        })
    }
}

/// A live device allocation of the program.
pub struct AllocRec {
    pub device: u32,
    pub size: u64,
    pub site: Site,
    pub api: Api,
    /// For dvpp_malloc: the pointer malloc returned (the program sees a 128-byte aligned one).
    pub base: u64,
}

/// A live `malloc_host` block: the device whose host memory it is, its size and call site.
pub struct HostRec {
    pub owner: u32,
    pub size: u64,
    pub site: Site,
}

/// A device allocation of the program, as `RT.allocs` hands it out (a copy of the record).
#[pyclass(module = "npumem._native", name = "AclAlloc", frozen)]
pub struct AclAlloc(pub AllocRec);

#[pymethods]
impl AclAlloc {
    #[new]
    #[pyo3(signature = (device, size, site, api, base = 0))]
    fn new(device: u32, size: u64, site: Bound<'_, PyString>, api: &str, base: u64) -> PyResult<Self> {
        Ok(AclAlloc(AllocRec { device, size, site: Site::Text(site.unbind()), api: Api::from_name(api)?, base }))
    }

    #[getter]
    fn device(&self) -> u32 {
        self.0.device
    }

    #[getter]
    fn size(&self) -> u64 {
        self.0.size
    }

    #[getter]
    fn site<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        self.0.site.text(py)
    }

    #[getter]
    fn api(&self) -> &'static str {
        self.0.api.name()
    }

    #[getter]
    fn base(&self) -> u64 {
        self.0.base
    }

    fn __eq__(&self, py: Python<'_>, other: PyRef<'_, Self>) -> PyResult<bool> {
        let (a, b) = (&self.0, &other.0);
        Ok((a.device, a.size, a.api, a.base) == (b.device, b.size, b.api, b.base) && a.site.same(py, &b.site)?)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let a = &self.0;
        Ok(format!(
            "Alloc(device={}, size={}, site={}, api={:?}, base={})",
            a.device,
            a.size,
            a.site.text(py)?.repr()?,
            a.api.name(),
            a.base
        ))
    }
}

impl AclAlloc {
    pub fn copy(py: Python<'_>, a: &AllocRec) -> AclAlloc {
        AclAlloc(AllocRec { site: a.site.clone_ref(py), ..*a })
    }
}

/// A live `malloc_host` block of the program, as `RT.host_blocks` hands it out.
#[pyclass(module = "npumem._native", name = "AclHostBlock", frozen)]
pub struct AclHostBlock(pub HostRec);

#[pymethods]
impl AclHostBlock {
    #[new]
    fn new(owner: u32, size: u64, site: Bound<'_, PyString>) -> Self {
        AclHostBlock(HostRec { owner, size, site: Site::Text(site.unbind()) })
    }

    #[getter]
    fn owner(&self) -> u32 {
        self.0.owner
    }

    #[getter]
    fn size(&self) -> u64 {
        self.0.size
    }

    #[getter]
    fn site<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        self.0.site.text(py)
    }

    fn __eq__(&self, py: Python<'_>, other: PyRef<'_, Self>) -> PyResult<bool> {
        let (a, b) = (&self.0, &other.0);
        Ok((a.owner, a.size) == (b.owner, b.size) && a.site.same(py, &b.site)?)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let b = &self.0;
        Ok(format!("HostBlock(owner={}, size={}, site={})", b.owner, b.size, b.site.text(py)?.repr()?))
    }
}

impl AclHostBlock {
    pub fn copy(py: Python<'_>, b: &HostRec) -> AclHostBlock {
        AclHostBlock(HostRec { site: b.site.clone_ref(py), ..*b })
    }
}

/// The call sites of the last `FREED_SITES` pointers freed.
///
/// Invariant: every pointer in `sites` has exactly one entry in `order` with its `seq`;
/// `order`'s other entries are stale (a later free of the same pointer, or a removal), and
/// there are never more of them than live ones.
#[derive(Default)]
pub struct FreedSites {
    sites: FxHashMap<u64, (Site, u64)>,
    order: VecDeque<(u64, u64)>,
    seq: u64,
}

impl FreedSites {
    pub fn insert(&mut self, ptr: u64, site: Site) {
        self.seq += 1;
        self.sites.insert(ptr, (site, self.seq));
        self.order.push_back((ptr, self.seq));
        while self.sites.len() > FREED_SITES {
            let (old, seq) = self.order.pop_front().expect("every site has an entry in order");
            if self.sites.get(&old).is_some_and(|(_, s)| *s == seq) {
                self.sites.remove(&old);
            }
        }
        if self.order.len() > 2 * self.sites.len().max(FREED_SITES / 2) {
            let sites = &self.sites;
            self.order.retain(|(p, seq)| sites.get(p).is_some_and(|(_, s)| s == seq));
        }
    }

    pub fn get(&self, ptr: u64) -> Option<&Site> {
        self.sites.get(&ptr).map(|(site, _)| site)
    }

    /// The pointers kept, oldest free first.
    pub fn keys(&self) -> Vec<u64> {
        self.order.iter().filter(|(p, seq)| self.sites.get(p).is_some_and(|(_, s)| s == seq)).map(|(p, _)| *p).collect()
    }

    pub fn len(&self) -> usize {
        self.sites.len()
    }

    pub fn clear(&mut self) {
        *self = FreedSites::default();
    }

    /// Checks the invariant of the type (the tests call it).
    pub fn check_invariants(&self) -> Result<(), String> {
        let live = self.keys();
        if live.len() != self.sites.len() || self.sites.len() > FREED_SITES {
            return Err(format!("{} sites but {} live entries in order", self.sites.len(), live.len()));
        }
        if self.order.len() > 2 * self.sites.len().max(FREED_SITES / 2) + 1 {
            return Err(format!("{} entries in order for {} sites", self.order.len(), self.sites.len()));
        }
        Ok(())
    }
}
