//! Fuzz target: the GGUF parser must never panic, and any file it accepts must survive a
//! write -> read round trip through the writer. See `damascus_gguf::fuzz_harness`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    damascus_gguf::fuzz_harness(data);
});
