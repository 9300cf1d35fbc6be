//! Building blocks: Linear and LayerNorm (`layers.rs`), QK-normalised multi-head attention, the
//! tanh feed-forward block, the encoder block composed of them, and the mean-pool + linear +
//! BCE head. Each holds its parameters as leaves and runs its forward on a tape; parameters
//! are initialised as PyTorch does (docs/xasset.md). `XAsset` is a Linear embedding, L encoder
//! blocks and the head; a model of the user's own composes the same modules.

mod attention;
mod block;
mod feedforward;
mod head;
mod layers;

pub use attention::QkNormAttention;
pub use block::{BLOCK_PARAMETER_NAMES, EncoderBlock, block_shapes};
pub use feedforward::FeedForward;
pub use head::PoolHead;
pub use layers::{LN_EPS, LayerNorm, Linear};
