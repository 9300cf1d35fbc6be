//! Device storage: a zmem `Block` and the number of `f32`s it holds. Clones share the block;
//! its memory lives as its allocation class says (a step's scratch, held saved/persistent
//! memory, or a graph's reservation), and every use resolves it through zmem's generation
//! check, so a tensor whose scratch was reclaimed fails by name instead of reading garbage.

use std::sync::Arc;

use crate::storage::Storage;
use crate::tensor::Tensor;
use zmem::{AllocClass, Block};

/// Device memory behind a tensor.
#[derive(Clone, Debug)]
pub struct CudaStorage {
    /// Shared by the tensor's clones and views only (not by the arena or a reservation), so
    /// `capture` can tell which of a warm-up's tensors are still held when it ends.
    block: Arc<Block>,
    len: usize,
}

/// A tensor in device memory.
pub type CudaTensor = Tensor<CudaStorage>;

impl CudaStorage {
    pub(crate) fn new(block: Block, len: usize) -> CudaStorage {
        CudaStorage {
            block: Arc::new(block),
            len,
        }
    }

    /// The handle shared by this storage's tensors.
    pub(crate) fn shared(&self) -> &Arc<Block> {
        &self.block
    }

    /// The zmem block (for diagnostics, or to `retain` it in a capture reservation).
    #[must_use]
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// The allocation class the memory was issued as (`Graph` inside a capture).
    #[must_use]
    pub fn class(&self) -> AllocClass {
        self.block.class()
    }
}

impl Storage for CudaStorage {
    type Elem = f32;

    fn len(&self) -> usize {
        self.len
    }

    fn same_buffer(&self, other: &Self) -> bool {
        self.block.same(&other.block)
    }
}
