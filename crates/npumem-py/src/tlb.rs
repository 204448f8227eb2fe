//! `npumem._native.Tlb`: the TLB model, fed from numpy address arrays through a device's page table.

use npumem_core::vm::PageSize;
use npumem_core::vm::tlb::{ArrayConfig, Replacement, Tlb, TlbConfig};
use numpy::PyReadonlyArray1;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::device::PyDevice;
use crate::errors::{guard, to_py};

#[pyclass(module = "npumem._native", name = "Tlb", frozen)]
pub struct PyTlb {
    tlb: Mutex<Tlb>,
    device: Py<PyDevice>,
}

fn page_label(p: &PageSize) -> &'static str {
    p.label()
}

#[pymethods]
impl PyTlb {
    /// A TLB of a preset geometry over `device`'s page table; `overrides` may set
    /// `walk_step_cycles`, `walk_cache_entries` (3 ints) and, per array, `"<level>.<array>.<field>"`
    /// with field entries, ways, replacement or hit_cycles.
    #[new]
    #[pyo3(signature = (preset, device, overrides = None))]
    fn new(
        py: Python<'_>,
        preset: &str,
        device: Py<PyDevice>,
        overrides: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut config = TlbConfig::preset(preset).map_err(|e| to_py(py, e))?;
        if let Some(o) = overrides {
            for (k, v) in o.iter() {
                let key: String = k.extract()?;
                apply_override(py, &mut config, &key, &v)?;
            }
        }
        let tlb = guard(py, || Tlb::new(config))?;
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
        let slice = crate::convert::array_slice(&addresses)?;
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
    fn nominal_reach(&self, py: Python<'_>, page_size: u64) -> PyResult<Vec<u64>> {
        let page = PageSize::from_bytes(page_size).ok_or_else(|| {
            to_py(py, npumem_core::AclError::invalid_param("page_size must be 4096, 65536, 2 MiB or 1 GiB"))
        })?;
        Ok(self.tlb.lock().nominal_reach(page))
    }
}

fn apply_override(py: Python<'_>, config: &mut TlbConfig, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let bad = |msg: String| to_py(py, npumem_core::AclError::invalid_param(msg));
    match key {
        "walk_step_cycles" => config.walk_step_cycles = value.extract()?,
        "coalesce" => config.coalesce = value.extract()?,
        "walk_cache_entries" => {
            let v: Vec<usize> = value.extract()?;
            config.walk_cache_entries = v.try_into().map_err(|_| bad("walk_cache_entries needs 3 ints".into()))?;
        }
        _ => {
            let parts: Vec<&str> = key.split('.').collect();
            let [level, array, field] = parts[..] else {
                return Err(bad(format!(
                    "unknown TLB override {key:?}; use walk_step_cycles, walk_cache_entries, coalesce or \"<level>.<array>.<field>\""
                )));
            };
            let (l, a): (usize, usize) = (
                level.parse().map_err(|_| bad(format!("bad level in {key:?}")))?,
                array.parse().map_err(|_| bad(format!("bad array in {key:?}")))?,
            );
            let arr: &mut ArrayConfig = config
                .levels
                .get_mut(l)
                .and_then(|lv| lv.get_mut(a))
                .ok_or_else(|| bad(format!("{key:?}: no array {a} at level {l}")))?;
            match field {
                "entries" => arr.entries = value.extract()?,
                "ways" => arr.ways = value.extract()?,
                "hit_cycles" => arr.hit_cycles = value.extract()?,
                "replacement" => {
                    arr.replacement = Replacement::parse(&value.extract::<String>()?).map_err(|e| to_py(py, e))?
                }
                other => {
                    return Err(bad(format!(
                        "unknown array field {other:?}; use entries, ways, replacement, hit_cycles"
                    )));
                }
            }
        }
    }
    Ok(())
}
