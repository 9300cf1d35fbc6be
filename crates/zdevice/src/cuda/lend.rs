//! Lending page-locked host memory to the caller as a mutable `f32` slice
//! (`Driver::host_lend_f32`), so a batch is written where the DMA reads it, with no staging
//! copy. An allocation lent out is marked: every other host access to it (`host_read`,
//! `host_write`, host copies, `mem_free_host`) is refused until the loan ends, so the slice is
//! the only way to its bytes while it lives.

use crate::driver::{DriverError, DriverResult};
use crate::types::HostPtr;

use super::CudaDriver;

impl CudaDriver {
    /// The base of the live page-locked allocation holding `ptr`, if any.
    fn host_base(map: &std::collections::BTreeMap<u64, usize>, ptr: HostPtr) -> Option<u64> {
        map.range(..=ptr.0).next_back().map(|(&base, _)| base)
    }

    fn lent(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.lent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `Err` naming `call` when the allocation holding `ptr` is lent out right now (lock
    /// order: the host map, then the lent set).
    pub(super) fn refuse_lent(
        &self,
        map: &std::collections::BTreeMap<u64, usize>,
        call: &'static str,
        ptr: HostPtr,
    ) -> DriverResult<()> {
        match Self::host_base(map, ptr) {
            Some(base) if self.lent().contains(&base) => Err(DriverError::InvalidArgument {
                call,
                reason: format!(
                    "the page-locked allocation at {base:#x} is lent out (host_lend_f32) until its loan ends"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// `Driver::host_lend_f32`.
    pub(super) fn lend_f32(
        &self,
        ptr: HostPtr,
        words: usize,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> DriverResult<()> {
        const CALL: &str = "host_lend_f32";
        let bytes = words
            .checked_mul(4)
            .ok_or_else(|| DriverError::InvalidArgument {
                call: CALL,
                reason: format!("{words} f32 overflow a size"),
            })?;
        let (base, start) = {
            let map = self.host_map();
            let start = Self::host_range(&map, CALL, ptr, bytes)?;
            if !ptr.0.is_multiple_of(align_of::<f32>() as u64) {
                return Err(DriverError::InvalidArgument {
                    call: CALL,
                    reason: format!("{:#x} is not aligned for f32", ptr.0),
                });
            }
            self.refuse_lent(&map, CALL, ptr)?;
            let base = Self::host_base(&map, ptr).unwrap_or(ptr.0);
            self.lent().insert(base);
            (base, start)
        };
        // The loan ends when this guard drops, even if `f` unwinds.
        struct Loan<'a>(&'a CudaDriver, u64);
        impl Drop for Loan<'_> {
            fn drop(&mut self) {
                self.0.lent().remove(&self.1);
            }
        }
        let _loan = Loan(self, base);
        if words == 0 {
            f(&mut []);
            return Ok(());
        }
        // SAFETY: `start..start + 4 * words` lies inside one live page-locked allocation
        // (checked above) and `start` is aligned for f32; every bit pattern is a valid f32.
        // The allocation is marked lent until `_loan` drops, so no other host access of this
        // driver reads, writes or frees it while the slice lives, and the slice does not
        // outlive this call. The caller keeps transfers off the range meanwhile (the method's
        // contract; `Device::pinned_f32_mut` waits for the last one first).
        let view = unsafe { std::slice::from_raw_parts_mut(start.cast::<f32>(), words) };
        f(view);
        Ok(())
    }
}
