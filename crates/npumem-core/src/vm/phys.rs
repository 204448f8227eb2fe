//! `PhysMemory`: the bytes of simulated HBM, indexed by physical address.
//!
//! Storage is lazy: memory is kept in 64 KiB chunks that come into being when bytes are stored in
//! them (a write, a non-zero fill, a copy of written bytes), so a 64 GiB device costs only what is
//! written to it. Bytes never written read as zero (real device memory is uninitialised; zero is
//! one valid value of it).
//!
//! Host memory for chunks is taken fallibly: an operation that stores bytes first
//! [`materialise`](PhysMemory::materialise)s every chunk it needs inside
//! [`all_or_nothing`](PhysMemory::all_or_nothing) (a new zero chunk changes no byte anyone reads,
//! and on failure the new chunks are dropped again), then stores, so a host out of memory gives an
//! `OutOfMemoryError` and leaves the contents as they were, never an abort or a half-done store.
//! Reading, zeroing and copying unwritten memory allocate nothing.
//!
//! Invariants: a chunk exists only if it was materialised for a store since it was last discarded
//! or zeroed whole, so resident memory never exceeds what was stored; an absent chunk reads as
//! zero; no operation here allocates more than one chunk per chunk it stores into; reads and
//! writes at any address below the capacity succeed; callers (the backend) check bounds against
//! the frames they own, so this type only guards against addresses past the capacity.

use std::collections::HashMap;

use crate::error::{AclError, Result};

const CHUNK_SHIFT: u32 = 16;
const CHUNK: u64 = 1 << CHUNK_SHIFT;

#[derive(Debug, Default)]
pub struct PhysMemory {
    capacity: u64,
    chunks: HashMap<u64, Box<[u8]>>,
}

/// A zero-filled chunk, or an out-of-memory error if the host cannot spare one.
fn zeroed_chunk() -> Result<Box<[u8]>> {
    let mut data = Vec::new();
    data.try_reserve_exact(CHUNK as usize).map_err(|_| host_exhausted())?;
    data.resize(CHUNK as usize, 0);
    Ok(data.into_boxed_slice())
}

fn host_exhausted() -> AclError {
    AclError::oom(
        "the host has no memory left to store the simulated device's bytes (64 KiB at a time); \
         free device memory you no longer need or write less",
    )
}

/// Splits `[pa, pa + len)` into per-chunk pieces: (chunk index, offset in chunk, piece length).
fn pieces(pa: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
    let mut at = pa;
    let end = pa + len;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let offset = at & (CHUNK - 1);
            let n = (CHUNK - offset).min(end - at);
            let piece = (at >> CHUNK_SHIFT, offset as usize, n as usize);
            at += n;
            piece
        })
    })
}

/// Splits a copy of `len` bytes from `src` to `dst` into pieces that each lie in one chunk on
/// both sides: (dst, src, length), from the low end, or from the high end when `backward`.
fn copy_pieces(dst: u64, src: u64, len: u64, backward: bool) -> impl Iterator<Item = (u64, u64, usize)> {
    let room = move |a: u64| CHUNK - (a & (CHUNK - 1));
    let (mut lo, mut hi) = (0u64, len);
    std::iter::from_fn(move || {
        (lo < hi).then(|| {
            if backward {
                // Bytes left in the chunks that hold the last byte of each side.
                let last = |a: u64| ((a + hi - 1) & (CHUNK - 1)) + 1;
                let n = last(dst).min(last(src)).min(hi - lo);
                hi -= n;
                (dst + hi, src + hi, n as usize)
            } else {
                let n = room(dst + lo).min(room(src + lo)).min(hi - lo);
                lo += n;
                (dst + lo - n, src + lo - n, n as usize)
            }
        })
    })
}

impl PhysMemory {
    pub fn new(capacity: u64) -> Self {
        PhysMemory { capacity, chunks: HashMap::new() }
    }

    /// Host bytes currently backing the simulated memory.
    pub fn resident_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK
    }

    fn check(&self, pa: u64, len: u64) {
        assert!(
            pa.checked_add(len).is_some_and(|e| e <= self.capacity),
            "physical access {pa:#x}+{len} past the capacity {:#x}",
            self.capacity
        );
    }

    /// Reads `out.len()` bytes at `pa`; never allocates (absent chunks read as zero).
    pub fn read(&self, pa: u64, out: &mut [u8]) {
        self.check(pa, out.len() as u64);
        let mut done = 0;
        for (chunk, offset, n) in pieces(pa, out.len() as u64) {
            let dst = &mut out[done..done + n];
            match self.chunks.get(&chunk) {
                Some(data) => dst.copy_from_slice(&data[offset..offset + n]),
                None => dst.fill(0),
            }
            done += n;
        }
    }

    /// Makes sure chunk `chunk` exists, creating it zero-filled (and noting it in `created`).
    fn ensure(&mut self, chunk: u64, created: &mut Vec<u64>) -> Result<()> {
        if self.chunks.contains_key(&chunk) {
            return Ok(());
        }
        let data = zeroed_chunk()?;
        self.chunks.try_reserve(1).map_err(|_| host_exhausted())?;
        created.try_reserve(1).map_err(|_| host_exhausted())?;
        self.chunks.insert(chunk, data);
        created.push(chunk);
        Ok(())
    }

    /// Creates the absent chunks under `[pa, pa + len)`, zero-filled, so that a store there
    /// cannot fail; each chunk created is pushed on `created` (see
    /// [`all_or_nothing`](Self::all_or_nothing)). What reads see does not change.
    pub fn materialise(&mut self, pa: u64, len: u64, created: &mut Vec<u64>) -> Result<()> {
        self.check(pa, len);
        for (chunk, _, _) in pieces(pa, len) {
            self.ensure(chunk, created)?;
        }
        Ok(())
    }

    /// Creates the destination chunks a [`copy`](Self::copy) of `len` bytes from `src` to `dst`
    /// will store into: those whose source bytes are backed (unwritten source is copied by
    /// zeroing, which needs no chunk).
    pub fn materialise_for_copy(&mut self, dst: u64, src: u64, len: u64, created: &mut Vec<u64>) -> Result<()> {
        self.check(dst, len);
        self.check(src, len);
        for (d, s, _) in copy_pieces(dst, src, len, false) {
            if self.chunks.contains_key(&(s >> CHUNK_SHIFT)) {
                self.ensure(d >> CHUNK_SHIFT, created)?;
            }
        }
        Ok(())
    }

    /// Runs `materialise`, which creates chunks with [`materialise`](Self::materialise) or
    /// [`materialise_for_copy`](Self::materialise_for_copy) (passing them the list it is given);
    /// if it fails, the chunks it created are dropped again, so nothing changed.
    pub fn all_or_nothing(&mut self, materialise: impl FnOnce(&mut Self, &mut Vec<u64>) -> Result<()>) -> Result<()> {
        let mut created = Vec::new();
        let result = materialise(self, &mut created);
        if result.is_err() {
            for chunk in &created {
                self.chunks.remove(chunk);
            }
        }
        result
    }

    /// The bytes of a chunk that [`materialise`](Self::materialise) created.
    fn materialised(&mut self, chunk: u64) -> &mut [u8] {
        self.chunks.get_mut(&chunk).expect("stores go only to materialised chunks")
    }

    /// Stores `data` at `pa`, whose chunks were materialised.
    pub fn store(&mut self, pa: u64, data: &[u8]) {
        self.check(pa, data.len() as u64);
        let mut done = 0;
        for (chunk, offset, n) in pieces(pa, data.len() as u64) {
            self.materialised(chunk)[offset..offset + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Writes `data` at `pa`, creating the chunks it needs; on an out-of-memory error nothing
    /// changed.
    pub fn write(&mut self, pa: u64, data: &[u8]) -> Result<()> {
        self.all_or_nothing(|m, created| m.materialise(pa, data.len() as u64, created))?;
        self.store(pa, data);
        Ok(())
    }

    /// Sets `len` bytes at `pa` to zero; allocates nothing, and frees the chunks it covers whole.
    pub fn zero(&mut self, pa: u64, len: u64) {
        self.check(pa, len);
        // The partial chunks at either end are cleared; the whole ones in between dropped.
        let end = pa + len;
        let tail = (end & !(CHUNK - 1)).max(pa);
        let head = pieces(pa, len.min(CHUNK - (pa & (CHUNK - 1))));
        for (chunk, offset, n) in head.chain(pieces(tail, end - tail)) {
            if let Some(data) = self.chunks.get_mut(&chunk) {
                data[offset..offset + n].fill(0);
            }
        }
        self.discard(pa, len);
    }

    /// Sets `len` bytes at `pa` to `value`; unless `value` is 0, the chunks must have been
    /// materialised.
    pub fn set(&mut self, pa: u64, value: u8, len: u64) {
        if value == 0 {
            return self.zero(pa, len);
        }
        self.check(pa, len);
        for (chunk, offset, n) in pieces(pa, len) {
            self.materialised(chunk)[offset..offset + n].fill(value);
        }
    }

    /// Copies `len` bytes from `src` to `dst` as `memmove` does (the ranges may overlap). The
    /// destination chunks whose source is backed must have been materialised
    /// ([`materialise_for_copy`](Self::materialise_for_copy)); unwritten source bytes are
    /// copied by zeroing the destination, which allocates nothing. Fails (out of host memory)
    /// only if a chunk it stores into was not materialised and cannot be created, which a caller
    /// that materialised first never sees.
    pub fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.check(dst, len);
        self.check(src, len);
        let backward = dst > src && dst < src + len;
        // Destination bytes whose source is unwritten, gathered into one run so that zeroing
        // can free the chunks it covers whole. Deferring it is safe: in memmove order no later
        // piece reads what an earlier one wrote.
        let mut zeros: Option<(u64, u64)> = None;
        for (d, s, n) in copy_pieces(dst, src, len, backward) {
            let (dc, sc) = (d >> CHUNK_SHIFT, s >> CHUNK_SHIFT);
            let (doff, soff) = ((d & (CHUNK - 1)) as usize, (s & (CHUNK - 1)) as usize);
            if !self.chunks.contains_key(&sc) {
                zeros = match zeros {
                    Some((lo, hi)) if hi == d => Some((lo, d + n as u64)),
                    Some((lo, hi)) if lo == d + n as u64 => Some((d, hi)),
                    other => {
                        if let Some((lo, hi)) = other {
                            self.zero(lo, hi - lo);
                        }
                        Some((d, d + n as u64))
                    }
                };
                continue;
            }
            if dc == sc {
                self.materialised(dc).copy_within(soff..soff + n, doff);
                continue;
            }
            if !self.chunks.contains_key(&dc) {
                // The destination was not materialised because the source was unwritten when
                // the copy began: its bytes are still zero unless another mapping of the same
                // frames changed them meanwhile.
                if self.chunks[&sc][soff..soff + n].iter().all(|&b| b == 0) {
                    continue;
                }
                self.ensure(dc, &mut Vec::new())?;
            }
            // Two distinct chunks: through a small bounce buffer on the stack.
            let mut bounce = [0u8; 4096];
            for at in (0..n).step_by(bounce.len()) {
                let k = bounce.len().min(n - at);
                bounce[..k].copy_from_slice(&self.chunks[&sc][soff + at..soff + at + k]);
                self.materialised(dc)[doff + at..doff + at + k].copy_from_slice(&bounce[..k]);
            }
        }
        if let Some((lo, hi)) = zeros {
            self.zero(lo, hi - lo);
        }
        Ok(())
    }

    /// Drops the chunks wholly inside `[pa, pa + len)`: the memory was freed, its bytes are gone.
    pub fn discard(&mut self, pa: u64, len: u64) {
        let first = pa.div_ceil(CHUNK);
        let last = (pa + len) >> CHUNK_SHIFT;
        if last.saturating_sub(first) as usize > self.chunks.len() {
            self.chunks.retain(|&c, _| c < first || c >= last);
        } else {
            for c in first..last {
                self.chunks.remove(&c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lazy_round_trip_across_chunks() {
        let mut m = PhysMemory::new(1 << 30);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        m.write(CHUNK - 10, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        m.read(CHUNK - 10, &mut back);
        assert_eq!(back, data);
        assert_eq!(m.resident_bytes(), 5 * CHUNK);
        let mut far = [1u8; 16];
        m.read(1 << 29, &mut far);
        assert_eq!(far, [0; 16]);
        let mut created = Vec::new();
        m.materialise(CHUNK, 3, &mut created).unwrap();
        assert!(created.is_empty(), "the chunk was there already");
        m.set(CHUNK, 0xAB, 3);
        m.read(CHUNK, &mut far[..3]);
        assert_eq!(&far[..3], &[0xAB; 3]);
        m.discard(0, 1 << 30);
        assert_eq!(m.resident_bytes(), 0);
    }

    #[test]
    fn unwritten_memory_costs_nothing_to_read_zero_or_copy() {
        let mut m = PhysMemory::new(1 << 40);
        let mut out = vec![7u8; 1 << 20];
        m.read(1 << 39, &mut out);
        assert!(out.iter().all(|&b| b == 0));
        m.zero(0, 1 << 40);
        m.set(0, 0, 1 << 40);
        let mut created = Vec::new();
        m.materialise_for_copy(1 << 34, 0, 1 << 34, &mut created).unwrap();
        m.copy(1 << 34, 0, 1 << 34).unwrap();
        assert!(created.is_empty());
        assert_eq!(m.resident_bytes(), 0, "16 GiB of unwritten memory moved without a byte of host memory");
        // Copying unwritten memory over written memory zeroes it and frees the chunks it covers.
        m.write(0, &[9; 3 * CHUNK as usize]).unwrap();
        m.copy(10, 1 << 30, 2 * CHUNK).unwrap();
        assert_eq!(m.resident_bytes(), 2 * CHUNK, "the middle chunk was covered whole");
        let mut head = [0u8; 12];
        m.read(0, &mut head);
        assert_eq!(head, [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 0, 0]);
    }

    #[test]
    fn a_failed_materialisation_leaves_nothing_behind() {
        let mut m = PhysMemory::new(1 << 30);
        m.write(0, &[1; 10]).unwrap();
        let err = m.all_or_nothing(|m, created| {
            m.materialise(0, 4 * CHUNK, created)?;
            assert_eq!(created, &[1, 2, 3]);
            Err(host_exhausted())
        });
        assert_eq!(err.unwrap_err().code, crate::ErrorCode::RtMemoryAllocation);
        assert_eq!(m.resident_bytes(), CHUNK);
        let mut back = [0u8; 10];
        m.read(0, &mut back);
        assert_eq!(back, [1; 10]);
    }

    /// One operation of the property test: (kind, dst, src or value, length).
    fn op() -> impl Strategy<Value = (u8, u64, u64, u64)> {
        (0u8..4, 0u64..6 * CHUNK, 0u64..6 * CHUNK, 0u64..2 * CHUNK + 17)
    }

    proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Against a flat byte array: every write, fill (zero or not) and overlapping copy
        /// leaves the same bytes; every chunk holding a non-zero byte exists, and only chunks
        /// a write, a non-zero fill or a copy stored into ever do.
        #[test]
        fn matches_a_flat_array(ops in prop::collection::vec(op(), 1..40)) {
            const SIZE: u64 = 8 * CHUNK;
            let mut m = PhysMemory::new(SIZE);
            let mut model = vec![0u8; SIZE as usize];
            let mut stored = std::collections::HashSet::new();
            for (i, (kind, dst, other, len)) in ops.into_iter().enumerate() {
                let len = len.min(SIZE - dst).min(SIZE - other);
                let (d, o, n) = (dst as usize, other as usize, len as usize);
                if kind != 1 {
                    stored.extend(pieces(dst, len).map(|(c, _, _)| c));
                }
                match kind {
                    0 => {
                        let data: Vec<u8> = (0..n).map(|k| (k + i) as u8 | 1).collect();
                        m.write(dst, &data).unwrap();
                        model[d..d + n].copy_from_slice(&data);
                    }
                    1 | 2 => {
                        let value = if kind == 1 { 0 } else { other as u8 | 1 };
                        let mut created = Vec::new();
                        if value != 0 {
                            m.materialise(dst, len, &mut created).unwrap();
                        }
                        m.set(dst, value, len);
                        model[d..d + n].fill(value);
                    }
                    _ => {
                        let mut created = Vec::new();
                        m.materialise_for_copy(dst, other, len, &mut created).unwrap();
                        m.copy(dst, other, len).unwrap();
                        model.copy_within(o..o + n, d);
                    }
                }
                let mut all = vec![0u8; SIZE as usize];
                m.read(0, &mut all);
                prop_assert_eq!(&all, &model);
                // A chunk holding a non-zero byte must exist; an all-zero one need not.
                for c in 0..SIZE / CHUNK {
                    let nonzero = model[(c * CHUNK) as usize..((c + 1) * CHUNK) as usize].iter().any(|&b| b != 0);
                    prop_assert!(!nonzero || m.chunks.contains_key(&c));
                }
                prop_assert!(m.chunks.keys().all(|c| stored.contains(c)));
            }
        }
    }
}
