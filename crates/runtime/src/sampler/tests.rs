//! Property-style tests of the sampler stages and chain.
