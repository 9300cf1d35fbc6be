//! Packing kernel arguments the way `cuLaunchKernel` reads them: an array of pointers, each to
//! one parameter's value.

use std::ffi::c_void;

use crate::types::KernelArg;

/// Owned argument storage: one 8-byte-aligned slot per parameter (every [`KernelArg`] fits in 8
/// bytes), and the pointer array handed to the driver. The driver copies the values during the
/// launch call, so the slots only need to outlive that call.
#[derive(Debug)]
pub(crate) struct ArgSlots {
    slots: Vec<u64>,
}

impl ArgSlots {
    /// Stores each argument's bytes, in native byte order, at the start of its own slot.
    pub(crate) fn new(args: &[KernelArg]) -> ArgSlots {
        let slots = args.iter().map(|a| slot(*a)).collect();
        ArgSlots { slots }
    }

    /// The pointer array for `kernelParams`. Borrowing `self` mutably keeps the slots from moving
    /// while the pointers are in use.
    pub(crate) fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| std::ptr::from_mut(s).cast::<c_void>())
            .collect()
    }

    /// The raw slots (for tests).
    #[cfg(test)]
    pub(crate) fn slots(&self) -> &[u64] {
        &self.slots
    }
}

fn slot(arg: KernelArg) -> u64 {
    let mut bytes = [0u8; 8];
    match arg {
        KernelArg::Ptr(p) => bytes = p.0.to_ne_bytes(),
        KernelArg::U64(v) => bytes = v.to_ne_bytes(),
        KernelArg::I64(v) => bytes = v.to_ne_bytes(),
        KernelArg::F64(v) => bytes = v.to_ne_bytes(),
        KernelArg::U32(v) => bytes[..4].copy_from_slice(&v.to_ne_bytes()),
        KernelArg::I32(v) => bytes[..4].copy_from_slice(&v.to_ne_bytes()),
        KernelArg::F32(v) => bytes[..4].copy_from_slice(&v.to_ne_bytes()),
    }
    u64::from_ne_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DevicePtr;

    fn first_bytes(slot: u64, n: usize) -> Vec<u8> {
        slot.to_ne_bytes()[..n].to_vec()
    }

    #[test]
    fn each_argument_sits_at_the_start_of_an_aligned_slot() {
        let args = [
            KernelArg::Ptr(DevicePtr(0x7f00_0000_1000)),
            KernelArg::F32(1.5),
            KernelArg::U64(u64::MAX - 1),
            KernelArg::I32(-7),
            KernelArg::F64(-2.25),
        ];
        let mut packed = ArgSlots::new(&args);
        let s = packed.slots().to_vec();
        assert_eq!(s[0], 0x7f00_0000_1000);
        assert_eq!(first_bytes(s[1], 4), 1.5f32.to_ne_bytes());
        assert_eq!(s[2], u64::MAX - 1);
        assert_eq!(first_bytes(s[3], 4), (-7i32).to_ne_bytes());
        assert_eq!(s[4], (-2.25f64).to_bits());

        let ptrs = packed.pointers();
        assert_eq!(ptrs.len(), args.len());
        for (i, p) in ptrs.iter().enumerate() {
            assert_eq!(p.align_offset(8), 0, "slot {i} is 8-byte aligned");
        }
        // Consecutive slots are consecutive u64s of one allocation.
        assert_eq!(ptrs[1] as usize - ptrs[0] as usize, 8);
    }

    #[test]
    fn no_arguments_is_an_empty_list() {
        assert!(ArgSlots::new(&[]).pointers().is_empty());
    }
}
