//! `CachingConfig`: the published rules of PyTorch's and torch_npu's caching allocators, and the
//! `PYTORCH_NPU_ALLOC_CONF` grammar that tunes them (`key:value,key:[a:b,>:c]`).
//!
//! Invariants: a parsed config satisfies the same checks the real parsers make
//! (`max_split_size_mb > 20`, `0 < garbage_collection_threshold < 1`, power-of-two divisions,
//! ...); unknown keys are errors that list the known ones.

use crate::error::{AclError, Result};
use crate::units::{GIB, MIB};

/// Which allocator's rules to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`).
    PyTorch,
    /// torch_npu's NPUCachingAllocator: PyTorch's rules plus a 32-byte pad and `page_size:1g`.
    TorchNpu,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::PyTorch => "pytorch",
            Family::TorchNpu => "torch_npu",
        }
    }
}

/// Number of power-of-two intervals (1 MiB .. 64 GiB) of `roundup_power2_divisions`.
pub const ROUNDUP_INTERVALS: usize = 16;

/// Requests are rounded to multiples of this (kMinBlockSize).
pub const MIN_BLOCK: u64 = 512;
/// Largest small-pool request (kSmallSize).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool (kSmallBuffer).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Requests below this share a large segment (kMinLargeAlloc).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Large requests from `MIN_LARGE_ALLOC` up are rounded to this (kRoundLarge).
pub const ROUND_LARGE: u64 = 2 * MIB;

#[derive(Clone, Debug, PartialEq)]
pub struct CachingConfig {
    pub family: Family,
    /// Bytes added before rounding (torch_npu's AddPadSize: 32).
    pub pad: u64,
    /// Blocks at least this large are never split (`max_split_size_mb`; unlimited by default).
    pub max_split_size: u64,
    /// An unsplittable block may serve a request at most this much smaller.
    pub max_non_split_rounding: u64,
    /// Segment size for requests in (1 MiB, 10 MiB) (`large_segment_size_mb`, kLargeBuffer).
    pub large_segment_size: u64,
    /// Divisions per power-of-two interval from 1 MiB; 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Free cached blocks once reserved memory passes this fraction of the limit (0 = off).
    pub garbage_collection_threshold: f64,
    /// Fraction of the device this allocator may reserve.
    pub memory_fraction: f64,
    /// torch_npu `page_size:1g`: large segments in 1 GiB pages, rounded to 1 GiB.
    pub page_size_1g: bool,
    /// `expandable_segments:True` (not yet provided by these families).
    pub expandable_segments: bool,
    /// The alloc_conf string this config was built from, for reports.
    pub alloc_conf: String,
}

impl CachingConfig {
    pub fn preset(family: Family) -> Self {
        CachingConfig {
            family,
            pad: if family == Family::TorchNpu { 32 } else { 0 },
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 * MIB,
            large_segment_size: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            memory_fraction: 1.0,
            page_size_1g: false,
            expandable_segments: false,
            alloc_conf: String::new(),
        }
    }

    /// A preset tuned by an `alloc_conf` string in the PYTORCH_NPU_ALLOC_CONF grammar.
    pub fn parse(family: Family, alloc_conf: &str) -> Result<Self> {
        let mut c = Self::preset(family);
        c.alloc_conf = alloc_conf.to_string();
        let tokens = tokenize(alloc_conf);
        let mut i = 0;
        while i < tokens.len() {
            let key = tokens[i].as_str();
            if key == "," {
                i += 1;
                continue;
            }
            if tokens.get(i + 1).map(String::as_str) != Some(":") {
                return Err(bad(format!("expected ':' after {key:?} in alloc_conf {alloc_conf:?}")));
            }
            i += 2;
            let value = tokens.get(i).ok_or_else(|| bad(format!("{key} has no value")))?.clone();
            match key {
                "max_split_size_mb" => {
                    let mb = number(key, &value)?;
                    if mb <= 20.0 {
                        return Err(bad(format!("max_split_size_mb must be > 20, got {value}")));
                    }
                    c.max_split_size = (mb * MIB as f64) as u64;
                }
                "max_non_split_rounding_mb" => {
                    let mb = number(key, &value)?;
                    if mb < 20.0 {
                        return Err(bad(format!("max_non_split_rounding_mb must be >= 20, got {value}")));
                    }
                    c.max_non_split_rounding = (mb * MIB as f64) as u64;
                }
                "garbage_collection_threshold" => {
                    let t = number(key, &value)?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(format!("garbage_collection_threshold must be in (0, 1), got {value}")));
                    }
                    c.garbage_collection_threshold = t;
                }
                "per_process_memory_fraction" => {
                    let f = number(key, &value)?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(bad(format!("per_process_memory_fraction must be in [0, 1], got {value}")));
                    }
                    c.memory_fraction = f;
                }
                "large_segment_size_mb" | "segment_size_mb" => {
                    let mb = number(key, &value)?;
                    if mb <= 10.0 {
                        return Err(bad(format!("{key} must be > 10, got {value}")));
                    }
                    c.large_segment_size = (mb * MIB as f64) as u64;
                }
                "expandable_segments" => c.expandable_segments = boolean(key, &value)?,
                "page_size" if family == Family::TorchNpu => {
                    if !value.eq_ignore_ascii_case("1g") {
                        return Err(bad(format!("page_size accepts only 1g, got {value}")));
                    }
                    c.page_size_1g = true;
                }
                "roundup_power2_divisions" => {
                    if value == "[" {
                        let close = tokens[i..].iter().position(|t| t == "]").ok_or_else(|| {
                            bad("roundup_power2_divisions list is missing its closing ']'".to_string())
                        })?;
                        parse_divisions(&tokens[i + 1..i + close], &mut c.roundup_power2_divisions)?;
                        i += close;
                    } else {
                        let d = divisions(&value)?;
                        c.roundup_power2_divisions = [d; ROUNDUP_INTERVALS];
                    }
                }
                _ => {
                    let npu = if family == Family::TorchNpu { ", page_size" } else { "" };
                    return Err(bad(format!(
                        "unknown alloc_conf key {key:?}; known keys: max_split_size_mb, max_non_split_rounding_mb, \
                         garbage_collection_threshold, per_process_memory_fraction, large_segment_size_mb, \
                         roundup_power2_divisions, expandable_segments{npu}"
                    )));
                }
            }
            i += 1;
        }
        if family == Family::TorchNpu && c.max_split_size != u64::MAX && c.large_segment_size > c.max_split_size {
            return Err(bad(format!(
                "large_segment_size_mb ({}) must not exceed max_split_size_mb ({})",
                c.large_segment_size / MIB,
                c.max_split_size / MIB
            )));
        }
        if c.expandable_segments {
            return Err(AclError::new(
                crate::ErrorCode::FeatureUnsupported,
                format!("expandable_segments is not available for the {} family yet", family.name()),
            ));
        }
        Ok(c)
    }

    /// `round_size`: pad, then 512-byte granules or the power-of-two divisions.
    pub fn round_size(&self, size: u64) -> u64 {
        let size = size + self.pad;
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK * divisions {
            roundup_power2_next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK) * MIN_BLOCK
        }
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.leading_zeros() as usize;
        let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// `get_allocation_size`: the segment to obtain for a rounded request.
    pub fn allocation_size(&self, size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if self.page_size_1g {
            size.div_ceil(GIB) * GIB
        } else if size < MIN_LARGE_ALLOC {
            self.large_segment_size
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }
}

fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 { 2 * floor } else { size.div_ceil(step) * step }
}

fn parse_divisions(items: &[String], table: &mut [u64; ROUNDUP_INTERVALS]) -> Result<()> {
    let mut first = true;
    let mut last = 0usize;
    let pairs: Vec<&[String]> = items.split(|t| t == ",").filter(|p| !p.is_empty()).collect();
    for pair in pairs {
        let [k, colon, v] = pair else {
            return Err(bad(format!("roundup_power2_divisions entries look like 256:4 or >:8, got {}", pair.concat())));
        };
        if colon != ":" {
            return Err(bad(format!("expected ':' in roundup_power2_divisions entry {}", pair.concat())));
        }
        let d = divisions(v)?;
        if k == ">" {
            table[last.min(ROUNDUP_INTERVALS)..].fill(d);
            continue;
        }
        let mb: u64 = k.parse().map_err(|_| bad(format!("{k} is not a size in MB")))?;
        if !mb.is_power_of_two() {
            return Err(bad(format!("roundup_power2_divisions sizes must be powers of two (MB), got {k}")));
        }
        let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
        if first {
            table[..index].fill(d);
            first = false;
        }
        table[index] = d;
        last = index + 1;
    }
    Ok(())
}

pub(crate) fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in s.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !cur.trim().is_empty() {
                out.push(cur.trim().to_string());
            }
            cur.clear();
            out.push(ch.to_string());
        } else {
            cur.push(ch);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

pub(crate) fn bad(message: String) -> AclError {
    AclError::invalid_param(message)
}

pub(crate) fn number(key: &str, value: &str) -> Result<f64> {
    value
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| bad(format!("{key} needs a number, got {value:?}")))
}

pub(crate) fn boolean(key: &str, value: &str) -> Result<bool> {
    match value {
        "True" | "true" => Ok(true),
        "False" | "false" => Ok(false),
        _ => Err(bad(format!("{key} takes True or False, got {value:?}"))),
    }
}

/// A division count: a power of two, or 0 to turn the rounding off for that interval.
fn divisions(value: &str) -> Result<u64> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&d| d == 0 || d.is_power_of_two())
        .ok_or_else(|| bad(format!("roundup_power2_divisions must be a power of two or 0, got {value:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_rules() {
        let pt = CachingConfig::preset(Family::PyTorch);
        assert_eq!(pt.round_size(1), 512);
        assert_eq!(pt.round_size(513), 1024);
        assert_eq!(pt.round_size(MIB), MIB);
        let npu = CachingConfig::preset(Family::TorchNpu);
        assert_eq!(npu.round_size(480), 512);
        assert_eq!(npu.round_size(481), 1024);
        assert_eq!(npu.round_size(512), 1024);
        assert_eq!(pt.allocation_size(1000), 2 * MIB);
        assert_eq!(pt.allocation_size(3 * MIB), 20 * MIB);
        assert_eq!(pt.allocation_size(12 * MIB + 1), 14 * MIB);
        // The example in PyTorch's source: 1200 with 4 divisions -> 1280 (below 1 MiB interval 0).
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        let c = CachingConfig::parse(Family::PyTorch, "roundup_power2_divisions:4").unwrap();
        assert_eq!(c.round_size(MIB + 1), MIB + 256 * 1024);
        assert_eq!(c.round_size(5 * MIB), 5 * MIB);
        assert_eq!(c.round_size(5 * MIB + 1), 6 * MIB);
    }

    #[test]
    fn parses_the_grammar() {
        let c = CachingConfig::parse(
            Family::TorchNpu,
            "max_split_size_mb:128, garbage_collection_threshold:0.6,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],page_size:1g",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 128 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert!(c.page_size_1g);
        assert_eq!(c.roundup_power2_divisions[..9], [1; 9]);
        assert_eq!(c.roundup_power2_divisions[9], 2);
        assert_eq!(c.roundup_power2_divisions[10], 4);
        assert_eq!(c.roundup_power2_divisions[11..], [8; 5]);
        assert_eq!(c.allocation_size(3 * MIB), GIB);
        for bad in [
            "max_split_size_mb:10",
            "garbage_collection_threshold:1.5",
            "nonsense:1",
            "page_size:2m",
            "roundup_power2_divisions:3",
            "expandable_segments:maybe",
            "max_split_size_mb",
            "roundup_power2_divisions:[256:1",
            "per_process_memory_fraction:2",
        ] {
            assert!(CachingConfig::parse(Family::TorchNpu, bad).is_err(), "{bad}");
        }
        assert!(CachingConfig::parse(Family::PyTorch, "page_size:1g").is_err());
        assert_eq!(
            CachingConfig::parse(Family::PyTorch, "expandable_segments:True").unwrap_err().code,
            crate::ErrorCode::FeatureUnsupported
        );
        assert!(CachingConfig::parse(Family::PyTorch, "").is_ok());
    }
}
