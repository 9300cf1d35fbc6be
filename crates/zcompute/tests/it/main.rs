//! zcompute integration tests: one binary, one module per area.

mod attention;
mod binary;
mod common;
mod cuda;
mod errors;
mod layout_props;
mod matmul;
mod norm;
mod reduce;
mod train;
mod unary;
mod views;
