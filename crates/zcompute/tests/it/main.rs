//! zcompute integration tests: one binary, one module per area.

mod attention;
mod attention_bf16;
mod attention_into;
mod attention_into_graph;
mod binary;
mod common;
mod cpu_threads;
mod cuda;
mod errors;
mod key_padding_attention;
mod layout_props;
mod matmul;
mod norm;
mod pool_head_into;
mod precision;
mod reduce;
mod train;
mod unary;
mod views;
