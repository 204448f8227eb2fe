//! Byte sizes: parsing ("32GiB", "4 KiB", "1.5G"), formatting, and alignment arithmetic.
//!
//! Invariant: alignment helpers take power-of-two alignments and never overflow silently; the
//! checked variants return `None` where the unchecked ones would wrap.

use crate::error::{AclError, Result};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// Rounds `value` up to a multiple of the power of two `align`, or `None` on overflow.
#[inline]
pub fn checked_align_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Rounds `value` up to a multiple of the power of two `align`. Panics in debug on overflow.
#[inline]
pub fn align_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (value + (align - 1)) & !(align - 1)
}

/// Rounds `value` down to a multiple of the power of two `align`.
#[inline]
pub fn align_down(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    value & !(align - 1)
}

/// Parses a byte size: a plain integer, or a number with a unit (B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
/// T/TB/TiB; binary multiples in every spelling, as memory sizes are). Case-insensitive.
pub fn parse_size(text: &str) -> Result<u64> {
    let s = text.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: String = number.chars().filter(|&c| c != '_').collect();
    let bad = || {
        AclError::invalid_param(format!(
            "cannot read {text:?} as a size; write a byte count such as 4096, \"64KiB\", \"2MiB\" or \"32GiB\""
        ))
    };
    if number.is_empty() {
        return Err(bad());
    }
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        _ => return Err(bad()),
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(bad);
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Formats a byte count with the largest binary unit that keeps it readable ("1.50 GiB").
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    for (scale, name) in UNITS {
        if bytes >= scale {
            return if bytes % scale == 0 {
                format!("{} {name}", bytes / scale)
            } else {
                format!("{:.2} {name}", bytes as f64 / scale as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size(" 64 kb ").unwrap(), 65536);
        assert_eq!(parse_size("2M").unwrap(), 2 * MIB);
        assert_eq!(parse_size("32GiB").unwrap(), 32 * GIB);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_size("1_000").unwrap(), 1000);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "GiB", "12 parsecs", "-1", "1.3B", "99999999999TiB", "nan"] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.code, crate::ErrorCode::InvalidParam, "{bad}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(2 * MIB), "2 MiB");
        assert_eq!(format_size(3 * GIB / 2), "1.50 GiB");
    }

    #[test]
    fn aligns() {
        assert_eq!(align_up(1, 32), 32);
        assert_eq!(align_up(64, 32), 64);
        assert_eq!(align_down(4097, 4096), 4096);
        assert_eq!(checked_align_up(u64::MAX - 3, 32), None);
    }
}
