//! `PhysMemory`: the bytes of simulated HBM, indexed by physical address.
//!
//! Storage is lazy: memory is kept in 64 KiB chunks that come into being on first write, so a
//! 64 GiB device costs only what is written to it. Bytes never written read as zero (real device
//! memory is uninitialised; zero is one valid value of it).
//!
//! Invariants: a chunk exists only if some byte of it was written since it was last discarded;
//! reads and writes at any address below the capacity succeed; callers (the backend) check bounds
//! against the frames they own, so this type only guards against addresses past the capacity.

use std::collections::HashMap;

const CHUNK_SHIFT: u32 = 16;
const CHUNK: u64 = 1 << CHUNK_SHIFT;

#[derive(Debug, Default)]
pub struct PhysMemory {
    capacity: u64,
    chunks: HashMap<u64, Box<[u8]>>,
}

impl PhysMemory {
    pub fn new(capacity: u64) -> Self {
        PhysMemory { capacity, chunks: HashMap::new() }
    }

    /// Host bytes currently backing the simulated memory.
    pub fn resident_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK
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

    fn check(&self, pa: u64, len: usize) {
        assert!(
            pa.checked_add(len as u64).is_some_and(|e| e <= self.capacity),
            "physical access {pa:#x}+{len} past the capacity {:#x}",
            self.capacity
        );
    }

    pub fn read(&self, pa: u64, out: &mut [u8]) {
        self.check(pa, out.len());
        let mut done = 0;
        for (chunk, offset, n) in Self::pieces(pa, out.len() as u64) {
            let dst = &mut out[done..done + n];
            match self.chunks.get(&chunk) {
                Some(data) => dst.copy_from_slice(&data[offset..offset + n]),
                None => dst.fill(0),
            }
            done += n;
        }
    }

    fn chunk_mut(&mut self, chunk: u64) -> &mut [u8] {
        self.chunks.entry(chunk).or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice())
    }

    pub fn write(&mut self, pa: u64, data: &[u8]) {
        self.check(pa, data.len());
        let mut done = 0;
        for (chunk, offset, n) in Self::pieces(pa, data.len() as u64) {
            self.chunk_mut(chunk)[offset..offset + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    pub fn fill(&mut self, pa: u64, value: u8, len: u64) {
        self.check(pa, len as usize);
        for (chunk, offset, n) in Self::pieces(pa, len) {
            if value == 0 && !self.chunks.contains_key(&chunk) {
                continue; // absent chunks already read as zero
            }
            self.chunk_mut(chunk)[offset..offset + n].fill(value);
        }
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

    #[test]
    fn lazy_round_trip_across_chunks() {
        let mut m = PhysMemory::new(1 << 30);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        m.write(CHUNK - 10, &data);
        let mut back = vec![0u8; data.len()];
        m.read(CHUNK - 10, &mut back);
        assert_eq!(back, data);
        assert_eq!(m.resident_bytes(), 5 * CHUNK);
        let mut far = [1u8; 16];
        m.read(1 << 29, &mut far);
        assert_eq!(far, [0; 16]);
        m.fill(CHUNK, 0xAB, 3);
        m.read(CHUNK, &mut far[..3]);
        assert_eq!(&far[..3], &[0xAB; 3]);
        m.discard(0, 1 << 30);
        assert_eq!(m.resident_bytes(), 0);
    }
}
