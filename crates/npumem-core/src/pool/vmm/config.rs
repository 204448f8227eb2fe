use super::*;

/// Settings of the npumem pool.
#[derive(Clone, Debug, PartialEq)]
pub struct VmmConfig {
    /// Block sizes are multiples of this.
    pub quantum: u64,
    /// Requests of at least this many bytes are mapped directly, outside the pools.
    pub bypass_threshold: u64,
    /// Fraction of the device this pool may hold.
    pub memory_fraction: f64,
    /// Trim idle pages once held memory passes this fraction of the limit (0 = off).
    pub garbage_collection_threshold: f64,
    pub alloc_conf: String,
}

impl Default for VmmConfig {
    fn default() -> Self {
        VmmConfig {
            quantum: 512,
            bypass_threshold: 512 * MIB,
            memory_fraction: 1.0,
            garbage_collection_threshold: 0.0,
            alloc_conf: String::new(),
        }
    }
}

impl VmmConfig {
    /// Parses `key:value,...` (keys: per_process_memory_fraction, garbage_collection_threshold,
    /// large_threshold_mb; `expandable_segments:True` is accepted, as the pool always is one).
    pub fn parse(alloc_conf: &str) -> Result<Self> {
        let mut c = VmmConfig { alloc_conf: alloc_conf.to_string(), ..Default::default() };
        let tokens = tokenize(alloc_conf);
        let items: Vec<&[String]> = tokens.split(|t| t == ",").filter(|p| !p.is_empty()).collect();
        for item in items {
            let [key, colon, value] = item else {
                return Err(bad(format!("alloc_conf entries look like key:value, got {:?}", item.concat())));
            };
            if colon != ":" {
                return Err(bad(format!("expected ':' in {:?}", item.concat())));
            }
            match key.as_str() {
                "per_process_memory_fraction" => {
                    let f = number(key, value)?;
                    if f > 1.0 {
                        return Err(bad(format!("per_process_memory_fraction must be in [0, 1], got {value}")));
                    }
                    c.memory_fraction = f;
                }
                "garbage_collection_threshold" => {
                    let t = number(key, value)?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(format!("garbage_collection_threshold must be in (0, 1), got {value}")));
                    }
                    c.garbage_collection_threshold = t;
                }
                "large_threshold_mb" => {
                    let mb = number(key, value)?;
                    if mb < 2.0 {
                        return Err(bad(format!("large_threshold_mb must be at least 2, got {value}")));
                    }
                    c.bypass_threshold = (mb * MIB as f64) as u64;
                }
                "expandable_segments" => {
                    if !boolean(key, value)? {
                        return Err(bad("the npumem pool is always expandable; use the pytorch family for \
                                        expandable_segments:False"
                            .into()));
                    }
                }
                other => {
                    return Err(bad(format!(
                        "unknown alloc_conf key {other:?} for the npumem allocator; known keys: \
                         per_process_memory_fraction, garbage_collection_threshold, large_threshold_mb, \
                         expandable_segments"
                    )));
                }
            }
        }
        Ok(c)
    }
}
