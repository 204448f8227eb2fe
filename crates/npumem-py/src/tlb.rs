//! `npumem._native.Tlb`: the TLB model, fed from numpy address arrays through a device's page table.

use npumem_core::AclError;
use npumem_core::vm::tlb::reference::ReferenceTlb;
use npumem_core::vm::tlb::{self, ArrayConfig, HostConfig, Replacement, Tlb, TlbConfig, TlbStats, field_range};
use npumem_core::vm::{PageSize, Translation};
use numpy::PyReadonlyArray1;
use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList};

use crate::args::{Uint, array_slice, name};
use crate::device::PyDevice;
use crate::errors::{guard, to_py};

#[pyclass(module = "npumem._native", name = "Tlb", frozen)]
pub struct PyTlb {
    tlb: Mutex<Model>,
    device: Py<PyDevice>,
}

/// The model a `Tlb` runs: the fast one, or the reference (the model as first written, with
/// linear scans: bit-identical and many times slower, for cross-checks and before/after
/// benchmarks).
enum Model {
    Fast(Box<Tlb>),
    Reference(Box<ReferenceTlb>),
}

impl Model {
    fn run(&mut self, addresses: &[u64], translate: impl Fn(u64) -> Option<Translation>) {
        match self {
            Model::Fast(t) => t.run(addresses, translate),
            Model::Reference(t) => t.run(addresses, translate),
        }
    }

    fn reset_stats(&mut self) {
        match self {
            Model::Fast(t) => t.reset_stats(),
            Model::Reference(t) => t.reset_stats(),
        }
    }

    fn stats(&self) -> &TlbStats {
        match self {
            Model::Fast(t) => t.stats(),
            Model::Reference(t) => t.stats(),
        }
    }

    fn config(&self) -> &TlbConfig {
        match self {
            Model::Fast(t) => t.config(),
            Model::Reference(t) => t.config(),
        }
    }

    fn effective_reach(&self) -> Vec<u64> {
        match self {
            Model::Fast(t) => t.effective_reach(),
            Model::Reference(t) => t.effective_reach(),
        }
    }

    fn nominal_reach(&self, page: PageSize) -> Vec<u64> {
        match self {
            Model::Fast(t) => t.nominal_reach(page),
            Model::Reference(t) => t.nominal_reach(page),
        }
    }
}

fn page_label(p: &PageSize) -> &'static str {
    p.label()
}

#[pymethods]
impl PyTlb {
    /// A TLB of a preset geometry over `device`'s page table; `overrides` may set
    /// `walk_step_cycles`, `walk_cache_entries` (3 ints), `coalesce` and, per array,
    /// `"<level>.<array>.<field>"` with field entries, ways, replacement or hit_cycles. Every
    /// size and cycle count is checked against the core's bounds (`vm::tlb::limits`) before
    /// anything is allocated. `model` is "fast" or "reference" (the model as first written).
    #[new]
    #[pyo3(signature = (preset, device, overrides = None, model = "fast"))]
    fn new(
        py: Python<'_>,
        preset: &str,
        device: Py<PyDevice>,
        overrides: Option<&Bound<'_, PyDict>>,
        model: &str,
    ) -> PyResult<Self> {
        if !matches!(model, "fast" | "reference") {
            return Err(to_py(
                py,
                AclError::invalid_param(format!("TLB model must be \"fast\" or \"reference\", got {model:?}")),
            ));
        }
        let mut config = if preset == "cpuid" {
            // CPUID cannot see a host: its page comes with the call (used where CPUID reports a
            // hypervisor).
            let page = match overrides.map(|o| o.get_item("host_page_size")).transpose()?.flatten() {
                Some(v) if !v.is_none() => Some(host_page(py, "host_page_size", &v)?),
                _ => None,
            };
            TlbConfig::from_cpuid(page).map_err(|e| to_py(py, e))?
        } else {
            TlbConfig::preset(preset).map_err(|e| to_py(py, e))?
        };
        if let Some(o) = overrides {
            for (k, v) in o.iter() {
                let key: String = k.extract()?;
                if preset == "cpuid" && key == "host_page_size" {
                    continue;
                }
                apply_override(py, &mut config, &key, &v)?;
            }
        }
        let tlb = if model == "fast" {
            Model::Fast(Box::new(guard(py, || Tlb::new(config))?))
        } else {
            Model::Reference(Box::new(guard(py, || ReferenceTlb::new(config))?))
        };
        Ok(PyTlb { tlb: Mutex::new(tlb), device })
    }

    /// Preset names.
    #[staticmethod]
    fn presets() -> Vec<&'static str> {
        TlbConfig::PRESETS.to_vec()
    }

    /// The geometry as a dict (name, source, levels of arrays, walk caches, walk step cycles).
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.tlb.lock().config().clone();
        let d = PyDict::new(py);
        d.set_item("name", &c.name)?;
        d.set_item("source", &c.source)?;
        d.set_item("source_kind", &c.source_kind)?;
        match &c.host {
            Some(h) => {
                let hd = PyDict::new(py);
                hd.set_item("page_size", h.page_size.bytes())?;
                hd.set_item("levels", h.levels)?;
                hd.set_item("nested_tlb_entries", h.nested_tlb_entries)?;
                hd.set_item("walk_cache_entries", h.walk_cache_entries.to_vec())?;
                d.set_item("host", hd)?;
            }
            None => d.set_item("host", py.None())?,
        }
        let levels = PyList::empty(py);
        for level in &c.levels {
            let arrays = PyList::empty(py);
            for a in level {
                let ad = PyDict::new(py);
                ad.set_item("name", &a.name)?;
                ad.set_item("entries", a.entries)?;
                ad.set_item("ways", a.ways)?;
                ad.set_item("page_sizes", a.page_sizes.iter().map(page_label).collect::<Vec<_>>())?;
                ad.set_item("replacement", format!("{:?}", a.replacement).to_lowercase())?;
                ad.set_item("hit_cycles", a.hit_cycles)?;
                arrays.append(ad)?;
            }
            levels.append(arrays)?;
        }
        d.set_item("levels", levels)?;
        d.set_item("walk_cache_entries", c.walk_cache_entries.to_vec())?;
        d.set_item("walk_step_cycles", c.walk_step_cycles)?;
        d.set_item("coalesce", c.coalesce)?;
        Ok(d)
    }

    /// Runs the addresses (a 1-D uint64 array) through the TLB; returns the cumulative counters.
    fn run<'py>(&self, py: Python<'py>, addresses: PyReadonlyArray1<'py, u64>) -> PyResult<Bound<'py, PyDict>> {
        let slice = array_slice(&addresses)?;
        let device = self.device.get();
        let tlb = &self.tlb;
        py.detach(|| {
            let dev = device.lock_inner();
            tlb.lock().run(slice, |va| dev.translate(va).ok());
        });
        self.stats(py)
    }

    /// Clears the counters; the TLB stays warm.
    fn reset_stats(&self) {
        self.tlb.lock().reset_stats();
    }

    /// The counters: accesses, faults, walks, walk_steps, walk_steps_skipped, cycles, and per
    /// level a list of arrays with name, lookups, hits, misses, evictions.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let tlb = self.tlb.lock();
        let (s, c) = (tlb.stats().clone(), tlb.config().clone());
        drop(tlb);
        let d = PyDict::new(py);
        for (k, v) in [
            ("accesses", s.accesses),
            ("faults", s.faults),
            ("walks", s.walks),
            ("walk_steps", s.walk_steps),
            ("walk_steps_skipped", s.walk_steps_skipped),
            ("cycles", s.cycles),
            ("nested_tlb_hits", s.nested_tlb_hits),
            ("nested_tlb_misses", s.nested_tlb_misses),
            ("nested_walks", s.nested_walks),
            ("nested_steps", s.nested_steps),
            ("nested_steps_skipped", s.nested_steps_skipped),
        ] {
            d.set_item(k, v)?;
        }
        let levels = PyList::empty(py);
        for (stats, cfgs) in s.arrays.iter().zip(&c.levels) {
            let arrays = PyList::empty(py);
            for (a, cfg) in stats.iter().zip(cfgs) {
                let ad = PyDict::new(py);
                ad.set_item("name", &cfg.name)?;
                ad.set_item("lookups", a.lookups)?;
                ad.set_item("hits", a.hits)?;
                ad.set_item("misses", a.misses)?;
                ad.set_item("evictions", a.evictions)?;
                arrays.append(ad)?;
            }
            levels.append(arrays)?;
        }
        d.set_item("levels", levels)?;
        Ok(d)
    }

    /// Bytes the valid entries of each level map now.
    fn effective_reach(&self) -> Vec<u64> {
        self.tlb.lock().effective_reach()
    }

    /// Nominal reach of each level if every entry held a page of `page_size` bytes.
    fn nominal_reach(&self, py: Python<'_>, page_size: Uint<name::page_size>) -> PyResult<Vec<u64>> {
        let bytes = page_size.0;
        let page = PageSize::from_bytes(bytes).ok_or_else(|| {
            to_py(
                py,
                AclError::invalid_param(format!("page_size must be 4096, 65536, 2097152 or 1073741824, got {bytes}")),
            )
        })?;
        Ok(self.tlb.lock().nominal_reach(page))
    }
}

/// An integer override: any Python int within 64 bits reaches the core's check of its range;
/// one outside is refused here with the same message, a non-int with a `TypeError`.
fn int_override(key: &str, field: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(v) = value.extract::<u64>() {
        return Ok(v);
    }
    if !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "TLB override {key} must be an int, got {} {}",
            value.get_type().name()?,
            value.repr()?
        )));
    }
    Err(out_of_range(value.py(), key, field, value))
}

/// The error for `key = value` outside the accepted range of `field`.
fn out_of_range(py: Python<'_>, key: &str, field: &str, value: impl std::fmt::Display) -> PyErr {
    let range = field_range(field).expect("integer fields have a range");
    to_py(py, tlb::out_of_range(key, value, &range, ""))
}

/// A size override (entries, ways), as the core's `usize`.
fn size_override(key: &str, field: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    // Past usize (a 32-bit host) the core's bound refuses it anyway: saturate.
    int_override(key, field, value).map(|v| usize::try_from(v).unwrap_or(usize::MAX))
}

/// A host page size in bytes: 4096, 2097152 or 1073741824.
fn host_page(py: Python<'_>, key: &str, value: &Bound<'_, PyAny>) -> PyResult<PageSize> {
    let bytes = value.extract::<u64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "TLB {key} must be an int (bytes), got {}",
            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })?;
    match PageSize::from_bytes(bytes) {
        Some(p) if p != PageSize::Size64K => Ok(p),
        _ => Err(to_py(
            py,
            AclError::invalid_param(format!(
                "TLB {key} = {bytes} is not a host page: accepted 4096, 2097152 or 1073741824"
            )),
        )),
    }
}

/// The `host` override: None (native translation) or a dict of page_size, levels,
/// nested_tlb_entries, walk_cache_entries (each optional; the rest from the preset's host or
/// [`HostConfig::with_page`] of 4 KiB).
fn apply_host(py: Python<'_>, config: &mut TlbConfig, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if value.is_none() {
        config.host = None;
        return Ok(());
    }
    let d = value.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "TLB override host must be None or a dict (page_size, levels, nested_tlb_entries, walk_cache_entries), got {}",
            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })?;
    let mut host = config.host.clone().unwrap_or_else(|| HostConfig::with_page(PageSize::Size4K));
    for (k, v) in d.iter() {
        let field: String = k.extract()?;
        let key = format!("host.{field}");
        match field.as_str() {
            "page_size" => host.page_size = host_page(py, &key, &v)?,
            "levels" => {
                let n = int_override(&key, "levels", &v)?;
                host.levels = u32::try_from(n).map_err(|_| out_of_range(py, &key, "levels", n))?;
            }
            "nested_tlb_entries" => host.nested_tlb_entries = size_override(&key, "nested_tlb_entries", &v)?,
            "walk_cache_entries" => host.walk_cache_entries = three_sizes(py, &key, &v)?,
            other => {
                return Err(to_py(
                    py,
                    AclError::invalid_param(format!(
                        "unknown TLB host field {other:?}; use page_size, levels, nested_tlb_entries or walk_cache_entries"
                    )),
                ));
            }
        }
    }
    config.host = Some(host);
    Ok(())
}

/// Three walk-cache sizes (table levels 0, 1, 2).
fn three_sizes(py: Python<'_>, key: &str, value: &Bound<'_, PyAny>) -> PyResult<[usize; 3]> {
    let items: Vec<Bound<'_, PyAny>> = value
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("TLB override {key} must be a list of 3 ints, got {value}")))?;
    if items.len() != 3 {
        return Err(to_py(
            py,
            AclError::invalid_param(format!(
                "TLB override {key} must hold 3 ints (table levels 0, 1, 2), got {}",
                items.len()
            )),
        ));
    }
    let mut out = [0; 3];
    for (i, item) in items.iter().enumerate() {
        out[i] = size_override(&format!("{key}[{i}]"), "walk_cache_entries", item)?;
    }
    Ok(out)
}

fn apply_override(py: Python<'_>, config: &mut TlbConfig, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let bad = |msg: String| to_py(py, AclError::invalid_param(msg));
    match key {
        "host" => apply_host(py, config, value)?,
        "host_page_size" => {
            if !value.is_none() {
                let page = host_page(py, key, value)?;
                let mut host = config.host.clone().unwrap_or_else(|| HostConfig::with_page(page));
                host.page_size = page;
                config.host = Some(host);
            }
        }
        "walk_step_cycles" => config.walk_step_cycles = int_override(key, key, value)?,
        "coalesce" => {
            let v = int_override(key, key, value)?;
            config.coalesce = u32::try_from(v).map_err(|_| out_of_range(py, key, key, v))?;
        }
        "walk_cache_entries" => config.walk_cache_entries = three_sizes(py, key, value)?,
        _ => {
            let parts: Vec<&str> = key.split('.').collect();
            let [level, array, field] = parts[..] else {
                return Err(bad(format!(
                    "unknown TLB override {key:?}; use walk_step_cycles, walk_cache_entries, coalesce, host, host_page_size or \"<level>.<array>.<field>\""
                )));
            };
            let (l, a): (usize, usize) = (
                level
                    .parse()
                    .map_err(|_| bad(format!("bad level in TLB override {key:?}: {level:?} is not a level number")))?,
                array
                    .parse()
                    .map_err(|_| bad(format!("bad array in TLB override {key:?}: {array:?} is not an array number")))?,
            );
            let arr: &mut ArrayConfig = config
                .levels
                .get_mut(l)
                .and_then(|lv| lv.get_mut(a))
                .ok_or_else(|| bad(format!("TLB override {key:?}: the preset has no array {a} at level {l}")))?;
            match field {
                "entries" => arr.entries = size_override(key, field, value)?,
                "ways" => arr.ways = size_override(key, field, value)?,
                "hit_cycles" => arr.hit_cycles = int_override(key, field, value)?,
                "replacement" => {
                    let name: String = value.extract().map_err(|_| {
                        PyTypeError::new_err(format!(
                            "TLB override {key} must be a str, got {}",
                            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                        ))
                    })?;
                    arr.replacement = Replacement::parse(&name).map_err(|e| to_py(py, e))?
                }
                other => {
                    return Err(bad(format!(
                        "unknown array field {other:?} in TLB override {key:?}; use entries, ways, replacement, hit_cycles"
                    )));
                }
            }
        }
    }
    Ok(())
}
