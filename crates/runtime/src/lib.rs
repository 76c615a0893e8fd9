//! Generation runtime: sampler chain, generation loop, stop conditions, sessions.
#![forbid(unsafe_code)]
