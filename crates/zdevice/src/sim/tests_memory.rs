//! tests
// x
