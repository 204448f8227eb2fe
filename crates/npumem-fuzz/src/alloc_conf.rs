//! `alloc_conf` parsing: `CachingConfig::parse` (pytorch, torch_npu) and `VmmConfig::parse`
//! (npumem) on arbitrary strings — raw text, and strings assembled from the grammar's keys and
//! value shapes so that the fuzzer reaches the value checks.
//!
//! Checked: no panic; parsing is deterministic; a config that parses satisfies the checks the
//! parser promises (`max_split_size_mb > 20`, thresholds and fractions in range, divisions powers
//! of two, ...); rendering a parsed config back into the grammar and parsing that gives the same
//! config (the round trip); and a device built with the string (when it parses) serves, frees
//! and trims a few allocations of awkward sizes without a panic and with its statistics right.

use arbitrary::{Arbitrary, Unstructured};
use npumem_core::backend::SimConfig;
use npumem_core::pool::config::ROUNDUP_INTERVALS;
use npumem_core::pool::{CachingConfig, Family, VmmConfig};
use npumem_core::units::MIB;
use npumem_core::{AllocatorKind, Device, DeviceConfig, Policy};

const KEYS: &[&str] = &[
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "large_segment_size_mb",
    "segment_size_mb",
    "expandable_segments",
    "page_size",
    "roundup_power2_divisions",
    "large_threshold_mb",
];

#[derive(Arbitrary, Debug)]
enum Value {
    Int(u64),
    Small(u8),
    Float(f64),
    Bool(bool),
    Word(String),
    List(Vec<(Option<u16>, u8)>),
}

#[derive(Arbitrary, Debug)]
enum Key {
    Known(u8),
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Conf {
    Raw(String),
    Items(Vec<(Key, Option<Value>)>, u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    family: u8,
    conf: Conf,
    sizes: Vec<u64>,
}

fn render_value(v: &Value) -> String {
    match v {
        Value::Int(n) => n.to_string(),
        Value::Small(n) => n.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
        Value::Word(w) => w.clone(),
        Value::List(items) => {
            let parts: Vec<String> = items
                .iter()
                .map(|(k, d)| match k {
                    Some(mb) => format!("{mb}:{d}"),
                    None => format!(">:{d}"),
                })
                .collect();
            format!("[{}]", parts.join(","))
        }
    }
}

fn render_input(conf: &Conf) -> String {
    match conf {
        Conf::Raw(s) => s.clone(),
        Conf::Items(items, sep) => {
            let sep = [",", ", ", ",,", " , "][usize::from(*sep) % 4];
            let parts: Vec<String> = items
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        Key::Known(i) => KEYS[usize::from(*i) % KEYS.len()].to_string(),
                        Key::Other(s) => s.clone(),
                    };
                    match v {
                        Some(v) => format!("{key}:{}", render_value(v)),
                        None => key,
                    }
                })
                .collect();
            parts.join(sep)
        }
    }
}

/// A caching config in the grammar, every setting spelled out (the divisions as a full list).
fn render_caching(c: &CachingConfig) -> String {
    let mut parts = Vec::new();
    if c.max_split_size != u64::MAX {
        parts.push(format!("max_split_size_mb:{}", c.max_split_size as f64 / MIB as f64));
    }
    parts.push(format!("max_non_split_rounding_mb:{}", c.max_non_split_rounding as f64 / MIB as f64));
    if c.garbage_collection_threshold > 0.0 {
        parts.push(format!("garbage_collection_threshold:{}", c.garbage_collection_threshold));
    }
    parts.push(format!("per_process_memory_fraction:{}", c.memory_fraction));
    parts.push(format!("large_segment_size_mb:{}", c.large_segment_size as f64 / MIB as f64));
    let divisions: Vec<String> =
        c.roundup_power2_divisions.iter().enumerate().map(|(i, d)| format!("{}:{d}", 1u64 << i)).collect();
    parts.push(format!("roundup_power2_divisions:[{}]", divisions.join(",")));
    if c.page_size_1g {
        parts.push("page_size:1g".into());
    }
    parts.join(",")
}

fn render_vmm(c: &VmmConfig) -> String {
    let mut parts = vec![
        format!("per_process_memory_fraction:{}", c.memory_fraction),
        format!("large_threshold_mb:{}", c.bypass_threshold as f64 / MIB as f64),
    ];
    if c.garbage_collection_threshold > 0.0 {
        parts.push(format!("garbage_collection_threshold:{}", c.garbage_collection_threshold));
    }
    parts.join(",")
}

fn check_caching(family: Family, conf: &str) -> bool {
    let parsed = CachingConfig::parse(family, conf);
    assert_eq!(parsed, CachingConfig::parse(family, conf), "parsing is deterministic");
    let Ok(c) = parsed else { return false };
    assert_eq!(c.alloc_conf, conf);
    assert_eq!(c.family, family);
    assert_eq!(c.pad, if family == Family::TorchNpu { 32 } else { 0 });
    assert!(c.max_split_size == u64::MAX || c.max_split_size > 20 * MIB, "max_split_size {}", c.max_split_size);
    assert!(c.max_non_split_rounding >= 20 * MIB, "max_non_split_rounding {}", c.max_non_split_rounding);
    assert!((0.0..1.0).contains(&c.garbage_collection_threshold), "gc threshold {}", c.garbage_collection_threshold);
    assert!((0.0..=1.0).contains(&c.memory_fraction), "memory fraction {}", c.memory_fraction);
    assert!(c.large_segment_size > 10 * MIB, "large_segment_size {}", c.large_segment_size);
    assert!(c.roundup_power2_divisions.iter().all(|&d| d == 0 || d.is_power_of_two()), "{c:?}");
    assert_eq!(c.roundup_power2_divisions.len(), ROUNDUP_INTERVALS);
    assert!(!c.expandable_segments, "expandable_segments is refused by these families");
    assert!(!c.page_size_1g || family == Family::TorchNpu, "page_size:1g is torch_npu's");
    if family == Family::TorchNpu && c.max_split_size != u64::MAX {
        assert!(c.large_segment_size <= c.max_split_size, "{c:?}");
    }
    let text = render_caching(&c);
    let again = CachingConfig::parse(family, &text).unwrap_or_else(|e| panic!("{text:?} does not parse back: {e}"));
    assert_eq!(CachingConfig { alloc_conf: String::new(), ..again }, CachingConfig { alloc_conf: String::new(), ..c });
    true
}

fn check_vmm(conf: &str) -> bool {
    let parsed = VmmConfig::parse(conf);
    assert_eq!(parsed, VmmConfig::parse(conf), "parsing is deterministic");
    let Ok(c) = parsed else { return false };
    assert_eq!(c.alloc_conf, conf);
    assert!((0.0..=1.0).contains(&c.memory_fraction), "memory fraction {}", c.memory_fraction);
    assert!((0.0..1.0).contains(&c.garbage_collection_threshold), "gc threshold {}", c.garbage_collection_threshold);
    assert!(c.bypass_threshold >= 2 * MIB, "bypass threshold {}", c.bypass_threshold);
    assert!(c.quantum.is_power_of_two());
    let text = render_vmm(&c);
    let again = VmmConfig::parse(&text).unwrap_or_else(|e| panic!("{text:?} does not parse back: {e}"));
    assert_eq!(VmmConfig { alloc_conf: String::new(), ..again }, VmmConfig { alloc_conf: String::new(), ..c });
    true
}

/// A small device with the conf: a few mallocs (sizes from the input), frees, a trim.
fn exercise(kind: AllocatorKind, conf: &str, sizes: &[u64]) {
    let sim = SimConfig { capacity: 64 * MIB, ..Default::default() };
    let mut d =
        match Device::new(DeviceConfig { sim, allocator: kind, alloc_conf: conf.to_string(), ..Default::default() }) {
            Ok(d) => d,
            Err(e) => panic!("{conf:?} parsed but the device refuses it: {e}"),
        };
    let mut live = Vec::new();
    for (i, &size) in sizes.iter().take(16).enumerate() {
        let policy = Policy::ALL[i % Policy::ALL.len()];
        if let Ok(p) = d.malloc(size, policy) {
            live.push(p);
        }
        if i % 3 == 2 {
            if let Some(p) = live.pop() {
                d.free(p).expect("free of a live allocation");
            }
        }
    }
    let s = d.stats();
    assert_eq!(s.live_count, live.len() as u64);
    let granted: u64 = d.allocations().iter().map(|a| a.granted).sum();
    assert_eq!(s.live_granted, granted);
    d.trim_to(0).expect("trim");
    for p in live {
        d.free(p).expect("free of a live allocation");
    }
    d.empty_cache().expect("empty_cache");
    assert_eq!(d.pool_stats().allocated_bytes.all.current, 0, "{conf:?}: nothing allocated after freeing all");
    assert_eq!(d.pool_stats().reserved_bytes.all.current, 0, "{conf:?}: nothing reserved after empty_cache");
}

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let conf = render_input(&input.conf);
    if conf.len() > 4096 {
        return;
    }
    let (kind, ok) = match input.family % 3 {
        0 => (AllocatorKind::PyTorch, check_caching(Family::PyTorch, &conf)),
        1 => (AllocatorKind::TorchNpu, check_caching(Family::TorchNpu, &conf)),
        _ => (AllocatorKind::Npumem, check_vmm(&conf)),
    };
    if ok {
        exercise(kind, &conf, &input.sizes);
    }
}
