//! zmem: device memory management (arena, pools, capture reservations). See ARCHITECTURE.md.
#![forbid(unsafe_code)]
