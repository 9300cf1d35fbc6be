//! Device memory: allocations with generation-stamped addresses, capacity accounting,
//! stream-ordered pools, poison, and page-locked host memory.
//!
//! A device address is `generation << 48 | offset`. Offsets are handed out first-fit, so a freed
//! range is soon reissued; the generation then differs, and a pointer kept from the old
//! allocation resolves as stale instead of silently reaching the new owner's bytes.

use std::collections::{BTreeMap, HashMap};

use super::access::KernelFault;
use super::storage::Storage;
use crate::types::{DevicePtr, HostPtr};

/// Allocation granularity and alignment, as cudaMalloc guarantees.
pub(crate) const ALIGN: u64 = 256;
const GEN_SHIFT: u32 = 48;
const OFFSET_MASK: u64 = (1 << GEN_SHIFT) - 1;
/// First device offset: small integers and null never resolve.
const BASE: u64 = 0x1_0000_0000;
/// Host pinned addresses live far from device offsets so the two are never confused.
const HOST_BASE: u64 = 0x7f00_0000_0000;
const HOST_ALIGN: u64 = 4096;
/// The byte freed (and fresh, never-written) memory reads as: 0xFFFFFFFF is a float32 NaN.
pub(crate) const POISON: u8 = 0xFF;

/// Who owns an allocation's bytes and how its release is accounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocKind {
    Device,
    Managed,
    /// From a stream-ordered pool (the pool's reservation carries the capacity).
    Pool(u64),
    /// A graph's memory node: lives until the graph and every executable made from it are gone.
    Graph,
}

#[derive(Debug)]
pub(crate) struct Alloc {
    pub size: u64,
    pub span: u64,
    pub generation: u16,
    pub kind: AllocKind,
    pub data: Storage,
    /// A stream-ordered free has been queued; a second free is an error.
    pub free_pending: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub reserved: u64,
    pub used: u64,
    pub threshold: u64,
    pub max_size: u64,
    pub live: u64,
    pub destroyed: bool,
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocError {
    /// Zero bytes, an unknown pool, or a size that overflows.
    Invalid,
    /// Not enough free capacity now (or ever).
    OutOfMemory,
}

/// The default pool of `cuMemAllocAsync`.
pub(crate) const DEFAULT_POOL: u64 = 0;

#[derive(Debug)]
pub(crate) struct Memory {
    allocs: BTreeMap<u64, Alloc>,
    next_generation: u16,
    pub capacity: u64,
    /// Bytes counted against capacity: live device/managed/graph spans plus pool reservations.
    pub used: u64,
    pub poison: bool,
    pub pools: HashMap<u64, Pool>,
    /// Page-locked host memory: (size, bytes), stored lazily like device memory so that a huge
    /// request costs nothing until written.
    host: BTreeMap<u64, (u64, Storage)>,
    next_host: u64,
}

/// `bytes` rounded up to the allocation granularity, or None on overflow.
pub(crate) fn round_up(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(ALIGN)
}

impl Memory {
    pub(crate) fn new(capacity: u64, poison: bool) -> Self {
        let mut pools = HashMap::new();
        pools.insert(DEFAULT_POOL, Pool::default());
        Memory {
            allocs: BTreeMap::new(),
            next_generation: 1,
            capacity,
            used: 0,
            poison,
            pools,
            host: BTreeMap::new(),
            next_host: HOST_BASE,
        }
    }

    fn fresh_fill(&self) -> u8 {
        if self.poison { POISON } else { 0 }
    }

    /// Allocates `bytes` of `kind`, counting them against capacity (or the pool's reservation).
    pub(crate) fn alloc(&mut self, bytes: u64, kind: AllocKind) -> Result<DevicePtr, AllocError> {
        if bytes == 0 {
            return Err(AllocError::Invalid);
        }
        let span = round_up(bytes).ok_or(AllocError::Invalid)?;
        match kind {
            AllocKind::Pool(id) => self.pool_take(id, span)?,
            _ => {
                if span > self.capacity.saturating_sub(self.used) {
                    return Err(AllocError::OutOfMemory);
                }
                self.used += span;
            }
        }
        let base = self.first_fit(span);
        let generation = self.next_generation;
        self.next_generation = self.next_generation.checked_add(1).unwrap_or(1);
        let data = Storage::new(self.fresh_fill());
        self.allocs.insert(
            base,
            Alloc {
                size: bytes,
                span,
                generation,
                kind,
                data,
                free_pending: false,
            },
        );
        Ok(DevicePtr((u64::from(generation) << GEN_SHIFT) | base))
    }

    /// Lowest offset with `span` free bytes. The offset space (2^48) is far larger than any
    /// capacity, so a gap always exists at the end.
    fn first_fit(&self, span: u64) -> u64 {
        let mut cursor = BASE;
        for (&base, a) in &self.allocs {
            if base.saturating_sub(cursor) >= span {
                return cursor;
            }
            cursor = cursor.max(base + a.span);
        }
        cursor
    }

    fn pool_take(&mut self, id: u64, span: u64) -> Result<(), AllocError> {
        let pool = self
            .pools
            .get_mut(&id)
            .filter(|p| !p.destroyed)
            .ok_or(AllocError::Invalid)?;
        let idle = pool.reserved - pool.used;
        if idle < span {
            let need = span - idle;
            let over_max = pool.max_size != 0 && pool.reserved.saturating_add(need) > pool.max_size;
            if over_max || need > self.capacity.saturating_sub(self.used) {
                return Err(AllocError::OutOfMemory);
            }
            pool.reserved += need;
            self.used += need;
        }
        pool.used += span;
        pool.live += 1;
        Ok(())
    }

    /// Releases a pool's idle reservation above `keep` bytes (never below what is in use).
    pub(crate) fn pool_trim(&mut self, id: u64, keep: u64) {
        if let Some(pool) = self.pools.get_mut(&id) {
            let keep = keep.max(pool.used);
            if pool.reserved > keep {
                self.used -= pool.reserved - keep;
                pool.reserved = keep;
            }
            if pool.destroyed && pool.live == 0 {
                self.pools.remove(&id);
            }
        }
    }

    /// The live allocation whose base is exactly `ptr` (with a matching generation).
    pub(crate) fn find_base(&self, ptr: DevicePtr) -> Option<(u64, &Alloc)> {
        let base = ptr.0 & OFFSET_MASK;
        let a = self.allocs.get(&base)?;
        (u64::from(a.generation) == ptr.0 >> GEN_SHIFT).then_some((base, a))
    }

    pub(crate) fn alloc_mut(&mut self, base: u64) -> Option<&mut Alloc> {
        self.allocs.get_mut(&base)
    }

    /// Releases the allocation at offset `base`: its capacity returns (or its pool span, subject
    /// to the pool's release threshold) and its storage is dropped. With poisoning on, the range's
    /// next owner reads 0xFF, which is what overwriting the freed bytes would leave there.
    pub(crate) fn release(&mut self, base: u64) {
        let Some(a) = self.allocs.remove(&base) else {
            return;
        };
        match a.kind {
            AllocKind::Pool(id) => {
                if let Some(pool) = self.pools.get_mut(&id) {
                    pool.used -= a.span;
                    pool.live -= 1;
                    let threshold = if pool.destroyed { 0 } else { pool.threshold };
                    self.pool_trim(id, threshold);
                }
            }
            _ => self.used -= a.span,
        }
    }

    /// Overwrites an allocation with poison (graph memory nodes, whose address is fixed).
    pub(crate) fn poison_alloc(&mut self, base: u64) {
        let fill = self.fresh_fill();
        if let Some(a) = self.allocs.get_mut(&base) {
            a.data.reset(fill);
        }
    }

    /// Resolves `len` bytes at `ptr` to (allocation offset, offset within it), checking that the
    /// range lies inside one live allocation of the pointer's generation.
    pub(crate) fn resolve(&self, ptr: DevicePtr, len: u64) -> Result<(u64, usize), KernelFault> {
        let off = ptr.0 & OFFSET_MASK;
        let generation = (ptr.0 >> GEN_SHIFT) as u16;
        let (base, a) = self
            .allocs
            .range(..=off)
            .next_back()
            .filter(|(b, a)| off < *b + a.span)
            .ok_or(KernelFault::Unmapped { ptr })?;
        if a.generation != generation {
            return Err(KernelFault::Stale {
                ptr,
                found: generation,
                live: a.generation,
            });
        }
        let within = off - base;
        if within.checked_add(len).is_none_or(|end| end > a.size) {
            return Err(KernelFault::OutOfBounds {
                ptr,
                len,
                size: a.size,
            });
        }
        let within = usize::try_from(within).map_err(|_| KernelFault::Unmapped { ptr })?;
        Ok((*base, within))
    }

    pub(crate) fn read(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, KernelFault> {
        if let Some(host) = Self::mapped_host(ptr) {
            return self
                .host_read(host, len)
                .ok_or(KernelFault::Unmapped { ptr });
        }
        let (base, off) = self.resolve(ptr, len)?;
        let len = usize::try_from(len).map_err(|_| KernelFault::Unmapped { ptr })?;
        let mut out = vec![0u8; len];
        if let Some(a) = self.allocs.get(&base) {
            a.data.read(off, &mut out);
        }
        Ok(out)
    }

    pub(crate) fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), KernelFault> {
        if let Some(host) = Self::mapped_host(ptr) {
            return self
                .host_write(host, data)
                .ok_or(KernelFault::Unmapped { ptr });
        }
        let (base, off) = self.resolve(ptr, data.len() as u64)?;
        if let Some(a) = self.allocs.get_mut(&base) {
            a.data.write(off, data);
        }
        Ok(())
    }

    /// Writes `len` bytes at `ptr`, repeating `pattern` (memsets).
    pub(crate) fn fill(
        &mut self,
        ptr: DevicePtr,
        len: u64,
        pattern: &[u8],
    ) -> Result<(), KernelFault> {
        let (base, off) = self.resolve(ptr, len)?;
        let len = usize::try_from(len).map_err(|_| KernelFault::Unmapped { ptr })?;
        if let Some(a) = self.allocs.get_mut(&base) {
            a.data.fill_pattern(off, len, pattern);
        }
        Ok(())
    }

    /// Every live allocation as (address, requested bytes, span), in address order.
    pub(crate) fn live(&self) -> Vec<(DevicePtr, u64, u64)> {
        self.allocs
            .iter()
            .map(|(b, a)| {
                (
                    DevicePtr((u64::from(a.generation) << GEN_SHIFT) | b),
                    a.size,
                    a.span,
                )
            })
            .collect()
    }

    // --- page-locked host memory -----------------------------------------------------------

    /// Allocates host memory. Addresses are never reused, so a freed pointer never resolves.
    pub(crate) fn alloc_host(&mut self, bytes: u64) -> Result<HostPtr, AllocError> {
        if bytes == 0 {
            return Err(AllocError::Invalid);
        }
        usize::try_from(bytes).map_err(|_| AllocError::OutOfMemory)?;
        let step = bytes
            .checked_next_multiple_of(HOST_ALIGN)
            .ok_or(AllocError::Invalid)?;
        let base = self.next_host;
        self.next_host = base
            .checked_add(step + HOST_ALIGN)
            .ok_or(AllocError::OutOfMemory)?;
        self.host.insert(base, (bytes, Storage::new(0)));
        Ok(HostPtr(base))
    }

    pub(crate) fn free_host(&mut self, ptr: HostPtr) -> bool {
        self.host.remove(&ptr.0).is_some()
    }

    fn host_range(&self, ptr: u64, len: u64) -> Option<(u64, usize)> {
        let (base, (size, _)) = self.host.range(..=ptr).next_back()?;
        let within = ptr - base;
        let end = within.checked_add(len)?;
        (end <= *size).then_some((*base, usize::try_from(within).ok()?))
    }

    /// Page-locked host memory as kernels address it (`Driver::host_device_ptr`): as with
    /// unified addressing on a GPU, at its host address, which lies above every device offset.
    fn mapped_host(ptr: DevicePtr) -> Option<HostPtr> {
        (HOST_BASE..=OFFSET_MASK)
            .contains(&ptr.0)
            .then_some(HostPtr(ptr.0))
    }

    /// `Driver::host_device_ptr`: the address kernels reach `ptr` through, when it lies in
    /// live page-locked memory.
    pub(crate) fn host_device_ptr(&self, ptr: HostPtr) -> Option<DevicePtr> {
        self.host_range(ptr.0, 1).map(|_| DevicePtr(ptr.0))
    }

    pub(crate) fn host_valid(&self, ptr: HostPtr, len: u64) -> bool {
        self.host_range(ptr.0, len).is_some()
    }

    pub(crate) fn host_read(&self, ptr: HostPtr, len: u64) -> Option<Vec<u8>> {
        let (base, off) = self.host_range(ptr.0, len)?;
        let mut out = vec![0u8; usize::try_from(len).ok()?];
        self.host.get(&base)?.1.read(off, &mut out);
        Some(out)
    }

    pub(crate) fn host_write(&mut self, ptr: HostPtr, data: &[u8]) -> Option<()> {
        let (base, off) = self.host_range(ptr.0, data.len() as u64)?;
        self.host.get_mut(&base)?.1.write(off, data);
        Some(())
    }
}
