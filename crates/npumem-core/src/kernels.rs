//! Measurement kernels over host slices, for the page-size benchmarks
//! (`benches/bench_pagesize.py`, through `npumem._native.chase` and `gemm_tiled`).
//!
//! - [`chase`]: a dependent-load pointer chase, `i = next[i]` `steps` times.
//! - [`gemm_tiled`]: `c += a @ b` over row-major float32 matrices in square tiles, m-n-k order
//!   over tiles, i-k-j order inside a tile, no packing (every row of a B tile is read where it
//!   lies, so the traversal's page footprint is the matrices' own).
//! - Both touch only the elements of the slices they are given; every chase index is checked
//!   where it is followed, so a slice rewritten by another thread cannot send it astray.

use std::time::Instant;

use crate::error::{AclError, Result};

/// Follows `next` from `start` for `steps` dependent loads (`i = next[i]`); returns the final
/// index and the nanoseconds per step. An index outside `next` is an `InvalidParam` error.
pub fn chase(next: &[u64], start: u64, steps: u64) -> Result<(u64, f64)> {
    let mut at = start as usize;
    let t0 = Instant::now();
    for _ in 0..steps {
        at = match next.get(at) {
            Some(&v) => v as usize,
            None => return Err(AclError::invalid_param(format!("next was changed during the chase: {at}"))),
        };
    }
    let ns = t0.elapsed().as_nanos() as f64 / steps.max(1) as f64;
    Ok((std::hint::black_box(at) as u64, ns))
}

/// `c += a @ b` with `a` m x k, `b` k x n and `c` m x n, all row-major, in `tile`-sided blocks;
/// returns the elapsed nanoseconds.
///
/// # Panics
/// If a slice is shorter than its shape or `tile` is 0.
pub fn gemm_tiled(a: &[f32], b: &[f32], c: &mut [f32], (m, n, k): (usize, usize, usize), tile: usize) -> f64 {
    assert!(tile > 0 && a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "gemm_tiled: shapes");
    let t0 = Instant::now();
    for i0 in (0..m).step_by(tile) {
        for j0 in (0..n).step_by(tile) {
            let j1 = (j0 + tile).min(n);
            for k0 in (0..k).step_by(tile) {
                let k1 = (k0 + tile).min(k);
                for i in i0..(i0 + tile).min(m) {
                    let c_row = &mut c[i * n + j0..i * n + j1];
                    for kk in k0..k1 {
                        let aik = a[i * k + kk];
                        let b_row = &b[kk * n + j0..kk * n + j1];
                        for (x, &y) in c_row.iter_mut().zip(b_row) {
                            *x += aik * y;
                        }
                    }
                }
            }
        }
    }
    t0.elapsed().as_nanos() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chase_follows_the_cycle() {
        let next = [1, 2, 0];
        assert_eq!(chase(&next, 0, 1).unwrap().0, 1);
        assert_eq!(chase(&next, 0, 4).unwrap().0, 1);
        assert_eq!(chase(&next, 2, 3).unwrap().0, 2);
    }

    #[test]
    fn chase_rejects_an_index_outside() {
        let err = chase(&[5], 0, 2).unwrap_err();
        assert!(err.to_string().contains("next was changed during the chase: 5"), "{err}");
    }

    #[test]
    fn gemm_matches_the_naive_product_for_every_tile() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 - 4.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        let mut want = vec![1.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    want[i * n + j] += a[i * k + kk] * b[kk * n + j];
                }
            }
        }
        for tile in [1, 2, 3, 4, 64] {
            let mut c = vec![1.0f32; m * n];
            gemm_tiled(&a, &b, &mut c, (m, n, k), tile);
            assert_eq!(c, want, "tile {tile}");
        }
    }
}
