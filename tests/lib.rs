//! Cross-crate scenarios of ARCHITECTURE.md's three failure classes, run on the simulated device in
//! CI (tiny XAsset) and on CUDA device 0 with `--features gpu` (default XAsset size). The tests
//! live in `it/`: `c_saved` (resets and saved tensors), `a_overflow` (an arena smaller than a
//! step), `b_capture` (the captured training step).
