//! Byte access on the device: where an address lives (device allocation, `malloc_host` block,
//! or nowhere), AscendCL's copy and memset rules, synchronous transfers and their cost on the
//! host clock, and the sanitizer's host-access hooks.
//!
//! Invariant: no byte is read or written outside a live allocation's requested size or a live
//! host block; every refused access is also a sanitizer finding.

use super::*;

impl Device {
    /// Classifies `[addr, addr + len)` and checks that it lies wholly in one live allocation.
    pub(super) fn side(&mut self, addr: u64, len: u64, role: &str) -> Result<Side> {
        self.classify(addr, len, role).map_err(|(error, kind)| {
            if let Some(kind) = kind {
                let finding = Finding {
                    kind,
                    message: error.message.clone(),
                    addr,
                    size: len,
                    allocation: None,
                    streams: vec![],
                    tag: None,
                };
                let _ = self.sanitizer.report(finding, false);
            }
            error
        })
    }

    /// Where `[addr, addr + len)` lives, or the error (and the sanitizer finding it makes).
    pub(super) fn classify(
        &mut self,
        addr: u64,
        len: u64,
        role: &str,
    ) -> std::result::Result<Side, (AclError, Option<FindingKind>)> {
        if addr == 0 {
            return Err((AclError::invalid_param(format!("{role} is NULL")), None));
        }
        if self.backend.owns(addr) {
            let a = self.live.containing(addr, |a| a.size);
            let Some(a) = a else {
                if self.user_vmm.mapped(addr) {
                    return match self.user_vmm.mapping_of(addr, len) {
                        Some(_) => Ok(Side::Device),
                        None => Err((
                            AclError::rt_param(format!(
                                "{len} bytes at {role} {addr:#x} run past the end of its map_mem mapping"
                            )),
                            Some(FindingKind::OutOfBounds),
                        )),
                    };
                }
                let (why, kind) = if self.containing(addr).is_some() {
                    ("lies in the padding past the requested size of an allocation", FindingKind::OutOfBounds)
                } else {
                    (
                        "is not inside a live device allocation (freed already? use after free)",
                        FindingKind::UseAfterFree,
                    )
                };
                return Err((AclError::rt_param(format!("{role} {addr:#x} {why}")), Some(kind)));
            };
            let end = a.ptr + a.size;
            if addr.checked_add(len).is_none_or(|e| e > end) {
                let error = AclError::rt_param(format!(
                    "{len} bytes at {role} {addr:#x} run {} bytes past the end of the allocation at {:#x} \
                     ({} bytes); copy less or allocate more",
                    addr.saturating_add(len) - end,
                    a.ptr,
                    a.size
                ));
                return Err((error, Some(FindingKind::OutOfBounds)));
            }
            return Ok(Side::Device);
        }
        if self.host.contains(addr) {
            self.host
                .check(addr, len)
                .map_err(|e| (AclError::rt_param(format!("{role}: {}", e.message)), Some(FindingKind::OutOfBounds)))?;
            return Ok(Side::Host);
        }
        Err((
            AclError::rt_param(format!(
                "{role} {addr:#x} is neither a device address nor host memory from malloc_host; pass \
                 Python data with write()/read(), or copy it into a malloc_host buffer first"
            )),
            None,
        ))
    }

    /// The start of the (device or host) allocation holding `addr`, for the sanitizer.
    pub(super) fn base_of(&mut self, addr: u64) -> u64 {
        self.containing(addr)
            .map(|a| a.ptr)
            .or_else(|| self.user_vmm.mapping_of(addr, 1))
            .or_else(|| self.host.block_start(addr))
            .unwrap_or(addr)
    }

    /// The sanitizer's view of accesses `(addr, len, write)`: each inside the allocation holding it.
    fn touches(&mut self, accesses: &[(u64, u64, bool)]) -> Vec<Touch> {
        accesses
            .iter()
            .filter(|&&(_, len, _)| len > 0)
            .map(|&(addr, len, write)| Touch { base: self.base_of(addr), lo: addr, hi: addr + len, write })
            .collect()
    }

    /// Tells the sanitizer about one host operation making `accesses` (`(addr, len, write)`).
    /// The host's own accesses need no record: every later operation follows them.
    pub(super) fn host_op(&mut self, accesses: &[(u64, u64, bool)]) -> Result<()> {
        if !self.sanitizer.enabled() {
            return Ok(());
        }
        let touches = self.touches(accesses);
        if touches.is_empty() {
            return Ok(());
        }
        let epoch = self.sched.host_tick();
        let host = self.sched.host_clock();
        self.sanitizer.operation(HOST, epoch, host, host, &touches, &self.tags)
    }

    /// Tells the sanitizer about the next operation on `stream`, whose clock is `clock` (from
    /// `Scheduler::next_clock`), making `accesses`.
    pub(super) fn stream_op(&mut self, stream: StreamId, clock: &Clock, accesses: &[(u64, u64, bool)]) -> Result<()> {
        if !self.sanitizer.enabled() {
            return Ok(());
        }
        let touches = self.touches(accesses);
        if touches.is_empty() {
            return Ok(());
        }
        let epoch = clock.get(&stream).copied().unwrap_or(0);
        self.sanitizer.operation(stream, epoch, clock, self.sched.host_clock(), &touches, &self.tags)
    }

    /// Checks that `[ptr, ptr + len)` may be read or written (device or `malloc_host` memory),
    /// without touching it: the check `read`/`write` make first, for callers that must size a
    /// buffer before they copy.
    pub fn check_range(&mut self, ptr: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.side(ptr, len, "address").map(|_| ())
    }

    /// Checks a copy the way `aclrtMemcpy` does and classifies both ends; `None` for a no-op.
    pub(super) fn check_copy(
        &mut self,
        dst: u64,
        dst_max: u64,
        src: u64,
        count: u64,
        kind: u32,
    ) -> Result<Option<(Side, Side)>> {
        let kind = MemcpyKind::from_raw(kind)?;
        if matches!(kind, MemcpyKind::InnerDeviceToDevice | MemcpyKind::InterDeviceToDevice) {
            return Err(AclError::invalid_param(format!(
                "{} is not accepted by aclrtMemcpy (the runtime takes kinds 0-5); use ACL_MEMCPY_DEFAULT",
                kind.name()
            )));
        }
        if count == 0 {
            return Ok(None);
        }
        if count > dst_max {
            return Err(AclError::rt_param(format!(
                "count {count} is larger than dst_max {dst_max}; the copy would overflow the destination"
            )));
        }
        let dst_side = self.side(dst, count, "destination")?;
        let src_side = self.side(src, count, "source")?;
        if let Some(named) = kind.direction() {
            let actual = (src_side == Side::Device, dst_side == Side::Device);
            if named != actual {
                self.stats.kind_mismatches += 1;
                let side = |device: bool| if device { "device" } else { "host" };
                let message = format!(
                    "{} copies {} to {}, but the addresses say {} to {} (the runtime ignores the kind)",
                    kind.name(),
                    side(named.0),
                    side(named.1),
                    side(actual.0),
                    side(actual.1)
                );
                let finding = Finding {
                    kind: FindingKind::KindMismatch,
                    message,
                    addr: dst,
                    size: count,
                    allocation: None,
                    streams: vec![],
                    tag: None,
                };
                self.sanitizer.report(finding, false)?;
            }
        }
        Ok((dst != src).then_some((dst_side, src_side)))
    }

    /// Moves `count` bytes between checked ranges.
    pub(super) fn move_bytes(&mut self, dst: u64, dst_side: Side, src: u64, src_side: Side, count: u64) -> Result<()> {
        match (src_side, dst_side) {
            (Side::Host, Side::Host) => self.host.copy(dst, src, count),
            (Side::Host, Side::Device) => {
                let data = self.host.slice(src, count)?;
                self.backend.write(dst, data)
            }
            (Side::Device, Side::Host) => {
                let out = self.host.slice_mut(dst, count)?;
                self.backend.read(src, out)
            }
            (Side::Device, Side::Device) => self.backend.copy(dst, src, count),
        }
    }

    pub(super) fn fill_bytes(&mut self, ptr: u64, side: Side, byte: u8, count: u64) -> Result<()> {
        match side {
            Side::Host => {
                self.host.slice_mut(ptr, count)?.fill(byte);
                Ok(())
            }
            Side::Device => self.backend.fill(ptr, byte, count),
        }
    }

    /// `aclrtMemcpy`: copies `count` bytes now, against the memory as it is on the host clock
    /// (no implicit synchronisation); the direction comes from the addresses, `kind` is validated
    /// but advisory.
    pub fn memcpy(&mut self, dst: u64, dst_max: u64, src: u64, count: u64, kind: u32) -> Result<()> {
        self.settle();
        let Some((dst_side, src_side)) = self.check_copy(dst, dst_max, src, count, kind)? else {
            return Ok(());
        };
        self.host_op(&[(src, count, false), (dst, count, true)])?;
        self.move_bytes(dst, dst_side, src, src_side, count)?;
        let ns = self.sched.cost.copy_ns(count, src_side == Side::Device, dst_side == Side::Device, true);
        self.sched.advance(ns);
        Ok(())
    }

    /// `aclrtMemset`: sets `count` bytes at `ptr` (device or host) to the low byte of `value`.
    pub fn memset(&mut self, ptr: u64, dst_max: u64, value: i32, count: u64) -> Result<()> {
        self.settle();
        if count == 0 {
            return Ok(());
        }
        if count > dst_max {
            return Err(AclError::rt_param(format!(
                "count {count} is larger than dst_max {dst_max}; the memset would overflow the destination"
            )));
        }
        let side = self.side(ptr, count, "destination")?;
        self.host_op(&[(ptr, count, true)])?;
        self.fill_bytes(ptr, side, value as u8, count)?;
        self.sched.advance(self.sched.cost.fill_ns(count));
        Ok(())
    }

    /// Writes `data` at `ptr` (device or `malloc_host` memory): a synchronous copy from pageable
    /// host memory, which costs the host its transfer time.
    pub fn write(&mut self, ptr: u64, data: &[u8]) -> Result<()> {
        self.settle();
        if data.is_empty() {
            return Ok(());
        }
        let count = data.len() as u64;
        let side = self.side(ptr, count, "destination")?;
        self.host_op(&[(ptr, count, true)])?;
        match side {
            Side::Host => self.host.slice_mut(ptr, count)?.copy_from_slice(data),
            Side::Device => {
                self.backend.write(ptr, data)?;
                self.sched.advance(self.sched.cost.copy_ns(count, false, true, false));
            }
        }
        Ok(())
    }

    /// An async copy from pageable host memory (`data`) to device memory on `stream`: as in the
    /// real runtime it is synchronous, returning once the copy, queued behind the stream's work,
    /// has completed. Returns (start, end) on the device clock.
    pub fn write_on(&mut self, ptr: u64, data: &[u8], stream: StreamId) -> Result<(u64, u64)> {
        self.settle();
        let count = data.len() as u64;
        if count > 0 && self.side(ptr, count, "destination")? == Side::Host {
            return Err(AclError::rt_param("write with a stream targets device memory; this is host memory"));
        }
        self.sched.tail_ns(stream)?;
        let ns = self.sched.cost.copy_ns(count, false, true, false);
        self.sched.plan_enqueue(stream, ns, "copy H2D (pageable)")?;
        // A pageable copy on a stream runs after the stream's queued work: on a runtime with a
        // queue, the host waits for it first.
        self.rt_synchronize_stream(stream)?;
        let clock = self.sched.next_clock(stream);
        self.stream_op(stream, &clock, &[(ptr, count, true)])?;
        let span = self.sched.enqueue(stream, ns, "copy H2D (pageable)", count, None)?;
        self.sched.wait_for(stream, span.1);
        self.settle();
        if count > 0 {
            self.backend.write(ptr, data)?;
        }
        Ok(span)
    }

    /// An async copy from device memory to pageable host memory on `stream`: synchronous, like
    /// `write_on`, and ordered after the stream's queued work.
    pub fn read_on(&mut self, ptr: u64, out: &mut [u8], stream: StreamId) -> Result<(u64, u64)> {
        self.settle();
        let count = out.len() as u64;
        if count > 0 && self.side(ptr, count, "source")? == Side::Host {
            return Err(AclError::rt_param("read with a stream reads device memory; this is host memory"));
        }
        self.sched.tail_ns(stream)?;
        let ns = self.sched.cost.copy_ns(count, true, false, false);
        self.sched.plan_enqueue(stream, ns, "copy D2H (pageable)")?;
        self.rt_synchronize_stream(stream)?;
        let clock = self.sched.next_clock(stream);
        self.stream_op(stream, &clock, &[(ptr, count, false)])?;
        let span = self.sched.enqueue(stream, ns, "copy D2H (pageable)", count, None)?;
        self.sched.wait_for(stream, span.1);
        self.settle();
        if count > 0 {
            self.backend.read(ptr, out)?;
        }
        Ok(span)
    }

    /// Reads `out.len()` bytes at `ptr` (device or `malloc_host` memory) into pageable memory.
    pub fn read(&mut self, ptr: u64, out: &mut [u8]) -> Result<()> {
        self.settle();
        if out.is_empty() {
            return Ok(());
        }
        let count = out.len() as u64;
        let side = self.side(ptr, count, "source")?;
        self.host_op(&[(ptr, count, false)])?;
        match side {
            Side::Host => out.copy_from_slice(self.host.slice(ptr, count)?),
            Side::Device => {
                self.backend.read(ptr, out)?;
                self.sched.advance(self.sched.cost.copy_ns(count, true, false, false));
            }
        }
        Ok(())
    }
}
