//! zmem's integration tests, one binary. `bodies` holds the scenario bodies, generic over the
//! driver; the mock modules run them on the simulated device and `gpu` on the real one.

mod bodies;
mod capture;
mod classes;
mod errors;
mod fast;
mod peaks;
mod pool;
mod props;
mod reuse;
mod sanitize;
mod scenarios;
mod teardown;
mod timeline;
mod util;

#[cfg(feature = "gpu")]
mod gpu;
