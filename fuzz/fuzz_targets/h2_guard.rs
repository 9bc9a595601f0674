#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tern::fuzzing::h2_guard(data));
